"""Confirm-or-rollback while the agent runs: the pending record, its deadline, `confirm`.

Who calls this: the reconcile loop (`trueup.reconcile.loop`), for every
operator write (apply, rollback) and on every pass. What a pending
confirmation *means* and the rollback itself are `trueup.reconcile.confirm`'s,
shared with the startup recovery phase; the record's file is
`trueup.journal.confirm`'s.

A write with `--confirm-within SECONDS`:

1. the record (state `applying`, the version to return to, the deadline) is
   written *before* the apply, so a crash mid-way still rolls back;
2. the apply runs through the engine; if it changed the device the record
   becomes `pending` with the new version (`confirm_pending` audit), else the
   previous record is put back;
3. `confirm()` before the deadline keeps the version; a plain apply on top of
   it confirms it too;
4. at the deadline `check()` re-applies the last confirmed revision.

All of it runs under the loop's lock; `on_converged` tells the loop that what
is applied changed (breakers, flaps and drift records start over).

Why this module is over 400 lines: the pending record's whole life — armed
before the write, settled after it, adopted after a crash, confirmed, rolled
back at its deadline — is one state machine under one lock, and each step
reads what the others wrote.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import replace

from trueup.journal.confirm import (
    ConfirmOutcome,
    ConfirmState,
    PendingConfirm,
    clear_pending,
    read_outcome,
    read_pending,
    write_pending,
)
from trueup.journal.state import StateDir
from trueup.reconcile.answers import ConfirmAnswer, WriteAnswer, write_answer
from trueup.reconcile.changes import ApplyResult, Change, NeedsConfirmation, Outcome, Refused
from trueup.reconcile.confirm import (
    PendingSummary,
    decide,
    outcome,
    record_outcome,
    roll_back_unconfirmed,
)
from trueup.reconcile.engine import Engine
from trueup.reconcile.guard import subsystem_risks
from trueup.system.events import iso_time

__all__ = ["OPERATOR_WAIT", "SELF_WAIT", "ConfirmWait", "refusal"]

log = logging.getLogger("trueup.reconcile")

WRITE_LOCK_WAIT = 5.0  # an operator's write waits this long for a heal to finish
OPERATOR_WAIT = "`trueup confirm`"
SELF_WAIT = "management ready and the control plane reached after the apply"


def refusal(state: StateDir, message: str) -> WriteAnswer:
    """The API's answer to a write refused before anything changed."""
    return {
        "ok": False,
        "version": state.applied().version,
        "outcome": "refused",
        "txn": None,
        "steps": [],
        "failed": {"management": message},
        "rollback_errors": [],
        "message": message,
    }


class ConfirmWait:
    def __init__(
        self,
        engine: Engine,
        *,
        clock: Callable[[], float],
        lock: threading.RLock,
        on_converged: Callable[[], None],
    ) -> None:
        self.engine = engine
        self.state = engine.state
        self.clock = clock
        self._lock = lock  # the loop's
        self._on_converged = on_converged
        self.pending: PendingConfirm | None = read_pending(self.state)
        self.last: ConfirmOutcome | None = read_outcome(self.state)
        self._adopt_committed()

    def _adopt_committed(self) -> None:
        """A guarded apply that committed right before a crash is waiting for `confirm`.

        The record is written as `applying` before the apply and updated to
        `pending` after it; a crash in between leaves `applying` while the
        version it guarded is applied. It can still be confirmed, and its
        deadline still holds.
        """
        pending = self.pending
        if pending is None or pending.get("state") != "applying":
            return
        applied = self.state.applied().version
        if applied == int(pending.get("confirmed_version", 0)):
            return  # the apply never took effect: `check` drops the record
        pending["state"] = "pending"
        pending["version"] = applied
        pending["adopted_after_restart"] = True
        try:
            write_pending(self.state, pending)
        except OSError:
            log.warning("could not record the adopted pending confirmation")

    # -- what status and the scheduler read ---------------------------------
    def deadline(self) -> float | None:
        """When the pending version rolls back, while one waits for `confirm`."""
        pending = self.pending
        if pending is not None and pending.get("state") == "pending":
            return float(pending["deadline"])
        return None

    def summary(self) -> PendingSummary | None:
        """Status' `pending_confirmation`: {version, deadline, rollback_to}, or None."""
        pending = self.pending
        if pending is None or pending.get("state") != "pending":
            return None
        return {
            "version": pending["version"],
            "deadline": pending["deadline_at"],
            "rollback_to": pending["confirmed_version"],
        }

    def record(self) -> ConfirmOutcome | None:
        """Status' `confirmation`: the pending one with what it waits for, else how the
        last guarded apply ended; None when there never was one."""
        pending = self.pending
        if pending is not None and pending.get("state") == "pending":
            return outcome(
                pending,
                ConfirmState.PENDING,
                str(pending.get("waiting_for") or _waits(pending)),
                stable=True,
            )
        return self.last.copy() if self.last is not None else None

    def self_pending(self) -> PendingConfirm | None:
        """The pending confirmation the agent settles itself (a control-plane revision)."""
        pending = self.pending
        if (
            pending is not None
            and pending.get("state") == "pending"
            and pending.get("self_confirm")
        ):
            return pending
        return None

    def note_waiting(self, version: int, waiting_for: str) -> bool:
        """What the confirmation of `version` still waits for; True when that changed."""
        pending = self.pending
        if pending is None or pending.get("version") != version:
            return False
        if pending.get("waiting_for") == waiting_for:
            return False
        pending["waiting_for"] = waiting_for
        return True

    def _outcome(self, record: ConfirmOutcome) -> None:
        self.last = record
        record_outcome(self.state, record)

    # -- the deadline -------------------------------------------------------
    def check(self, now: float) -> bool:
        """Settle the pending record against what is applied; True: look again soon.

        A record whose apply never took effect, or that a later version
        replaced, is dropped; one past its deadline is rolled back.
        """
        pending = self.pending
        if pending is None or self.engine.check.blocking("writes"):
            # Settling it is a write; a damaged state file refuses those (and the
            # damaged pending record itself stays as evidence).
            return False
        applied_version = self.state.applied().version
        decision = decide(pending, applied_version, now)
        if decision in ("stale", "superseded"):
            clear_pending(self.state, decision, applied_version=applied_version)
            self.pending = None
            if decision == "stale":
                self._outcome(
                    outcome(
                        pending,
                        ConfirmState.ROLLED_BACK,
                        f"the guarded apply did not take effect (version {applied_version} "
                        "is applied)",
                    )
                )
            else:
                self._outcome(
                    outcome(
                        pending, ConfirmState.CONFIRMED, f"superseded by version {applied_version}"
                    )
                )
            return False
        if decision != "expired":
            return False
        try:
            result = roll_back_unconfirmed(self.engine, pending, actor="confirm-timeout")
        except Refused:
            return True  # another writer holds the device: soon
        except Exception:
            log.exception("rolling back an unconfirmed version failed")
            return True
        if result.outcome not in (Outcome.COMMITTED, Outcome.PARTIAL):
            log.error("rollback of unconfirmed version failed: %s", result.failed)
            return True
        if result.failed:
            log.error("rolled back an unconfirmed version, except: %s", result.failed)
        self.pending = None
        self.last = read_outcome(self.state)
        self._on_converged()
        log.warning(
            "confirmation of version %s missed; rolled back to revision %s (version %s)",
            pending.get("version"),
            pending.get("confirmed_version"),
            result.version,
        )
        return False

    def confirm(
        self, actor: str, *, version: int | None = None, reason: str | None = None
    ) -> ConfirmAnswer:
        """`trueup confirm`: keep the pending version, if its deadline has not passed.

        `version`: only that version (the agent's own confirmation, decided on it);
        `reason`: why it is kept, for status and the report.
        """
        self.engine.refuse_if_damaged()
        with self._lock:
            pending = self.pending
            if pending is None or pending.get("state") != "pending":
                return {
                    "ok": False,
                    "message": "nothing to confirm: no apply with --confirm-within is pending",
                }
            if version is not None and pending.get("version") != version:
                return {
                    "ok": False,
                    "message": f"version {version} is not the one awaiting confirmation "
                    f"({pending.get('version')})",
                }
            now = self.clock()
            if now >= float(pending["deadline"]):
                self.check(now)
                return {
                    "ok": False,
                    "message": f"too late: the deadline {pending['deadline_at']} passed; "
                    f"version {pending['version']} was rolled back to revision "
                    f"{pending['confirmed_version']}",
                }
            clear_pending(self.state, "confirmed", by=actor)
            self.state.audit.append(
                "confirmed", actor, version=pending["version"], deadline=pending["deadline_at"]
            )
            self.pending = None
            self._outcome(
                outcome(pending, ConfirmState.CONFIRMED, reason or f"confirmed by {actor}")
            )
            return {
                "ok": True,
                "version": pending["version"],
                "message": f"version {pending['version']} confirmed; it stays applied",
            }

    # -- writes -------------------------------------------------------------
    def write(self, change: Change, confirm_within: float | None) -> WriteAnswer:
        """Run an operator's change (apply or rollback), armed with a deadline when asked."""
        self.engine.refuse_if_damaged()  # before the pending record is written
        state = self.state
        actor = change.actor
        pending_before = self.pending
        applied_version = state.applied().version
        confirmed_version = (
            int(pending_before["confirmed_version"]) if pending_before else applied_version
        )
        refused = self._refused(confirm_within, confirmed_version)
        if refused is not None:
            state.audit.append("apply_refused", actor, message=refused)
            return refusal(state, refused)
        change = replace(
            change, management_confirmed=confirm_within is not None, lock_wait=WRITE_LOCK_WAIT
        )
        pending = None
        if confirm_within is not None:
            pending = self._arm(confirmed_version, confirm_within, change)
        try:
            result = self.engine.transact(change)
        except NeedsConfirmation as exc:
            return refusal(state, str(exc))
        except Exception:
            if pending is not None:
                self._restore(pending_before)
            raise
        with self._lock:
            return self._settle(result, pending, pending_before, confirmed_version, actor)

    @staticmethod
    def _refused(confirm_within: float | None, confirmed_version: int) -> str | None:
        if confirm_within is None:
            return None
        if confirm_within <= 0:
            return "--confirm-within must be a positive number of seconds"
        if confirmed_version == 0:
            return (
                "--confirm-within needs a confirmed version to return to; apply a first "
                "version without it"
            )
        return None

    def _arm(self, confirmed_version: int, confirm_within: float, change: Change) -> PendingConfirm:
        now = self.clock()
        pending: PendingConfirm = {
            "state": "applying",
            "version": None,
            "confirmed_version": confirmed_version,
            "deadline": now + confirm_within,
            "deadline_at": iso_time(now + confirm_within),
            "actor": change.actor,
            "created_at": iso_time(now),
            "origin": change.origin,
            # The version the change asks for (a control-plane revision's), if it names one.
            "requested_version": change.document.metadata.version,
            "window": confirm_within,
            # A control-plane revision: confirmed by the agent's own health, not an operator.
            "self_confirm": change.origin == "control-plane",
        }
        if pending["self_confirm"]:
            # What the agent's own health cannot see: a firewall that drops new
            # connections to its API still leaves the listener serving and the
            # control plane reachable. Such a revision waits for an operator.
            risks = subsystem_risks(
                self.engine.subsystems,
                self.engine.applied_document(),
                change.document,
                self.engine.api_port,
            )
            if risks:
                pending["unverifiable"] = risks
        write_pending(self.state, pending)  # before the apply: a crash mid-way still rolls back
        self.pending = pending
        return pending

    def _settle(
        self,
        result: ApplyResult,
        pending: PendingConfirm | None,
        pending_before: PendingConfirm | None,
        confirmed_version: int,
        actor: str,
    ) -> WriteAnswer:
        state = self.state
        out = write_answer(result)
        changed = result.outcome in (Outcome.COMMITTED, Outcome.PARTIAL)
        if pending is not None:
            if changed and result.version != confirmed_version:
                pending["state"] = "pending"
                pending["version"] = result.version
                pending["txn"] = result.txn
                pending["applied_at"] = self.clock()
                # Every subsystem applied and verified: a partial apply is never
                # confirmed by the agent itself.
                pending["verified"] = result.outcome == Outcome.COMMITTED and not result.failed
                write_pending(state, pending)
                self.pending = pending
                state.audit.append(
                    "confirm_pending",
                    actor,
                    version=result.version,
                    deadline=pending["deadline_at"],
                    rollback_to=confirmed_version,
                )
                self._outcome(outcome(pending, ConfirmState.PENDING, _waits(pending)))
            else:
                self._restore(pending_before)
                if pending_before is None and result.outcome in (
                    Outcome.ROLLED_BACK,
                    Outcome.FAILED,
                ):
                    failed = "; ".join(f"{k}: {v}" for k, v in sorted(result.failed.items()))
                    asked = pending.copy()
                    asked["version"] = pending.get("requested_version")
                    self._outcome(
                        outcome(
                            asked,
                            ConfirmState.ROLLED_BACK,
                            "the apply failed and its transaction rolled back"
                            + (f" ({failed})" if failed else ""),
                        )
                    )
        elif pending_before is not None and changed:
            # A plain apply on top of an unconfirmed one confirms it (commit semantics).
            clear_pending(state, "confirmed", by="apply", version=result.version)
            state.audit.append(
                "confirmed", actor, version=result.version, via="apply without a deadline"
            )
            self.pending = None
            self._outcome(
                outcome(
                    pending_before,
                    ConfirmState.CONFIRMED,
                    f"confirmed by a later apply without a window (version {result.version})",
                )
            )
        if self.pending is not None and self.pending.get("state") == "pending":
            out["pending_confirmation"] = {
                "version": self.pending["version"],
                "deadline": self.pending["deadline_at"],
            }
        if changed:
            self._on_converged()
        return out

    def _restore(self, previous: PendingConfirm | None) -> None:
        if previous is None:
            clear_pending(self.state, "apply_not_changed")
        else:
            write_pending(self.state, previous)
        self.pending = previous


def _waits(pending: PendingConfirm) -> str:
    return SELF_WAIT if pending.get("self_confirm") else OPERATOR_WAIT
