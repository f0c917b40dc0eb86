"""Health vocabulary for subsystems and the management tier."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["SubsystemHealth", "Tier", "waiting_on_links"]


class SubsystemHealth(StrEnum):
    OK = "ok"
    DEGRADED = "degraded"
    FAILED = "failed"
    PENDING = "pending"
    # A durable fence holds the subsystem back (trueup.system.fence): owner and reason in status.
    FENCED = "fenced"


class Tier(StrEnum):
    """Startup order. A failure in a later tier never blocks an earlier one."""

    MANAGEMENT = "management"
    NETWORK = "network"
    ROUTING = "routing"  # dynamic routing and gateway failover, over the network tier
    SERVICES = "services"
    OPTIONAL = "optional"

    @property
    def rank(self) -> int:
        return list(Tier).index(self)


def waiting_on_links(missing: list[str]) -> tuple[SubsystemHealth, str] | None:
    """`pending` while named links do not exist yet ("waiting on link lan0"), else None."""
    if not missing:
        return None
    noun = "link" if len(missing) == 1 else "links"
    return SubsystemHealth.PENDING, f"waiting on {noun} {', '.join(missing)}"
