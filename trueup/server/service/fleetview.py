"""The fleet as operators see it: each device's derived state, its reports, acknowledgements.

The state itself is derived by the pure `trueup.server.fleet.derive` from the
desired revision, the last report (written by ingest.py) and the clock; this
unit reads the facts for it in one query per tenant. Acknowledgements are
written here because they only annotate this view: they expire and never
change what the agent does.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import and_, select

from trueup.server.fleet import DeviceFacts, FleetView, derive
from trueup.server.service.errors import Invalid, NotFound
from trueup.server.service.store import Store, inserted_id
from trueup.server.tables import acks, device_reports, device_state, devices, revisions

__all__ = ["Fleet", "iso_utc"]

_MAX_ACK_SECONDS = 30 * 24 * 3600


def iso_utc(seconds: float | None) -> str | None:
    """An epoch time as ISO 8601 UTC with milliseconds (`2026-11-30T17:02:52.123Z`); None stays.

    Every time in the fleet's JSON is written this way (the tables keep epoch
    seconds); durations (`heartbeat_age`, `heartbeat_interval`) stay numbers.
    """
    if seconds is None:
        return None
    return (
        datetime.fromtimestamp(float(seconds), UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


class Fleet:
    def __init__(self, store: Store, *, stale_intervals: int = 3) -> None:
        self.store = store
        self.stale_intervals = stale_intervals

    def fleet(self, tenant_id: int, device: str | None = None) -> list[dict[str, Any]]:
        """Every device of the tenant (or the one named), with its derived state."""
        now = time.time()
        query = (
            select(
                devices.c.id,
                devices.c.name,
                devices.c.desired_version,
                revisions.c.content_hash.label("desired_digest"),
                device_state.c.applied_version,
                device_state.c.applied_digest,
                device_state.c.applied_origin,
                device_state.c.override,
                device_state.c.observed_digest,
                device_state.c.reason_codes,
                device_state.c.last_report_at,
                device_state.c.heartbeat_interval,
                device_state.c.in_sync_since,
            )
            .outerjoin(device_state, device_state.c.device_id == devices.c.id)
            .outerjoin(
                revisions,
                and_(
                    revisions.c.device_id == devices.c.id,
                    revisions.c.version == devices.c.desired_version,
                ),
            )
            .where(devices.c.tenant_id == tenant_id)
            .order_by(devices.c.name)
        )
        if device is not None:
            query = query.where(devices.c.name == device)
        with self.store.db.read() as conn:
            rows = list(conn.execute(query).mappings())
            active_acks: dict[int, list[dict[str, Any]]] = {}
            for ack in conn.execute(
                select(acks.c.device_id, acks.c.subsystem, acks.c.reason, acks.c.expires_at)
                .join(devices, devices.c.id == acks.c.device_id)
                .where(and_(devices.c.tenant_id == tenant_id, acks.c.expires_at > now))
            ).mappings():
                active_acks.setdefault(ack["device_id"], []).append(
                    {
                        "subsystem": ack["subsystem"],
                        "reason": ack["reason"],
                        "expires_at": iso_utc(ack["expires_at"]),
                    }
                )
        if device is not None and not rows:
            raise NotFound(f"device {device!r} not found")
        out = []
        for row in rows:
            override = json.loads(row["override"]) if row["override"] else None
            view: FleetView = derive(
                DeviceFacts(
                    desired_version=row["desired_version"],
                    applied_version=row["applied_version"],
                    reported_codes=json.loads(row["reason_codes"] or "[]"),
                    last_report_at=row["last_report_at"],
                    heartbeat_interval=row["heartbeat_interval"] or 30.0,
                    in_sync_since=row["in_sync_since"],
                    desired_digest=row["desired_digest"],
                    applied_digest=row["applied_digest"],
                    override=override is not None,
                ),
                now,
                self.stale_intervals,
            )
            out.append(
                {
                    "device": row["name"],
                    "status": view.status.value,
                    "conditions": [c.value for c in view.conditions],
                    "reason_codes": view.reason_codes,
                    "desired_version": row["desired_version"],
                    "applied_version": row["applied_version"],
                    "desired_digest": row["desired_digest"],
                    "applied_digest": row["applied_digest"],
                    "digest_match": view.digest_match,
                    "applied_origin": row["applied_origin"],
                    "override": override,
                    "observed_digest": row["observed_digest"],
                    "last_report_at": iso_utc(row["last_report_at"]),
                    "heartbeat_interval": row["heartbeat_interval"],
                    "heartbeat_age": view.heartbeat_age,
                    "missed_heartbeats": view.missed_heartbeats,
                    "in_sync_since": iso_utc(view.in_sync_since),
                    "acknowledgements": active_acks.get(row["id"], []),
                }
            )
        return out

    def last_report(self, tenant_id: int, device: str) -> dict[str, Any] | None:
        with self.store.db.read() as conn:
            row = self.store.device(conn, tenant_id, device)
            report = conn.execute(
                select(device_state.c.report).where(device_state.c.device_id == row["id"])
            ).scalar_one_or_none()
        return json.loads(report) if report else None

    def report_history(self, tenant_id: int, device: str, limit: int) -> list[dict[str, Any]]:
        """The newest `limit` reports, newest first (evidence; never deleted)."""
        with self.store.db.read() as conn:
            row = self.store.device(conn, tenant_id, device)
            rows = conn.execute(
                select(device_reports.c.id, device_reports.c.received_at, device_reports.c.payload)
                .where(device_reports.c.device_id == row["id"])
                .order_by(device_reports.c.id.desc())
                .limit(limit)
            ).mappings()
            return [
                {
                    "id": r["id"],
                    "received_at": iso_utc(r["received_at"]),
                    **json.loads(r["payload"]),
                }
                for r in rows
            ]

    def acknowledge(
        self, tenant_id: int, device: str, subsystem: str, seconds: float, reason: str, author: str
    ) -> dict[str, Any]:
        """Record that an operator accepts a subsystem's state for `seconds`, and why."""
        problems = []
        if not subsystem:
            problems.append("subsystem: required")
        if not 0 < seconds <= _MAX_ACK_SECONDS:
            problems.append("for_seconds: must be between 1 second and 30 days")
        if not reason.strip():
            problems.append("reason: say why this state is acceptable for now")
        if problems:
            raise Invalid(problems)
        now = time.time()
        with self.store.write() as conn:
            row = self.store.device(conn, tenant_id, device)
            ack_id = inserted_id(
                conn.execute(
                    acks.insert().values(
                        device_id=row["id"],
                        subsystem=subsystem,
                        reason=reason,
                        author=author,
                        created_at=now,
                        expires_at=now + seconds,
                    )
                )
            )
            self.store.audit(
                conn,
                tenant_id=tenant_id,
                actor=author,
                action="ack.create",
                target=f"device:{device}",
                detail={
                    "ack_id": ack_id,
                    "device_id": row["id"],
                    "subsystem": subsystem,
                    "expires_at": now + seconds,
                },
            )
        return {
            "id": ack_id,
            "device": device,
            "subsystem": subsystem,
            "reason": reason,
            "author": author,
            "expires_at": iso_utc(now + seconds),
        }
