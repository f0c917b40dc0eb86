"""Storing an event: the event row once, and a delivery per matching target.

An event no rule matches is not stored. With `rule_id` (escalations) only that
rule is considered, by its device selector alone.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from sqlalchemy import Connection, select

from trueup.server.service.notify.events import KINDS, Match, iso
from trueup.server.service.notify.records import EventDetail
from trueup.server.tables import devices, notify_deliveries, notify_events, notify_rules, tenants

__all__ = ["Device", "device_of", "emit"]


@dataclass(frozen=True)
class Device:
    """A device as events name it."""

    id: int
    name: str
    tenant_id: int
    tenant: str


def device_of(conn: Connection, device_id: int) -> Device | None:
    row = conn.execute(
        select(
            devices.c.id,
            devices.c.name,
            devices.c.tenant_id,
            tenants.c.name.label("tenant_name"),
        )
        .join(tenants, tenants.c.id == devices.c.tenant_id)
        .where(devices.c.id == device_id)
    ).one_or_none()
    return (
        None if row is None else Device(int(row.id), row.name, int(row.tenant_id), row.tenant_name)
    )


def emit(
    conn: Connection,
    device: Device,
    kind: str,
    now: float,
    detail: EventDetail,
    codes: list[str],
    rule_id: int | None = None,
) -> str | None:
    """Store the event and a delivery per matching target; its id, or None if unmatched."""
    severity = KINDS[kind]
    query = select(notify_rules).where(notify_rules.c.tenant_id == device.tenant_id)
    if rule_id is not None:
        query = query.where(notify_rules.c.id == rule_id)
    targets: dict[int, int] = {}
    for rule in conn.execute(query.order_by(notify_rules.c.id)).mappings():
        match = Match.from_json(json.loads(rule["match"]))
        matched = (
            match.device_matches(device.name)
            if rule_id is not None
            else match.matches(device.name, kind, severity, codes)
        )
        if matched:
            targets.setdefault(int(rule["target_id"]), int(rule["id"]))
    if not targets:
        return None
    event_id = str(uuid.uuid4())
    payload = {
        "id": event_id,
        "kind": kind,
        "severity": severity,
        "tenant": device.tenant,
        "device": device.name,
        "at": iso(now),
        "reason_codes": codes,
        **detail,
    }
    conn.execute(
        notify_events.insert().values(
            id=event_id,
            tenant_id=device.tenant_id,
            device_id=device.id,
            kind=kind,
            severity=severity,
            at=now,
            payload=json.dumps(payload, sort_keys=True),
        )
    )
    conn.execute(
        notify_deliveries.insert(),
        [
            {
                "tenant_id": device.tenant_id,
                "event_id": event_id,
                "target_id": target_id,
                "rule_id": rule,
                "state": "pending",
                "attempts": 0,
                "next_attempt_at": now,
                "lease_until": None,
                "last_error": None,
                "created_at": now,
                "finished_at": None,
            }
            for target_id, rule in sorted(targets.items())
        ],
    )
    return event_id
