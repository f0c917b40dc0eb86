"""The agent's own health records: its listeners, management readiness, service health.

Who builds them: the early responder (`trueup.agent.early`, before the agent
is imported) and the agent (`trueup.agent.process.Agent`); the API serves
them as they are (`/v1/health/management`, `/v1/health/services`) and the
status carries the management one (`management`, laid over what the
document and the system say). Standard library only: the fast path
(`trueup.agent.fastboot`) imports this module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NotRequired, TypedDict

if TYPE_CHECKING:
    from trueup.model.records import DamageRecord
    from trueup.startup.sources import ManagementSourceJSON

__all__ = [
    "AgentExtras",
    "EarlyAnswer",
    "ListenerRecord",
    "ManagementHealth",
    "ServiceHealth",
    "ServicesHealth",
    "StartingBody",
    "StateDirectoryHealth",
]


class ListenerRecord(TypedDict, total=False):
    """One listener of the API (`unix`, `bind`: the named address, `tcp`: the wildcard)."""

    path: str  # the unix socket's
    address: str  # a TCP listener's, and its port
    port: int
    state: str  # binding, waiting, serving, failed, closed, "closed: named bind serving"
    since: str  # serving since
    error: str  # why it waits or failed
    attempts: int  # binds tried
    address_present: bool  # `bind`: whether its address is on the interface now
    fallback: str | None  # `bind`: "wildcard" while the wildcard serves instead


class ManagementHealth(TypedDict):
    """`/v1/health/management`: ready when the interface is up with every management
    address on it and the API serves; else why not."""

    ready: bool
    reason: str | None
    phase: str  # the startup phase's state; "early" before the agent runs
    interface: str | None
    link: str  # up, down, absent, unknown
    addresses: list[str]  # present
    missing: list[str]
    listeners: dict[str, ListenerRecord]
    error: str | None
    version: NotRequired[int | None]  # early: the revision the facts are from


class StartingBody(TypedDict):
    """What the early responder answers anything but the health probe."""

    message: str


EarlyAnswer = ManagementHealth | StartingBody


class ServiceHealth(TypedDict):
    """A subsystem's row of `/v1/health/services`."""

    health: str
    reason: str
    since: str | None
    tier: str


class StateDirectoryHealth(TypedDict):
    """The state files: ok, degraded (damaged) or failed (damaged, writes refused)."""

    health: str
    reason: str
    damaged: list[DamageRecord]


class ServicesHealth(TypedDict):
    """`/v1/health/services`: each subsystem, then the state directory beside them."""

    subsystems: dict[str, ServiceHealth]
    state_directory: StateDirectoryHealth


class AgentExtras(TypedDict, total=False):
    """What the agent adds to the status's `agent` section."""

    management_source: ManagementSourceJSON
