"""What the dashboard shows, read through the service layer (and two narrow queries).

The fleet comes from `ControlPlane.fleet` (the JSON API's view, same
derivation). Two conditions the fleet view does not derive come from the
agents' last reports: `fenced` (a subsystem reports health `fenced`) and
`restore_pending` (a fence held by a restore, or a reported restore that has
not finished). Reports are only parsed for devices whose stored report
mentions a fence or a restore (one indexed-free LIKE scan), so a 10,000-device
fleet stays one query plus a small one.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import and_, or_, select

from trueup.model.layering import parse_selector
from trueup.model.reasons import ReasonCode
from trueup.server.api.records import ServiceRecord
from trueup.server.dashboard.records import AuditRow
from trueup.server.service import ControlPlane
from trueup.server.tables import audit_log, device_state, devices

__all__ = [
    "REASONS",
    "STATUSES",
    "FleetPage",
    "device_audit",
    "epoch",
    "extra_conditions",
    "filter_problems",
    "fleet_page",
    "iso",
    "merge_conditions",
    "report_conditions",
]

# Every status the table can show, most urgent first (the filter's choices).
STATUSES = [
    "heartbeat_stale",
    "reconciliation_failed",
    "restore_pending",
    "fenced",
    "local_override",
    "version_skew",
    "drift",
    "in_sync",
]
LABELS = {
    "heartbeat_stale": "heartbeat stale",
    "reconciliation_failed": "reconciliation failed",
    "restore_pending": "restore pending",
    "fenced": "fenced",
    "local_override": "override",
    "version_skew": "version skew",
    "drift": "drift",
    "in_sync": "in sync",
}
REASONS = [c.value for c in ReasonCode]
PAGE_SIZE = 100


def filter_problems(*, status: str, reason: str) -> list[str]:
    """One line per unknown filter value, naming it and the valid values (by label)."""
    problems = []
    if status and status not in STATUSES:
        problems.append(f"unknown status {status[:64]!r}: choose one of " + ", ".join(STATUSES))
    if reason and reason not in REASONS:
        problems.append(f"unknown reason code {reason[:64]!r}: choose one of " + ", ".join(REASONS))
    return problems


def epoch(value: float | str | None) -> float:
    """Seconds since the epoch from what the service layer gives: a number or ISO 8601 text."""
    if value is None or value == "":
        return 0.0
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    return float(value)


def iso(value: float | str | None) -> str:
    """ISO 8601 UTC with a Z, to the second ('' for None)."""
    if value is None or value == "":
        return ""
    return datetime.fromtimestamp(epoch(value), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def report_conditions(report: ServiceRecord | None) -> list[str]:
    """`fenced` / `restore_pending` from one agent report."""
    if not report:
        return []
    found: set[str] = set()
    for sub in (report.get("subsystems") or {}).values():
        if not isinstance(sub, dict) or sub.get("health") != "fenced":
            continue
        found.add("fenced")
        if "restore" in str(sub.get("reason") or "").lower():
            found.add("restore_pending")
    restore = report.get("restore")
    if isinstance(restore, dict) and (
        restore.get("pending") is True
        or (
            "pending" not in restore
            and restore.get("state") not in (None, "completed", "rolled_back")
        )
    ):
        found.add("restore_pending")
    return sorted(found)


def extra_conditions(plane: ControlPlane, tenant_id: int) -> dict[str, list[str]]:
    """Device name -> fenced/restore_pending, for the devices whose report says so."""
    query = (
        select(devices.c.name, device_state.c.report)
        .join(device_state, device_state.c.device_id == devices.c.id)
        .where(
            and_(
                devices.c.tenant_id == tenant_id,
                or_(
                    device_state.c.report.like('%"fenced"%'),
                    device_state.c.report.like('%"restore"%'),
                ),
            )
        )
    )
    out: dict[str, list[str]] = {}
    with plane.db.read() as conn:
        for name, report in conn.execute(query):
            found = report_conditions(json.loads(report))
            if found:
                out[name] = found
    return out


def merge_conditions(entry: ServiceRecord, extra: list[str]) -> ServiceRecord:
    if not extra:
        return entry
    conditions = [c for c in entry["conditions"] if c != "in_sync"]
    conditions = [c for c in STATUSES if c in set(conditions) | set(extra)]
    return {**entry, "conditions": conditions, "status": conditions[0], "in_sync_since": None}


@dataclass
class FleetPage:
    rows: list[ServiceRecord]  # fleet entries
    total: int  # devices of the tenant
    matched: int  # devices matching the filter and search
    counts: dict[str, int]  # devices per condition (before the filter)
    page: int
    pages: int


def fleet_page(
    plane: ControlPlane,
    tenant_id: int,
    *,
    status: str = "",
    reason: str = "",
    search: str = "",
    selector: str = "",
    page: int = 1,
    page_size: int = PAGE_SIZE,
) -> FleetPage:
    entries: list[ServiceRecord] = [dict(e) for e in plane.fleet(tenant_id)]
    chosen = parse_selector(selector) if selector else None
    extra = extra_conditions(plane, tenant_id)
    if extra:
        entries = [merge_conditions(e, extra.get(e["device"], [])) for e in entries]
    counts = dict.fromkeys(STATUSES, 0)
    for entry in entries:
        for condition in entry["conditions"]:
            counts[condition] = counts.get(condition, 0) + 1
    needle = search.strip().lower()
    matched = [
        e
        for e in entries
        if (not status or status in e["conditions"])
        and (not reason or reason in e["reason_codes"])
        and (not needle or needle in e["device"].lower())
        and (chosen is None or chosen.matches(e["labels"]))
    ]
    pages = max(1, -(-len(matched) // page_size))
    page = min(max(1, page), pages)
    start = (page - 1) * page_size
    return FleetPage(
        rows=matched[start : start + page_size],
        total=len(entries),
        matched=len(matched),
        counts=counts,
        page=page,
        pages=pages,
    )


def device_audit(
    plane: ControlPlane, tenant_id: int, device: str, limit: int = 200
) -> list[AuditRow]:
    """The tenant's audit entries about one device, newest first (admins: as /api/v1/audit)."""
    with plane.db.read() as conn:
        rows = conn.execute(
            select(
                audit_log.c.seq,
                audit_log.c.at,
                audit_log.c.actor,
                audit_log.c.action,
                audit_log.c.target,
                audit_log.c.detail,
                audit_log.c.row_hash,
            )
            .where(
                and_(
                    audit_log.c.tenant_id == tenant_id,
                    or_(
                        audit_log.c.target == f"device:{device}",
                        audit_log.c.target.like(f"device:{device}/%"),
                    ),
                )
            )
            .order_by(audit_log.c.seq.desc())
            .limit(limit)
        ).mappings()
        return [
            AuditRow(
                seq=r["seq"],
                at=r["at"],
                actor=r["actor"],
                action=r["action"],
                target=r["target"],
                detail=json.loads(r["detail"]),
                row_hash=r["row_hash"],
            )
            for r in rows
            if r["target"] == f"device:{device}" or r["target"].startswith(f"device:{device}/")
        ]


def now() -> float:
    return time.time()
