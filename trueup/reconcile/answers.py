"""What the agent's requests answer: a write (apply, rollback, reconcile), and a confirm.

Who calls this: the request route (`trueup.reconcile.requests`), the
reconcile loop and its confirmation window (`trueup.reconcile.confirmwait`)
build these; the agent's API sends them as they are (`/v1/apply`,
`/v1/rollback`, `/v1/reconcile`, `/v1/confirm`) and its control-plane sync
reads `ok` and `message`. The acknowledgement's answer is
`trueup.reconcile.acks.AckAnswer`.
"""

from __future__ import annotations

from typing import Required, TypedDict, cast

from trueup.reconcile.changes import ApplyResult

__all__ = ["ConfirmAnswer", "PendingShown", "WriteAnswer", "write_answer"]


class PendingShown(TypedDict):
    """A write's answer while its version waits for `trueup confirm`."""

    version: int | None
    deadline: str


class WriteAnswer(TypedDict, total=False):
    """An apply's, a rollback's or a reconcile's answer: `ApplyResult.to_json()`, a write
    refused before anything changed (`message`), or the pass a reconcile forced."""

    ok: Required[bool]
    version: int
    outcome: Required[str]  # an `Outcome`, "refused"; a reconcile: reconciled, in sync, …
    txn: str | None
    steps: list[str]
    failed: dict[str, str]  # subsystem → why
    rollback_errors: list[str]
    waiting: dict[str, str]  # subsystem → the dependency it awaits
    origin: str
    digest: str
    attempted_version: int
    carried: dict[str, str]
    cleared: list[str]
    message: str  # a refusal: why
    pending_confirmation: PendingShown
    breakers_closed: list[str]  # a reconcile: the breakers it closed


class ConfirmAnswer(TypedDict, total=False):
    """What `trueup confirm` answers: kept (`version`), or why not."""

    ok: Required[bool]
    message: Required[str]
    version: int | None


def write_answer(result: ApplyResult) -> WriteAnswer:
    """A transaction's result as a write answers it (`ApplyResult.to_json()` is its shape)."""
    return cast(WriteAnswer, result.to_json())
