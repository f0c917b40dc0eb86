"""The control plane's fleet answers as the CLI reads them (`GET /api/v1/devices`,
`GET /api/v1/devices/{device}`), for the type checker.

`trueup fleet list` and `trueup fleet show` render these bodies as decoded
JSON. What a router reported about itself (its last report, its drift
history, its acknowledgements, its agent's support) is kept as the router
sent it and read defensively: those keys are `object` here.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict

from trueup.model.jsontypes import JSONObject

__all__ = [
    "FleetAcknowledgement",
    "FleetDevice",
    "FleetOverride",
    "FleetPlan",
    "PathChange",
    "PlanCounts",
    "PlanRefusal",
    "PlanRequest",
    "PlanRollout",
    "PlanTarget",
    "ProposedChange",
    "RolloutMember",
    "RolloutRequest",
    "RolloutTarget",
    "RolloutView",
    "StoredProfile",
    "VariablesUpdate",
    "WaveSpec",
    "WaveView",
]


class FleetOverride(TypedDict, total=False):
    """A local apply over the control plane's revision: its version, who, when, why."""

    version: int
    actor: str | None
    at: str | None
    reason: str | None


class FleetAcknowledgement(TypedDict, total=False):
    """An acknowledgement set on the control plane: the subsystem, until when, why."""

    subsystem: str
    expires_at: str | None
    reason: str | None


class FleetDevice(TypedDict, total=False):
    """One device's fleet entry (`trueup.server.fleet.derive`, with `last_report` and
    `agent` when it is asked for by name)."""

    device: str
    status: str
    conditions: list[str]
    desired_version: int | None
    desired_digest: str | None
    applied_version: int | None
    applied_digest: str | None
    applied_origin: str | None
    digest_match: bool | None
    last_report_at: str | None
    heartbeat_interval: float | None
    missed_heartbeats: int
    in_sync_since: str | None
    reason_codes: list[str]
    labels: dict[str, str]
    override: FleetOverride | None
    acknowledgements: list[FleetAcknowledgement]
    # As the router reported them.
    last_drift: object
    drift_history: list[object]
    agent_acknowledgements: list[object]
    confirmation: object
    last_report: object
    agent: object


# -- rollouts (`trueup fleet rollout`) -----------------------------------------------------
class WaveSpec(TypedDict, total=False):
    """One wave of a rollout asked for: the canary's devices, or a cumulative percentage."""

    devices: list[str]
    percent: int


class RolloutTarget(TypedDict):
    """A device and the desired-state document it is sent (as read, validated by the server)."""

    device: str
    document: JSONObject


class RolloutRequest(TypedDict, total=False):
    """`POST /api/v1/rollouts` (with `targets`) or `/api/v1/plan/rollout` (with `selector`)."""

    targets: list[RolloutTarget]
    selector: str | None
    expect_digest: str
    waves: list[WaveSpec]
    max_unavailable: int | str
    soak_seconds: float
    failure_budget: int
    confirm_within: int | None
    approval: bool
    gate_timeout: float
    comment: str


class RolloutSpec(TypedDict, total=False):
    max_unavailable: int | str
    soak_seconds: float
    failure_budget: int
    confirm_within: int | None
    gate_timeout: float


class WaveView(TypedDict, total=False):
    """A rollout's wave as the server runs it: its devices (or selector), state and counts."""

    index: int
    state: str
    devices: list[str]
    selector: str | None
    percent: int | None
    approval: bool
    counts: dict[str, int]


class MemberGates(TypedDict, total=False):
    reason: str | None


class RolloutMember(TypedDict, total=False):
    """One device of a rollout: its wave, state, versions, and why (its gates')."""

    device: str
    wave: int
    state: str
    reason: str | None
    gates: MemberGates | None
    from_version: int | None
    sent_version: int | None
    reverted_version: int | None


class RolloutView(TypedDict, total=False):
    """A rollout (`GET /api/v1/rollouts/{id}`): its state, limits, waves and devices."""

    id: int
    state: str
    reason: str | None
    created_at: str
    created_by: str
    comment: str
    spec: RolloutSpec
    waves: list[WaveView]
    members: list[RolloutMember]


class PlanCounts(TypedDict):
    changed: int
    refused: int
    unchanged: int


class RefusedDevice(TypedDict, total=False):
    device: str


class RolloutPlan(TypedDict, total=False):
    counts: PlanCounts
    refused: list[RefusedDevice]


class PlanRollout(TypedDict):
    """`POST /api/v1/plan/rollout`: what the plan changes, and the rollout it started."""

    plan: RolloutPlan
    rollout: RolloutView | None


# -- the fleet plan (`trueup fleet plan`, `publish`, `vars`) --------------------------------
class PathChange(TypedDict):
    """One path of a device's desired document the plan changes: old -> new."""

    op: str  # add, remove, change
    path: str
    old: object
    new: object


class PlanTarget(TypedDict, total=False):
    """A device the plan changes: from which desired version, how, to which document."""

    device: str
    from_version: int
    changes: list[PathChange]
    digest: str


class PlanRefusal(TypedDict, total=False):
    """A device the plan refuses: what kind of refusal, and its problems."""

    device: str
    kind: str
    problems: list[str]


class FleetPlan(TypedDict, total=False):
    """`POST /api/v1/plan`: what a change (or the stored inputs) does to each device."""

    targets: list[PlanTarget]
    refused: list[PlanRefusal]
    counts: PlanCounts
    exit_code: int


class ProposedChange(TypedDict, total=False):
    """The change a plan is asked about: a profile, its deletion, a device's variables or
    labels (a value None removes its name)."""

    kind: str
    document: JSONObject
    name: str
    device: str
    variables: dict[str, object]
    labels: dict[str, object]


class PlanRequest(TypedDict):
    selector: str
    change: NotRequired[ProposedChange]


class VariablesUpdate(TypedDict):
    """`PUT /api/v1/devices/{device}/variables`: the variables, and the own layer when it
    is replaced (a partial spec) or removed (None)."""

    variables: dict[str, object]
    own: NotRequired[JSONObject | None]


class StoredProfile(TypedDict, total=False):
    """A profile version the control plane stored (`PUT /api/v1/profiles/{name}`)."""

    name: str
    version: int
