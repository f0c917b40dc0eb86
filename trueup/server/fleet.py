"""Fleet state, derived from facts: the desired revision, the last report and the clock.

A revision is identified by its number *and* its document digest
(`trueup.model.document.document_digest`, which ignores metadata.version). A
local apply on the router takes the next number, so a control-plane revision
with the same number says nothing about which document runs there: when both
digests are known they decide.

Conditions (a device can have several; `status` is the most urgent one):

    heartbeat_stale        no report for `stale_intervals` heartbeat intervals
                           (or never reported)
    reconciliation_failed  the agent reports STATE_RECONCILIATION_FAILED,
                           STATE_PARTIAL_UPDATE or STATE_APPLY_NOT_COMPLETED
    local_override         the agent reports a local apply overriding the
                           control plane's revision (an explicit, reported
                           override; the next desired revision replaces it)
    version_skew           without an override: applied digest ≠ desired digest
                           (when both are known, even if the numbers are equal),
                           or applied version ≠ desired version
                           (STATE_VERSION_SKEW); or the agent reports it
    drift                  the agent reports STATE_DRIFT_DETECTED
    in_sync                none of the above

The fleet's enumerated filters (`status`, a condition; `reason`, a reason code)
accept only the values in `FILTER_CHOICES`: `filter_problems` names an unknown
one, its parameter and the valid values, so that a typo is refused rather than
answered with an empty fleet.

`agent_support` reads what an agent says it is (its version, the document
apiVersions and `spec` sections it supports) from its last report, and names
what of the desired revision it does not support.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from trueup.model.reasons import ReasonCode
from trueup.server.records import AgentSupport, Unsupported

__all__ = [
    "FILTER_CHOICES",
    "DeviceFacts",
    "FleetStatus",
    "FleetView",
    "agent_support",
    "derive",
    "digest_match",
    "filter_problems",
    "in_sync_now",
]


class FleetStatus(StrEnum):
    IN_SYNC = "in_sync"
    DRIFT = "drift"
    VERSION_SKEW = "version_skew"
    HEARTBEAT_STALE = "heartbeat_stale"
    RECONCILIATION_FAILED = "reconciliation_failed"
    LOCAL_OVERRIDE = "local_override"


# The fleet's enumerated filters and the values each accepts, in the order shown.
FILTER_CHOICES: dict[str, tuple[str, ...]] = {
    "status": tuple(s.value for s in FleetStatus),
    "reason": tuple(c.value for c in ReasonCode),
}


def filter_problems(prefix: str = "", **given: str | None) -> list[str]:
    """One problem per unknown filter value in `given` (parameter -> value; None or ''
    means not given), naming the parameter (after `prefix`), the value and the valid ones."""
    problems = []
    for parameter, value in given.items():
        choices = FILTER_CHOICES[parameter]
        if value and value not in choices:
            problems.append(f"{prefix}{parameter}: {value!r} is not one of {', '.join(choices)}")
    return problems


_PRECEDENCE = [
    FleetStatus.HEARTBEAT_STALE,
    FleetStatus.RECONCILIATION_FAILED,
    FleetStatus.LOCAL_OVERRIDE,
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
    # The desired revision's content_hash and the digest of the applied document
    # (None when unknown: no desired revision, or an agent that does not report it).
    desired_digest: str | None = None
    applied_digest: str | None = None
    # The agent reports a local apply that overrides the control plane's revision.
    override: bool = False


@dataclass(frozen=True)
class FleetView:
    status: FleetStatus
    conditions: list[FleetStatus]
    reason_codes: list[str]
    heartbeat_age: float | None
    missed_heartbeats: int | None
    in_sync_since: float | None
    # True/False when both digests are known, else None.
    digest_match: bool | None = None


def digest_match(desired_digest: str | None, applied_digest: str | None) -> bool | None:
    """Whether the applied document is the desired one; None when either digest is unknown."""
    if not desired_digest or not applied_digest:
        return None
    return desired_digest == applied_digest


def in_sync_now(
    *,
    desired_version: int | None,
    applied_version: int | None,
    desired_digest: str | None,
    applied_digest: str | None,
    override: bool,
    reported_codes: list[str],
) -> bool:
    """Whether one report shows the desired revision applied (ingest's `in_sync_since`)."""
    return (
        applied_version == desired_version
        and not override
        and digest_match(desired_digest, applied_digest) is not False
        and not reported_codes
    )


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
    matched = digest_match(facts.desired_digest, facts.applied_digest)
    if facts.override:
        # The router runs a local document on purpose; that explains any difference
        # from the desired revision, so it is not also version skew.
        conditions.add(FleetStatus.LOCAL_OVERRIDE)
    elif facts.desired_version > 0 and (
        matched is False or facts.applied_version != facts.desired_version
    ):
        # Same number, different document is skew too: the digests decide when known.
        conditions.add(FleetStatus.VERSION_SKEW)
        if ReasonCode.VERSION_SKEW not in codes:
            codes.append(ReasonCode.VERSION_SKEW)
    if ReasonCode.VERSION_SKEW in codes:
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
        digest_match=matched,
    )


def _strings(value: Any) -> list[str] | None:
    if not isinstance(value, list):
        return None
    return [str(v) for v in value]


def agent_support(
    report: Mapping[str, Any] | None, desired_document: Mapping[str, Any] | None
) -> AgentSupport:
    """The agent as its last report describes it, and what of the desired revision it lacks.

    `version`, `api_versions` and `sections` are None when the agent did not report
    them (no report yet, or an agent older than these fields). `unsupported` lists
    `{path, detail}` for the desired document's apiVersion and each `spec` section the
    agent says it does not support; it stays empty when the agent did not say.
    """
    report = report or {}
    version = report.get("agent_version")
    api_versions = _strings(report.get("supported_api_versions"))
    sections = _strings(report.get("supported_sections"))
    unsupported: list[Unsupported] = []
    document = desired_document or {}
    api_version = document.get("apiVersion")
    if api_versions is not None and api_version is not None and api_version not in api_versions:
        unsupported.append(
            {
                "path": "apiVersion",
                "detail": f"the desired revision is {api_version}; the agent supports "
                + (", ".join(api_versions) or "none"),
            }
        )
    spec = document.get("spec")
    if sections is not None and isinstance(spec, Mapping):
        for name in sorted(str(key) for key in spec):
            if name not in sections:
                unsupported.append(
                    {
                        "path": f"spec.{name}",
                        "detail": "the desired revision uses this section; "
                        "the agent does not support it",
                    }
                )
    return {
        "version": version if isinstance(version, str) else None,
        "api_versions": api_versions,
        "sections": sections,
        "unsupported": unsupported,
    }
