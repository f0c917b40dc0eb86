"""A rollout's records: its states, the rows it writes, what the API shows of it.

Each record that stays a dict is a `TypedDict` (the JSON the API answers, the
columns an update writes); the closed sets of states are `StrEnum`s, so the
JSON and the stored text stay the same strings.
"""

from __future__ import annotations

from enum import StrEnum
from typing import NotRequired, TypedDict

__all__ = [
    "GateConfirmation",
    "GatesJSON",
    "MemberState",
    "MemberUpdate",
    "MemberView",
    "RefusedSend",
    "RefusedTarget",
    "RolloutState",
    "RolloutSummary",
    "RolloutUpdate",
    "RolloutView",
    "SentMember",
    "SpecJSON",
    "StartedRollout",
    "TransitionDetail",
    "WaveJSON",
    "WaveView",
]


class RolloutState(StrEnum):
    """Where a rollout stands: running, paused and waiting-approval hold its devices."""

    RUNNING = "running"
    PAUSED = "paused"
    WAITING_APPROVAL = "waiting-approval"
    COMPLETED = "completed"
    FAILED = "failed"
    ABORTED = "aborted"


class MemberState(StrEnum):
    """Where one device of a rollout stands."""

    PENDING = "pending"
    SENT = "sent"
    PASSED = "passed"
    FAILED = "failed"
    REVERTED = "reverted"
    SKIPPED = "skipped"


class WaveJSON(TypedDict, total=False):
    """One wave as asked for: exactly one of devices, selector, percent."""

    devices: list[str]
    selector: str
    percent: int
    approval: bool


class SpecJSON(TypedDict):
    """A rollout's spec as stored and shown."""

    waves: list[WaveJSON]
    max_unavailable: int | str
    soak_seconds: float
    failure_budget: int
    confirm_within: int | None
    gate_timeout: float


class GatesJSON(TypedDict):
    """One sent device's gates: each check True (passed), False (failed), None (not yet)."""

    verdict: str  # passed | failed | waiting
    reason: str
    checks: dict[str, bool | None]


class RolloutSummary(TypedDict):
    """A rollout as listed (times ISO 8601 UTC)."""

    id: int
    state: str
    current_wave: int
    spec: SpecJSON
    created_by: str
    created_at: str | None
    updated_at: str | None
    finished_at: str | None
    comment: str
    reason: str | None


class WaveView(WaveJSON):
    """One wave as the API shows it: how many members, how many in each state, its state."""

    index: int
    members: int
    counts: dict[str, int]
    state: str  # done | pending | waiting-approval | soaking | the rollout's state


class MemberView(TypedDict):
    """One device of a rollout as the API shows it; its gates while it is sent."""

    device: str
    wave: int
    state: str
    digest: str
    from_version: int
    sent_version: int | None
    reverted_version: int | None
    sent_at: str | None
    finished_at: str | None
    reason: str | None
    gates: NotRequired[GatesJSON]


class RefusedTarget(TypedDict):
    """A device the plan could not send the change to, and why."""

    device: str
    kind: str
    problems: list[str]


class RolloutView(RolloutSummary):
    """A rollout with its waves and members."""

    waves: list[WaveView]
    members: list[MemberView]


class StartedRollout(RolloutView):
    """A rollout just started, with the devices its plan refused."""

    refused: list[RefusedTarget]


class SentMember(TypedDict):
    """A device a wave sent its revision to."""

    device: str
    version: int


class RefusedSend(TypedDict):
    """A device a wave did not send to, and why."""

    device: str
    reason: str


class GateConfirmation(TypedDict):
    """A device's latest confirmation as a rollout's gates read it."""

    version: int | None
    state: str
    deadline: float | None
    reason: str


TransitionDetail = TypedDict(
    "TransitionDetail",
    {
        "rollout_id": int,
        "from": str,
        "to": str,
        "reason": NotRequired[str],
        "accepted_failures": NotRequired[int],
        "wave": NotRequired[int],
        "put_back": NotRequired[list[dict[str, int | str]]],
    },
)
"""The audit detail of an operator's action on a rollout (`from` is a keyword: the
functional form)."""


class RolloutUpdate(TypedDict, total=False):
    """The columns of `rollouts` an update writes."""

    state: str
    updated_at: float
    reason: str | None
    current_wave: int
    wave_started_at: float
    wave_done_at: float | None
    accepted_failures: int
    finished_at: float


class MemberUpdate(TypedDict, total=False):
    """The columns of `rollout_members` an update writes."""

    state: str
    sent_version: int
    sent_at: float
    baseline_codes: str
    finished_at: float
    reason: str
    reverted_version: int | None
