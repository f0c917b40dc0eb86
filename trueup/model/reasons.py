"""The six reason codes, the runbook's corrective actions, and findings.

A `Finding` is what the classifier derives from facts: the code, the
subsystem, the differing paths, when it was seen and what to do next.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict

__all__ = ["CORRECTIVE_ACTIONS", "EXIT_CODES", "Finding", "ReasonCode"]


class ReasonCode(StrEnum):
    APPLY_NOT_COMPLETED = "STATE_APPLY_NOT_COMPLETED"
    PARTIAL_UPDATE = "STATE_PARTIAL_UPDATE"
    CONCURRENT_MODIFICATION = "STATE_CONCURRENT_MODIFICATION"
    RECONCILIATION_FAILED = "STATE_RECONCILIATION_FAILED"
    VERSION_SKEW = "STATE_VERSION_SKEW"
    DRIFT_DETECTED = "STATE_DRIFT_DETECTED"


CORRECTIVE_ACTIONS: dict[ReasonCode, str] = {
    ReasonCode.APPLY_NOT_COMPLETED: (
        "Recovery rolled the interrupted transaction back to the last committed revision. "
        "Check `trueup status` for its history, then re-run `trueup apply FILE` and verify exit "
        "0: any successful apply that leaves observed equal to desired clears this code, "
        "re-applying the document the system holds (answered `unchanged`) included."
    ),
    ReasonCode.PARTIAL_UPDATE: (
        "Some subsystems were applied and others failed (best-effort mode). Fix the cause "
        "named for each failed subsystem and re-apply the full document (atomic mode)."
    ),
    ReasonCode.CONCURRENT_MODIFICATION: (
        "Another writer held the device or the expected version was stale. Nothing was "
        "changed. Re-read `trueup status`, coordinate with the other writer, and re-apply with "
        "the current version in --expect-version / If-Match."
    ),
    ReasonCode.RECONCILIATION_FAILED: (
        "Reconciliation errored or its circuit breaker opened. Fix the named cause, then run "
        "`trueup reconcile --subsystem NAME` or apply a new revision."
    ),
    ReasonCode.VERSION_SKEW: (
        "The agent's applied version differs from the desired one, or the document uses a "
        "schema this agent does not support. Apply the desired revision, or upgrade the agent "
        "(or downgrade the document) until versions agree."
    ),
    ReasonCode.DRIFT_DETECTED: (
        "Observed state was changed outside an apply. Find who changed it (see the drift "
        "record's attribution), then `trueup reconcile` or acknowledge with `trueup ack`. "
        "Do not edit state files by hand."
    ),
}

# Process exit codes the CLI uses for refused writes.
EXIT_CODES: dict[ReasonCode, int] = {
    ReasonCode.CONCURRENT_MODIFICATION: 3,
    ReasonCode.VERSION_SKEW: 4,
}


class Finding(BaseModel):
    """One reason code with its evidence."""

    model_config = ConfigDict(frozen=True)

    code: ReasonCode
    subsystem: str | None = None
    paths: list[str] = []
    since: str | None = None
    detail: str = ""
    action: str = ""
    evidence: dict[str, Any] = {}

    @classmethod
    def of(cls, code: ReasonCode, **kwargs: Any) -> Finding:
        return cls(code=code, action=CORRECTIVE_ACTIONS[code], **kwargs)
