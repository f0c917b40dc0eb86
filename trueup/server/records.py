"""The fleet's records that stay dicts: each device's confirmation and drift as stored
and as shown, its fleet entry, what its agent supports.

Each is a `TypedDict`: the value is the very dict the tables take or the API
returns as JSON, so typing it changes no byte on the wire. Times are epoch
seconds in a stored row and ISO 8601 UTC strings in what the API shows.
"""

from __future__ import annotations

from enum import StrEnum
from typing import NotRequired, TypedDict

from trueup.model.drift import Attribution
from trueup.model.jsontypes import JSONObject

__all__ = [
    "Acknowledgement",
    "ActiveAck",
    "AgentAcknowledgement",
    "AgentSupport",
    "Attribution",
    "ConfirmationEntry",
    "ConfirmationRow",
    "ConfirmationState",
    "DeviceView",
    "DriftEntry",
    "DriftRecord",
    "DriftRow",
    "FleetEntry",
    "HealedBy",
    "Override",
    "Unsupported",
]


class ConfirmationState(StrEnum):
    """Where an apply guarded by a confirmation window stands, as its agent reports it."""

    PENDING = "pending"
    CONFIRMED = "confirmed"
    ROLLED_BACK = "rolled-back"


class ConfirmationRow(TypedDict):
    """One device's confirmation as `device_confirmation` stores it (times epoch)."""

    device_id: int
    version: int | None
    state: str
    deadline: float | None
    reason: str
    rollback_to: int | None
    rolled_back_to_version: int | None
    since: float
    reported_at: float


class ConfirmationEntry(TypedDict):
    """One device's latest confirmation as the fleet shows it and a rollout's gate reads it."""

    version: int | None
    state: str
    deadline: float | None
    deadline_at: str | None
    reason: str
    rollback_to: int | None
    rolled_back_to_version: int | None
    since: str | None
    reported_at: str | None


class HealedBy(TypedDict, total=False):
    """Who ended a drift record: trueup's heal, the writer putting it back, or trueup
    noticing the agent no longer reports it."""

    by: str
    action: str
    writer: str
    txn: str
    at: str
    actor: str


class DriftRow(TypedDict):
    """One drift record as `device_drift` stores it (lists as JSON text, times epoch)."""

    device_id: int
    subsystem: str
    since: float
    healed_at: float | None
    detected_by: str | None
    paths: str
    changed_by: str
    healed_by: str | None
    attribution: str
    first_reported_at: float
    last_reported_at: float


class DriftRecord(TypedDict):
    """One stored drift record read back (times epoch seconds)."""

    subsystem: str
    since: float
    healed_at: float | None
    state: str  # ongoing | healed
    detected_by: str | None
    paths: list[str]
    changed_by: list[str]
    healed_by: HealedBy | None
    attribution: list[Attribution]
    first_reported_at: float
    last_reported_at: float


class DriftEntry(TypedDict):
    """A drift record as the API shows it (times ISO 8601 UTC)."""

    subsystem: str
    since: str | None
    healed_at: str | None
    state: str
    detected_by: str | None
    paths: list[str]
    changed_by: list[str]
    healed_by: HealedBy | None
    attribution: list[Attribution]
    first_reported_at: str | None
    last_reported_at: str | None


class ActiveAck(TypedDict):
    """An operator's acknowledgement of a subsystem, still in force (the fleet shows it)."""

    subsystem: str
    reason: str
    expires_at: str | None


class Acknowledgement(TypedDict):
    """An acknowledgement just recorded, as the API answers it."""

    id: int
    device: str
    subsystem: str
    reason: str
    author: str
    expires_at: str | None


class AgentAcknowledgement(TypedDict, total=False):
    """A `trueup ack` set on the router, as its agent last reported it (the agent may
    send more keys; they pass through)."""

    subsystem: str
    until: str | None
    by: str | None
    reason: str | None
    at: str | None
    state: str  # active | expired | withdrawn
    ended_at: str | None


class Override(TypedDict, total=False):
    """A local apply overriding the control plane's revision, as the agent reported it."""

    version: int
    actor: str
    at: str | None
    reason: str
    digest: str | None


class Unsupported(TypedDict):
    """What of a desired revision an agent says it does not support."""

    path: str
    detail: str


class AgentSupport(TypedDict):
    """An agent as its last report describes it (None: it did not say)."""

    version: str | None
    api_versions: list[str] | None
    sections: list[str] | None
    unsupported: list[Unsupported]


class FleetEntry(TypedDict):
    """One device of the fleet with its derived state (times ISO 8601 UTC)."""

    device: str
    labels: dict[str, str]
    status: str
    conditions: list[str]
    reason_codes: list[str]
    desired_version: int | None
    applied_version: int | None
    desired_digest: str | None
    applied_digest: str | None
    digest_match: bool | None
    applied_origin: str | None
    override: Override | None
    observed_digest: str | None
    last_report_at: str | None
    heartbeat_interval: float | None
    heartbeat_age: float | None
    missed_heartbeats: int | None
    in_sync_since: str | None
    acknowledgements: list[ActiveAck]
    last_drift: DriftEntry | None
    confirmation: ConfirmationEntry | None


class DeviceView(FleetEntry):
    """One device's fleet entry with its last report and what its agent supports."""

    # The agent's report, as it sent it (the device page takes it out to show apart).
    last_report: NotRequired[JSONObject | None]
    agent: AgentSupport
