"""Notifications' records that stay dicts: what the API shows, what an update writes.

Times shown are ISO 8601 UTC strings (`events.iso`); the tables keep epoch seconds.
"""

from __future__ import annotations

from enum import StrEnum
from typing import NotRequired, TypedDict

__all__ = [
    "AllowlistView",
    "Attempt",
    "DeliveryState",
    "DeliveryUpdate",
    "DeliveryView",
    "EventDetail",
    "MatchJSON",
    "PausedRollout",
    "QuietReport",
    "RuleView",
    "TargetRow",
    "TargetView",
]


class DeliveryState(StrEnum):
    """Where one webhook delivery stands."""

    PENDING = "pending"
    DELIVERED = "delivered"
    DEAD = "dead"
    DISCARDED = "discarded"


class MatchJSON(TypedDict):
    """A rule's match as stored and shown."""

    devices: list[str]
    reason_codes: list[str]
    kinds: list[str]
    min_severity: str


class TargetView(TypedDict):
    """A webhook target as listed (its URL without credentials); a target just created
    with a generated secret shows it, this once."""

    name: str
    url: str
    auth_header: str | None
    problem: str | None  # why deliveries to it are refused; None: they are not
    created_at: str | None
    secret: NotRequired[str]


class TargetRow(TypedDict):
    """The columns of a new `notify_targets` row (the auth header's only with one)."""

    tenant_id: int
    name: str
    url: str
    secret_id: str
    nonce: bytes
    ciphertext: bytes
    created_at: float
    auth_header_name: NotRequired[str]
    auth_header_secret_id: NotRequired[str]
    auth_header_nonce: NotRequired[bytes]
    auth_header_ciphertext: NotRequired[bytes]


class RuleView(TypedDict):
    """A notification rule as listed (and as its `notify.rule.create` audit entry records)."""

    name: str
    target: str
    match: MatchJSON
    escalate_after: float | None
    created_at: str | None


class AllowlistView(TypedDict):
    """A tenant's allowlist of internal receivers."""

    entries: list[str]
    updated_at: str | None


class Attempt(TypedDict):
    """One attempt to deliver a webhook."""

    at: str | None
    status_code: int | None
    latency_ms: float
    error: str | None


class DeliveryView(TypedDict):
    """One webhook delivery as the delivery log shows it, with its attempts."""

    id: int
    event_id: int
    kind: str
    severity: str
    device: str
    target: str
    rule: str | None
    state: str
    attempts: int
    next_attempt_at: str | None
    last_error: str | None
    created_at: str | None
    finished_at: str | None
    log: list[Attempt]


class DeliveryUpdate(TypedDict, total=False):
    """The columns of `notify_deliveries` an attempt's outcome writes."""

    attempts: int
    lease_until: float | None
    last_error: str | None
    state: str
    finished_at: float
    next_attempt_at: float


class PausedRollout(TypedDict):
    """The rollout that paused on a device's failure (a `rollout_paused` event)."""

    id: int
    wave: int
    reason: str
    failed: list[str]
    device_reason: str | None


class EventDetail(TypedDict, total=False):
    """What an event carries besides its kind, device and codes; each kind its own keys:
    a condition opened (`conditions`, `failed_since`, `subsystems`), `healed` (and the
    `condition`), `escalation` (`rule`, `escalate_after`, `failed`), `escalation_resolved`
    (`escalated_at`), `rollout_paused` (`rollout`)."""

    conditions: list[str]
    failed_since: str | None
    subsystems: list[str]
    condition: str
    rule: str
    escalate_after: float | None
    escalated_at: str | None
    failed: list[str]
    rollout: PausedRollout


class QuietReport(TypedDict):
    """A device whose report changed none of its conditions: only its report time moves
    (the bound parameters of one batched update)."""

    b_device: int
    b_at: float
