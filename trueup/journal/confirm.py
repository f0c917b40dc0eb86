"""The pending confirmation of an apply made with `--confirm-within` (`pending-confirm.json`).

Who calls this: the reconcile loop (when it applies, confirms or rolls back)
and the startup recovery phase (through `trueup.reconcile.confirm`). The
record is written atomically (fsync'd) *before* the apply it guards, and each
change is also announced in the journal, so a pending confirmation survives
SIGKILL and reboot:

```
{"state": "applying" | "pending", "version": N | null, "confirmed_version": M,
 "deadline": <epoch seconds>, "deadline_at": ISO, "actor": ..., "created_at": ISO}
```
`confirmed_version` is the last confirmed state that a missed deadline
returns to.

How the last guarded apply ended is kept beside it (`confirmation.json`,
written atomically, read by status and the control-plane report):

```
{"version": N, "state": "pending" | "confirmed" | "rolled-back",
 "deadline": <epoch seconds>, "reason": "...", "at": ISO, ...}
```
"""

from __future__ import annotations

import contextlib
from enum import StrEnum
from typing import Any, Literal, NotRequired, TypedDict, cast

from trueup.journal.atomic import StateFileError, fsync_dir
from trueup.journal.state import StateDir

__all__ = [
    "OUTCOME_FILE",
    "PENDING_FILE",
    "ConfirmOutcome",
    "ConfirmState",
    "PendingConfirm",
    "clear_pending",
    "pending_from_journal",
    "read_outcome",
    "read_pending",
    "write_outcome",
    "write_pending",
]

PENDING_FILE = "pending-confirm.json"
OUTCOME_FILE = "confirmation.json"


class PendingConfirm(TypedDict):
    """`pending-confirm.json`: a guarded apply, armed before the write, pending after it."""

    state: Literal["applying", "pending"]
    version: int | None  # None until the apply changed the device
    confirmed_version: int  # the version a missed deadline returns to
    deadline: float  # wall-clock seconds
    deadline_at: str
    actor: str
    created_at: str
    origin: str
    requested_version: int | None  # the version the change asks for, if it names one
    window: float
    # A control-plane revision: confirmed by the agent's own health, not an operator.
    self_confirm: bool
    unverifiable: NotRequired[list[str]]  # what the agent's own health cannot see
    txn: NotRequired[str | None]
    applied_at: NotRequired[float]
    verified: NotRequired[bool]  # every subsystem applied and verified
    adopted_after_restart: NotRequired[bool]
    waiting_for: NotRequired[str]  # what the confirmation still waits for


class ConfirmState(StrEnum):
    """How a guarded apply stands."""

    PENDING = "pending"
    CONFIRMED = "confirmed"
    ROLLED_BACK = "rolled-back"


class ConfirmOutcome(TypedDict):
    """`confirmation.json`, status' `confirmation`: how the last guarded apply stands."""

    version: int | None
    state: ConfirmState
    deadline: float | None
    deadline_at: str | None
    reason: str
    rollback_to: int | None
    origin: str | None
    at: str | None
    rolled_back_to_version: NotRequired[int]


def _journal_id(record: PendingConfirm | None) -> str:
    return f"confirm-{record.get('created_at', '') if record else ''}"


def read_pending(state: StateDir) -> PendingConfirm | None:
    """The pending confirmation, or None.

    When `pending-confirm.json` is damaged (torn, edited, not UTF-8), the
    record as the journal last announced it — it is written there right after
    the file — so the deadline and the version to return to are not lost. The
    damage itself is reported by `trueup.journal.damage`, which refuses writes
    until the file is repaired.
    """
    try:
        record = state.read(PENDING_FILE)
    except StateFileError:
        return pending_from_journal(state)
    return cast("PendingConfirm", dict(record)) if isinstance(record, dict) else None


def pending_from_journal(state: StateDir) -> PendingConfirm | None:
    """The pending confirmation the journal announced last, unless it was closed since."""
    latest: PendingConfirm | None = None
    for record in state.journal.records():
        if record["type"] == "confirm_pending":
            latest = record.get("pending")
        elif record["type"] == "confirm_closed":
            latest = None
    return latest.copy() if isinstance(latest, dict) else None


def write_pending(state: StateDir, record: PendingConfirm) -> None:
    """Persist the pending confirmation, then announce it in the journal."""
    state.write(PENDING_FILE, record)
    # Journal lines without a `begin` never form a transaction; they are the
    # write-ahead trace of the confirmation's life next to the applies it guards.
    state.journal.record(_journal_id(record), "confirm_pending", pending=record)


def clear_pending(state: StateDir, outcome: str, **details: Any) -> PendingConfirm | None:
    """Remove the pending confirmation (`outcome`: confirmed, rolled_back, superseded, …)."""
    record = read_pending(state)
    path = state.root / PENDING_FILE
    state.journal.record(
        _journal_id(record), "confirm_closed", outcome=outcome, pending=record, **details
    )
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
        fsync_dir(state.root)
    return record


def write_outcome(state: StateDir, record: ConfirmOutcome) -> None:
    """Persist how the last guarded apply stands (pending, confirmed, rolled-back)."""
    state.write(OUTCOME_FILE, record)


def read_outcome(state: StateDir) -> ConfirmOutcome | None:
    """The last guarded apply's outcome, or None (never written, or unreadable: it only
    informs status and reports; the pending record decides what happens)."""
    try:
        record = state.read(OUTCOME_FILE)
    except (StateFileError, OSError, ValueError):
        return None
    return cast("ConfirmOutcome", dict(record)) if isinstance(record, dict) else None
