"""Everything one device page shows (and the evidence bundle holds), read for one caller."""

from __future__ import annotations

import time
from typing import Any

from trueup.server.dashboard import data
from trueup.server.dashboard.device import DevicePage
from trueup.server.dashboard.records import EvidenceParts
from trueup.server.service import ControlPlane, Principal, agent_acknowledgements
from trueup.server.tokens import Role, role_at_least

__all__ = ["evidence_parts", "load_device_page"]


def load_device_page(
    plane: ControlPlane, principal: Principal, csrf: str, device: str, **extra: Any
) -> DevicePage:
    """The device's page for this caller (NotFound outside the caller's tenant)."""
    tenant = principal.tenant_id
    entry: dict[str, Any] = dict(plane.device_view(tenant, device))
    report = entry.pop("last_report")
    conditions = data.report_conditions(report)
    if conditions:
        entry = data.merge_conditions(entry, conditions)
    desired = plane.desired(tenant, device)
    revisions: list[dict[str, Any]] = [dict(r.summary()) for r in plane.revisions(tenant, device)]
    revisions.sort(key=lambda r: r["version"], reverse=True)
    admin = principal.role is not None and role_at_least(principal.role, Role.ADMIN)
    now = time.time()
    return DevicePage(
        principal=principal,
        csrf=csrf,
        entry=entry,
        report=report,
        reports=plane.report_history(tenant, device, 200),
        desired={**desired.summary(), "document": desired.document} if desired else None,
        revisions=revisions,
        audit=data.device_audit(plane, tenant, device) if admin else None,
        now=now,
        drift=[dict(r) for r in plane.drift_history(tenant, device)],
        agent_acks=[dict(a) for a in agent_acknowledgements(report, now)],
        evidence=plane.evidence_list(tenant, device),
        **extra,
    )


def evidence_parts(page: DevicePage) -> EvidenceParts:
    """The evidence bundle's parts (file name without .json -> content)."""
    report = page.report or {}
    parts: EvidenceParts = {
        "device": page.entry,
        "desired": page.desired,
        "last-report": page.report,
        "reason-codes": report.get("findings") or [],
        "reports": page.reports[:50],
        "revisions": page.revisions,
        "acknowledgements": page.entry.get("acknowledgements") or [],
        "drift-history": page.drift,
        "router-acknowledgements": page.agent_acks,
    }
    if page.audit is not None:
        parts["audit"] = page.audit
    return parts
