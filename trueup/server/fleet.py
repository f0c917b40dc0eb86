"""Fleet state, derived from facts: the desired version, the last report and the clock.

Conditions (a device can have several; `status` is the most urgent one):

    heartbeat_stale        no report for `stale_intervals` heartbeat intervals
                           (or never reported)
    reconciliation_failed  the agent reports STATE_RECONCILIATION_FAILED,
                           STATE_PARTIAL_UPDATE or STATE_APPLY_NOT_COMPLETED
    version_skew           applied version ≠ desired version (STATE_VERSION_SKEW)
    drift                  the agent reports STATE_DRIFT_DETECTED
    in_sync                none of the above
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from trueup.model.reasons import ReasonCode

__all__ = ["DeviceFacts", "FleetStatus", "FleetView", "derive"]


class FleetStatus(StrEnum):
    IN_SYNC = "in_sync"
    DRIFT = "drift"
    VERSION_SKEW = "version_skew"
    HEARTBEAT_STALE = "heartbeat_stale"
    RECONCILIATION_FAILED = "reconciliation_failed"


_PRECEDENCE = [
    FleetStatus.HEARTBEAT_STALE,
    FleetStatus.RECONCILIATION_FAILED,
    FleetStatus.VERSION_SKEW,
    FleetStatus.DRIFT,
]

_FAILED_CODES = {
    ReasonCode.RECONCILIATION_FAILED,
    ReasonCode.PARTIAL_UPDATE,
    ReasonCode.APPLY_NOT_COMPLETED,
}


@dataclass(frozen=True)
class DeviceFacts:
    desired_version: int
    applied_version: int | None
    reported_codes: list[str]
    last_report_at: float | None
    heartbeat_interval: float
    in_sync_since: float | None
    acked_subsystems: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class FleetView:
    status: FleetStatus
    conditions: list[FleetStatus]
    reason_codes: list[str]
    heartbeat_age: float | None
    missed_heartbeats: int | None
    in_sync_since: float | None


def derive(facts: DeviceFacts, now: float, stale_intervals: int) -> FleetView:
    conditions: set[FleetStatus] = set()
    codes: list[str] = [c for c in facts.reported_codes if c in set(ReasonCode)]
    age: float | None = None
    missed: int | None = None
    if facts.last_report_at is None:
        conditions.add(FleetStatus.HEARTBEAT_STALE)
    else:
        age = max(0.0, now - facts.last_report_at)
        interval = max(facts.heartbeat_interval, 0.001)
        missed = int(age // interval)
        if age > stale_intervals * interval:
            conditions.add(FleetStatus.HEARTBEAT_STALE)
    if facts.desired_version > 0 and facts.applied_version != facts.desired_version:
        conditions.add(FleetStatus.VERSION_SKEW)
        if ReasonCode.VERSION_SKEW not in codes:
            codes.append(ReasonCode.VERSION_SKEW)
    elif ReasonCode.VERSION_SKEW in codes:
        conditions.add(FleetStatus.VERSION_SKEW)
    if ReasonCode.DRIFT_DETECTED in codes:
        conditions.add(FleetStatus.DRIFT)
    if any(c in _FAILED_CODES for c in codes):
        conditions.add(FleetStatus.RECONCILIATION_FAILED)
    ordered = [c for c in _PRECEDENCE if c in conditions]
    status = ordered[0] if ordered else FleetStatus.IN_SYNC
    return FleetView(
        status=status,
        conditions=ordered or [FleetStatus.IN_SYNC],
        reason_codes=sorted(set(codes)),
        heartbeat_age=age,
        missed_heartbeats=missed,
        in_sync_since=facts.in_sync_since if not ordered else None,
    )
