"""Confirm-or-rollback: what a pending confirmation means, and the rollback when it is missed.

Who calls this: the reconcile loop (apply with `--confirm-within`, `confirm`,
the deadline timer) and the startup orchestrator's recovery phase, which
rolls back a confirmation that expired while the agent was down — right after
the management tier is up, from the last confirmed revision.

The rollback re-applies the last confirmed revision's content as a new
version (like `trueup rollback --to`), as one engine transaction of kind
`confirm-timeout`. How it ended (`outcome`) is kept in `confirmation.json`
for status and the control-plane report: `rolled-back` with the reason —
what the confirmation was still waiting for when the window passed.
"""

from __future__ import annotations

import logging
from typing import Literal, TypedDict

from trueup.journal.audit import now_iso
from trueup.journal.confirm import (
    ConfirmOutcome,
    ConfirmState,
    PendingConfirm,
    clear_pending,
    read_pending,
    write_outcome,
)
from trueup.journal.state import StateDir
from trueup.model.document import parse_document
from trueup.reconcile.changes import ApplyResult, Change, Outcome
from trueup.reconcile.engine import Engine
from trueup.reconcile.guard import management_guard, unsafe_management_changes

__all__ = [
    "ConfirmState",
    "Decision",
    "PendingSummary",
    "decide",
    "management_guard",
    "outcome",
    "record_outcome",
    "roll_back_unconfirmed",
    "settle_at_startup",
    "unsafe_management_changes",
]

log = logging.getLogger("trueup.reconcile")

Decision = Literal["none", "stale", "superseded", "waiting", "expired"]


class PendingSummary(TypedDict):
    """Status' `pending_confirmation`."""

    version: int | None
    deadline: str | None
    rollback_to: int | None


def decide(pending: PendingConfirm | None, applied_version: int, now: float) -> Decision:
    """What a pending confirmation means against the applied version, at `now`.

    * `stale`: the guarded apply never took effect (it failed, or a crash
      rolled it back), so the device is at the confirmed version already;
    * `superseded`: a later version replaced the guarded one;
    * `expired` / `waiting`: the guarded version is applied, deadline passed or not.
    """
    if pending is None:
        return "none"
    confirmed = int(pending.get("confirmed_version", 0))
    version = pending.get("version")
    if applied_version == confirmed:
        return "stale"
    if version is not None and applied_version != int(version):
        return "superseded"
    return "expired" if now >= float(pending["deadline"]) else "waiting"


def outcome(
    pending: PendingConfirm,
    state: ConfirmState,
    reason: str,
    *,
    stable: bool = False,
    rolled_back_to_version: int | None = None,
) -> ConfirmOutcome:
    """The `confirmation` record of `pending` in `state`, stamped now, or when `stable` at
    its creation (what status shows then changes only with the record)."""
    record: ConfirmOutcome = {
        "version": pending.get("version"),
        "state": state,
        "deadline": pending.get("deadline"),
        "deadline_at": pending.get("deadline_at"),
        "reason": reason,
        "rollback_to": pending.get("confirmed_version"),
        "origin": pending.get("origin"),
        "at": pending.get("created_at") if stable else now_iso(),
    }
    if rolled_back_to_version is not None:
        record["rolled_back_to_version"] = rolled_back_to_version
    return record


def record_outcome(state: StateDir, record: ConfirmOutcome) -> None:
    """Keep `record` as the last guarded apply's outcome; a state directory that refuses
    the write loses only what status and reports show, never the decision."""
    try:
        write_outcome(state, record)
    except OSError as exc:
        log.warning("confirmation outcome not saved: %s", exc)


def _missed_reason(pending: PendingConfirm, actor: str) -> str:
    window = f"the confirmation window passed ({pending.get('deadline_at')})"
    waiting = pending.get("waiting_for")
    if isinstance(waiting, str) and waiting:
        return f"{window} while still waiting for: {waiting}"
    if actor == "startup":
        return f"{window} while the agent was down"
    return f"{window} without `trueup confirm`"


def roll_back_unconfirmed(engine: Engine, pending: PendingConfirm, *, actor: str) -> ApplyResult:
    """Re-apply the last confirmed revision as a new version, as one engine transaction."""
    state = engine.state
    target = int(pending["confirmed_version"])
    record = state.revision(target)
    if record is None:
        raise RuntimeError(f"confirmed revision {target} is missing from {state.root}/revisions")
    document = parse_document(record["document"], f"revision {target}")
    result = engine.transact(
        Change.confirm_timeout(
            document, target=target, unconfirmed=pending.get("version"), actor=actor
        )
    )
    if result.outcome in (Outcome.COMMITTED, Outcome.PARTIAL):
        clear_pending(
            state, "rolled_back", to_version=result.version, from_revision=target, at=now_iso()
        )
        state.audit.append(
            "confirm_timeout",
            actor,
            unconfirmed_version=pending.get("version"),
            deadline=pending.get("deadline_at"),
            rolled_back_to_revision=target,
            new_version=result.version,
            txn=result.txn,
        )
        record_outcome(
            state,
            outcome(
                pending,
                ConfirmState.ROLLED_BACK,
                _missed_reason(pending, actor),
                rolled_back_to_version=result.version,
            ),
        )
    return result


def settle_at_startup(engine: Engine, now: float, *, actor: str = "startup") -> str | None:
    """Roll back a confirmation that expired while the agent was down. Caller holds the lock.

    Returns a sentence for the recovery phase's detail, or None when nothing was pending.
    """
    state = engine.state
    pending = read_pending(state)
    applied_version = state.applied().version
    decision = decide(pending, applied_version, now)
    if pending is None or decision == "none":
        return None
    if decision in ("stale", "superseded"):
        clear_pending(state, decision, applied_version=applied_version)
        return f"pending confirmation {decision} (applied version {applied_version})"
    if decision == "waiting":
        return f"version {applied_version} awaits confirmation until {pending.get('deadline_at')}"
    result = roll_back_unconfirmed(engine, pending, actor=actor)
    if result.outcome not in (Outcome.COMMITTED, Outcome.PARTIAL):
        return f"confirmation expired; rollback failed: {result.failed or result.rollback_errors}"
    return (
        f"confirmation of version {applied_version} expired at {pending.get('deadline_at')}: "
        f"rolled back to revision {pending['confirmed_version']} as version {result.version}"
    )
