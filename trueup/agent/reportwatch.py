"""What makes the agent report to the control plane between heartbeats.

Who calls this: `trueup.agent.wiring`, when a control plane manages the
device. A report goes out whenever something an operator sees changes:

* the reconcile loop says so itself (`ReconcileLoop.on_change`: drift seen or
  ended, with its writer and healer; a breaker; an acknowledgement set,
  withdrawn or expired; an operator's write beginning or ending): `poke()`;
* the rest is looked at every `interval` seconds (cheap reads, no observation
  of the subsystems): fences, the open transaction, the restore record and
  management readiness (`operator_facts`).

Either way `StatusWatch` only asks for a report (`request_report`); the sync
loop coalesces what it is asked (`trueup.agent.cpreport.ReportPacer`: at most
one report a second, the first at once) and the report carries the state as
it is when it is built.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TypedDict

from trueup.agent.process import Agent
from trueup.journal.restore import read_record
from trueup.model.digests import json_digest
from trueup.system.fence import read_fences

__all__ = ["OperatorFacts", "RestoreFacts", "StatusWatch", "operator_facts"]

log = logging.getLogger("trueup.agent")

WATCH_SECONDS = 1.0


class RestoreFacts(TypedDict):
    """A restore as far as a report tells it (from its record)."""

    id: object
    state: object
    pending: object
    problem: object
    waiting: object


class OperatorFacts(TypedDict):
    """What the status watch compares: fences, an open transaction, a restore, management."""

    fences: list[tuple[str, str]]  # (subsystem, owner)
    open_transaction: str | None
    restore: RestoreFacts | None
    management_ready: bool
    management_reason: str | None


def operator_facts(agent: Agent) -> OperatorFacts:
    """The operator-visible facts the reconcile loop does not announce itself."""
    root = agent.state.root
    open_txn = agent.state.journal.open_transaction()
    record = read_record(root)
    management = agent.management_health()
    restore: RestoreFacts | None = None
    if isinstance(record, dict):
        restore = {
            "id": record.get("id"),
            "state": record.get("state"),
            "pending": record.get("pending"),
            "problem": record.get("problem"),
            "waiting": record.get("waiting"),
        }
    return {
        "fences": sorted((f.subsystem, f.owner) for f in read_fences(root)),
        "open_transaction": open_txn.txn if open_txn is not None else None,
        "restore": restore,
        "management_ready": management["ready"],
        "management_reason": management["reason"],
    }


class StatusWatch:
    """A thread that asks for a report when `facts()` changes, or when poked."""

    def __init__(
        self,
        facts: Callable[[], OperatorFacts],
        request_report: Callable[[], None],
        *,
        interval: float = WATCH_SECONDS,
    ) -> None:
        self.facts = facts
        self.request_report = request_report
        self.interval = interval
        self._last: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poke(self) -> None:
        """Something the loop shows changed: report it (coalesced by the sync loop)."""
        self.request_report()

    def check(self) -> bool:
        """Look at the facts once; True (and a report asked for) when they changed."""
        try:
            digest = json_digest(self.facts())
        except Exception as exc:  # a fact that cannot be read now is read again next time
            log.debug("status watch: %s", exc)
            return False
        changed = self._last is not None and digest != self._last
        self._last = digest
        if changed:
            self.request_report()
        return changed

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="cp-status-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.check()
