"""The records the dashboard builds itself: rows it renders, the bundle it packs, the
rollout it starts from a form.

What the dashboard shows from a control-plane service as it comes (a fleet entry,
a stored report, a drift record, a revision summary) is the service's record
(`trueup.server.api.records.ServiceRecord`), read here defensively and never
reshaped.
"""

from __future__ import annotations

from typing import NotRequired

from typing_extensions import TypedDict

from trueup.model.jsontypes import JSONObject
from trueup.server.api.records import ServiceRecord

__all__ = [
    "AuditRow",
    "Difference",
    "EvidenceParts",
    "RolloutFormSpec",
    "WaveSpec",
]


class Difference(TypedDict):
    """One differing path of the last report: from a drift finding's evidence (with the
    desired and observed values when the agent sent them) or only named by a finding or
    the report's diff summary."""

    subsystem: str | None
    path: str
    code: NotRequired[str | None]
    desired: NotRequired[object]
    observed: NotRequired[object]
    missing: NotRequired[list[object]]
    extra: NotRequired[list[object]]


class AuditRow(TypedDict):
    """One audit log entry about a device, as the device page and its bundle show it."""

    seq: int
    at: float
    actor: str
    action: str
    target: str
    detail: JSONObject  # each action's own detail, as the audit log stores it
    row_hash: str


class WaveSpec(TypedDict, total=False):
    """One wave of the roll-out form: its canary devices, a selector, or a percentage."""

    devices: list[str]
    selector: str
    percent: int


class RolloutFormSpec(TypedDict):
    """The roll-out form as the rollout's start arguments."""

    waves: list[WaveSpec] | None
    max_unavailable: int | str
    soak_seconds: float
    failure_budget: int
    confirm_within: int | None
    approval: bool


# The evidence bundle's parts: file name (without .json) -> content.
EvidenceParts = TypedDict(
    "EvidenceParts",
    {
        "device": ServiceRecord,
        "desired": ServiceRecord | None,
        "last-report": ServiceRecord | None,
        "reason-codes": list[ServiceRecord],
        "reports": list[ServiceRecord],
        "revisions": list[ServiceRecord],
        "acknowledgements": list[ServiceRecord],
        "drift-history": list[ServiceRecord],
        "router-acknowledgements": list[ServiceRecord],
        "audit": NotRequired[list[AuditRow]],
    },
)
