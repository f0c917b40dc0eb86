"""Closing a transaction a storage fault left open, as soon as the directory takes writes.

Who calls this: the reconcile loop, at the start of every pass
(`ReconcileLoop.run_pass`). A full or read-only state directory can refuse
the very record that would close a transaction: it stays open, and
`STATE_APPLY_NOT_COMPLETED` is reported from it. Each pass — and a timer
with back-off while it stays open — tries the recovery again (converge to
the committed revision, close it `rolled_back`), so it is closed without
waiting for the next write.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from trueup.journal.atomic import StateFileError
from trueup.reconcile.changes import DamagedState, Refused, StorageError
from trueup.reconcile.driftwatch import ACTOR
from trueup.reconcile.engine import Engine

__all__ = ["CLOSE_RETRY_CAP", "CLOSE_RETRY_FIRST", "Closing", "InterruptedCloser"]

log = logging.getLogger("trueup.reconcile")

# Retried after 0.5 s, doubling up to 2 s, until the directory takes writes again.
CLOSE_RETRY_FIRST = 0.5
CLOSE_RETRY_CAP = 2.0


@dataclass(frozen=True)
class Closing:
    """How one attempt went: closed (what is applied changed), or when to look again."""

    closed: bool = False
    retry_soon: bool = False  # a writer took the lock meanwhile: it recovers, or we do
    retry_at: float | None = None  # still open: the next attempt, backing off


class InterruptedCloser:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._delay = CLOSE_RETRY_FIRST

    def close(self, now: float) -> Closing:
        try:
            if self.engine.state.journal.open_transaction() is None:
                self._delay = CLOSE_RETRY_FIRST
                return Closing()
            recovered = self.engine.recover(actor=ACTOR, wait=0.0, quiet=True)
        except DamagedState:
            return Closing()  # reported as damage; recovery waits for the repair
        except Refused:
            return Closing(retry_soon=True)
        except (OSError, StorageError, StateFileError) as exc:
            log.warning("an interrupted transaction stays open: %s", exc)
            return self._later(now)
        except Exception:  # the pass goes on: management is restored whatever recovery does
            log.exception("an interrupted transaction stays open: its recovery failed")
            return self._later(now)
        self._delay = CLOSE_RETRY_FIRST
        if recovered is None:
            return Closing()
        log.warning("closed transaction %s left open by a storage fault", recovered.txn)
        return Closing(closed=True)

    def _later(self, now: float) -> Closing:
        at = now + self._delay
        self._delay = min(CLOSE_RETRY_CAP, self._delay * 2)
        return Closing(retry_at=at)
