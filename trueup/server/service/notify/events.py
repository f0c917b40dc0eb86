"""What a device's state means for notifications: conditions, event kinds, severities, rules.

Pure functions, no database. A report (or the periodic scan) gives a device a set of
open *conditions*; a condition that opens is an event of its own kind, one that
closes is a `healed` event naming it. A device is *failed* while any of the
FAILED conditions is open; escalation measures how long.

    condition / kind   opens when                                         severity
    drift_detected     the agent reports STATE_DRIFT_DETECTED             warning
    apply_failed       STATE_RECONCILIATION_FAILED, STATE_PARTIAL_UPDATE  critical
                       or STATE_APPLY_NOT_COMPLETED
    version_skew       the agent reports STATE_VERSION_SKEW               warning
    breaker_open       a subsystem reports `breaker: open`                critical
    fenced             a subsystem's health is `fenced`                   warning
    restore_pending    the report's `restore.state` is `pending`          warning
    restore_failed     the report's `restore.state` is `failed`           critical
    gateway_down       an uplink of `spec.gateways` is down (the gateway   warning
                       names in the event)
    gateways_all_down  every uplink of a family is down (the route kept)  critical
    heartbeat_stale    no report for stale_intervals heartbeats (scan)    critical
    healed             a condition above closed                           info
    escalation         a rule's device stayed failed past its threshold   critical
    escalation_resolved  that device is no longer failed                  info
    rollout_paused     a rollout paused: this device failed its gates and  critical
                       the wave's failures exceeded the failure budget
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from datetime import UTC, datetime

from trueup.model.jsontypes import JSONObject
from trueup.model.reasons import ReasonCode
from trueup.server.service.notify.records import MatchJSON

__all__ = [
    "CONDITIONS",
    "FAILED",
    "KINDS",
    "SEVERITIES",
    "Match",
    "conditions_of",
    "iso",
    "keep_pending_gateways",
    "severity_at_least",
]

SEVERITIES = ("info", "warning", "critical")

CONDITIONS: dict[str, str] = {
    "drift_detected": "warning",
    "apply_failed": "critical",
    "version_skew": "warning",
    "breaker_open": "critical",
    "fenced": "warning",
    "restore_pending": "warning",
    "restore_failed": "critical",
    "heartbeat_stale": "critical",
    "gateway_down": "warning",
    "gateways_all_down": "critical",
}
KINDS: dict[str, str] = {
    **CONDITIONS,
    "healed": "info",
    "escalation": "critical",
    "escalation_resolved": "info",
    "rollout_paused": "critical",
}
FAILED = frozenset({"apply_failed", "breaker_open", "restore_failed", "heartbeat_stale"})

_APPLY_FAILED = {
    ReasonCode.RECONCILIATION_FAILED.value,
    ReasonCode.PARTIAL_UPDATE.value,
    ReasonCode.APPLY_NOT_COMPLETED.value,
}


def iso(at: float | None) -> str | None:
    """ISO 8601 UTC, to the second (`2026-11-30T17:02:52Z`); None stays None."""
    if at is None:
        return None
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def severity_at_least(severity: str, minimum: str) -> bool:
    return SEVERITIES.index(severity) >= SEVERITIES.index(minimum)


def conditions_of(report: JSONObject) -> dict[str, list[str]]:
    """The conditions a report shows, each with the subsystems (or codes) behind it."""
    codes = [str(c) for c in report.get("reason_codes") or []]
    found: dict[str, list[str]] = {}
    if ReasonCode.DRIFT_DETECTED.value in codes:
        found["drift_detected"] = sorted((report.get("diff_summary") or {}).get("subsystems", {}))
    failed = sorted(set(codes) & _APPLY_FAILED)
    if failed:
        found["apply_failed"] = failed
    if ReasonCode.VERSION_SKEW.value in codes:
        found["version_skew"] = []
    subsystems = report.get("subsystems") or {}
    breakers = sorted(
        name
        for name, sub in subsystems.items()
        if isinstance(sub, dict) and sub.get("breaker") == "open"
    )
    if breakers:
        found["breaker_open"] = breakers
    fenced = sorted(
        name
        for name, sub in subsystems.items()
        if isinstance(sub, dict) and sub.get("health") == "fenced"
    )
    if fenced:
        found["fenced"] = fenced
    gateways = subsystems.get("gateways")
    if isinstance(gateways, dict):
        down = sorted(
            str(g.get("name"))
            for g in gateways.get("gateways") or []
            if isinstance(g, dict) and g.get("state") == "down"
        )
        if down:
            found["gateway_down"] = down
        if gateways.get("gateways_all_down") is True:
            found["gateways_all_down"] = down
    restore = report.get("restore")
    state = restore.get("state") if isinstance(restore, dict) else None
    if state in ("pending", "failed"):
        found[f"restore_{state}"] = []
    return found


def keep_pending_gateways(
    before: dict[str, list[str]], after: dict[str, list[str]], report: JSONObject
) -> dict[str, list[str]]:
    """`after` with the gateway conditions of uplinks the report shows `pending` kept.

    A pending uplink has no verdict yet (the agent restarted, or its probe settings
    changed): an outage is not healed until its probes say so, so a restart mid-outage
    neither sends `healed` nor opens the same condition again a few rounds later.
    """
    gateways = (report.get("subsystems") or {}).get("gateways")
    if not isinstance(gateways, dict):
        return after
    states = {
        str(g.get("name")): g.get("state")
        for g in gateways.get("gateways") or []
        if isinstance(g, dict)
    }
    pending = {name for name, state in states.items() if state == "pending"}
    out = dict(after)
    down = set(after.get("gateway_down", [])) | (set(before.get("gateway_down", [])) & pending)
    if down:
        out["gateway_down"] = sorted(down)
    if "gateways_all_down" in before and pending and "up" not in states.values():
        out.setdefault("gateways_all_down", sorted(down))
    return out


@dataclass(frozen=True)
class Match:
    """A rule's match: every part given must hold (an empty part matches everything)."""

    devices: tuple[str, ...] = ()
    reason_codes: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()
    min_severity: str = "info"

    @classmethod
    def from_json(cls, data: JSONObject) -> Match:
        return cls(
            devices=tuple(data.get("devices") or ()),
            reason_codes=tuple(data.get("reason_codes") or ()),
            kinds=tuple(data.get("kinds") or ()),
            min_severity=str(data.get("min_severity") or "info"),
        )

    def to_json(self) -> MatchJSON:
        return {
            "devices": list(self.devices),
            "reason_codes": list(self.reason_codes),
            "kinds": list(self.kinds),
            "min_severity": self.min_severity,
        }

    def device_matches(self, device: str) -> bool:
        return not self.devices or any(fnmatch.fnmatchcase(device, g) for g in self.devices)

    def matches(self, device: str, kind: str, severity: str, codes: list[str]) -> bool:
        return (
            self.device_matches(device)
            and (not self.kinds or kind in self.kinds)
            and (not self.reason_codes or bool(set(codes) & set(self.reason_codes)))
            and severity_at_least(severity, self.min_severity)
        )
