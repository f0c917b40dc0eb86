"""The bodies the routes answer with: the envelopes they build, typed key by key.

Each is a `TypedDict` whose keys are declared in the order the route writes them:
FastAPI takes a route's return type as its response model, publishes it in
/openapi.json and serialises the body through it in that order, so the bytes on
the wire are the ones the route builds.

What a route hands on from a control-plane service unchanged (a fleet entry, a
user row, a revision summary, a rollout) is a `ServiceRecord`: its shape is the
service's to declare (trueup.server.service), and the route neither reads nor
reshapes it. Each use names the one place where the service's own type goes once
the service declares it.
"""

from __future__ import annotations

from typing import Any, Literal, TypeAlias

from typing_extensions import TypedDict

from trueup.server.tokens import Role

__all__ = [
    "AuditAnswer",
    "DeadLettersAnswer",
    "DeliveriesAnswer",
    "DeliveryMoved",
    "DeviceCreated",
    "DevicesAnswer",
    "LabelsAnswer",
    "ProfileVersionsAnswer",
    "ProfilesAnswer",
    "ReportsAnswer",
    "RevisionsAnswer",
    "RolloutPlanAnswer",
    "RolloutsAnswer",
    "RulesAnswer",
    "SecretsAnswer",
    "ServiceRecord",
    "TargetsAnswer",
    "TokenCreated",
    "TokenRevoked",
    "TokensAnswer",
    "UserRole",
    "UsersAnswer",
]

# A record a control-plane service returns and a route (or a dashboard page) hands on
# unchanged; the service declares its shape (see the module docstring).
ServiceRecord: TypeAlias = dict[str, Any]


class UsersAnswer(TypedDict):
    users: list[ServiceRecord]


class UserRole(TypedDict):
    """A user created with, or moved to, a role."""

    user: str
    role: Role


class TokenCreated(TypedDict):
    """A new user token: its secret is shown this once."""

    id: int
    user: str
    token: str


class TokensAnswer(TypedDict):
    tokens: list[ServiceRecord]


class TokenRevoked(TypedDict):
    id: int
    revoked: Literal[True]


class AuditAnswer(TypedDict):
    entries: list[ServiceRecord]


class DevicesAnswer(TypedDict):
    devices: list[ServiceRecord]
    count: int


class DeviceCreated(TypedDict):
    device: str
    labels: dict[str, str]


class ReportsAnswer(TypedDict):
    reports: list[ServiceRecord]


class LabelsAnswer(TypedDict):
    device: str
    labels: dict[str, str]


class SecretsAnswer(TypedDict):
    secrets: list[ServiceRecord]


class TargetsAnswer(TypedDict):
    """The webhook targets and the allowlist of internal receivers they may reach."""

    targets: list[ServiceRecord]
    allowlist: list[str]


class RulesAnswer(TypedDict):
    rules: list[ServiceRecord]


class DeliveriesAnswer(TypedDict):
    deliveries: list[ServiceRecord]


class DeadLettersAnswer(TypedDict):
    dead_letters: list[ServiceRecord]


class DeliveryMoved(TypedDict):
    """A dead delivery queued again (`pending`) or discarded (kept in the log)."""

    id: int
    state: Literal["pending", "discarded"]


class RevisionsAnswer(TypedDict):
    revisions: list[ServiceRecord]


class ProfilesAnswer(TypedDict):
    profiles: list[ServiceRecord]


class ProfileVersionsAnswer(TypedDict):
    versions: list[ServiceRecord]


class RolloutsAnswer(TypedDict):
    rollouts: list[ServiceRecord]
    count: int


class RolloutPlanAnswer(TypedDict):
    """The plan of the stored inputs, and the rollout started for it (None: the plan
    changes no device)."""

    plan: ServiceRecord
    rollout: ServiceRecord | None
