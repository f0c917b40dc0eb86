"""The fleet as operators see it: each device's derived state, its reports, acknowledgements.

The state itself is derived by the pure `trueup.server.fleet.derive` from the
desired revision, the last report (written by ingest.py) and the clock; this
unit reads the facts for it in one query per tenant. Acknowledgements are
written here because they only annotate this view: they expire and never
change what the agent does. Each entry carries the device's labels; a label
selector (`site=ams,role in (edge,core)`) narrows the fleet like the filters.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import and_, select

from trueup.model.jsontypes import JSONObject
from trueup.model.layering import Selector
from trueup.server.confirmation import confirmation_of, confirmations
from trueup.server.drift import drift_history, last_drift
from trueup.server.fleet import DeviceFacts, FleetView, agent_support, derive, filter_problems
from trueup.server.inputs import ACK_REASON, ACK_SECONDS, SUBSYSTEM
from trueup.server.records import (
    Acknowledgement,
    ActiveAck,
    AgentAcknowledgement,
    ConfirmationEntry,
    DeviceView,
    DriftEntry,
    DriftRecord,
    FleetEntry,
    Override,
)
from trueup.server.service.errors import Invalid, NotFound
from trueup.server.service.labelrows import checked_selector, tenant_labels
from trueup.server.service.store import Store, inserted_id
from trueup.server.tables import acks, device_reports, device_state, devices, revisions

__all__ = ["Fleet", "agent_acknowledgements", "drift_entry", "iso_utc"]


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


def drift_entry(record: DriftRecord | None) -> DriftEntry | None:
    """A stored drift record as the API shows it (times as ISO 8601 UTC)."""
    if record is None:
        return None
    return {
        "subsystem": record["subsystem"],
        "since": iso_utc(record["since"]),
        "healed_at": iso_utc(record["healed_at"]),
        "state": record["state"],
        "detected_by": record["detected_by"],
        "paths": record["paths"],
        "changed_by": record["changed_by"],
        "healed_by": record["healed_by"],
        "attribution": record["attribution"],
        "first_reported_at": iso_utc(record["first_reported_at"]),
        "last_reported_at": iso_utc(record["last_reported_at"]),
    }


def _epoch(value: Any) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def agent_acknowledgements(report: JSONObject | None, now: float) -> list[AgentAcknowledgement]:
    """The router's own acknowledgements (`trueup ack`) from its last report.

    One the agent still reports active whose `until` has passed is shown
    `expired` at once: the page does not wait for the agent's next report.
    """
    out = []
    for ack in (report or {}).get("acknowledgements") or []:
        if not isinstance(ack, dict):
            continue
        entry = cast(AgentAcknowledgement, dict(ack))  # as the agent sent it
        until = _epoch(entry.get("until"))
        if entry.get("state", "active") == "active" and until is not None and until <= now:
            entry["state"] = "expired"
            entry["ended_at"] = entry.get("until")
        out.append(entry)
    return out


class Fleet:
    def __init__(self, store: Store, *, stale_intervals: int = 3) -> None:
        self.store = store
        self.stale_intervals = stale_intervals

    def fleet(
        self,
        tenant_id: int,
        device: str | None = None,
        *,
        status: str | None = None,
        reason: str | None = None,
        selector: Selector | str | None = None,
    ) -> list[FleetEntry]:
        """Every device of the tenant (or the one named), with its derived state; only
        those with condition `status` and reason code `reason` when given (an unknown
        value of either is Invalid, naming the valid ones), and whose labels `selector`
        matches (a selector that does not parse is Invalid, naming the position)."""
        problems = filter_problems(status=status, reason=reason)
        if problems:
            raise Invalid(problems)
        if isinstance(selector, str):
            selector = checked_selector(selector)
        entries = self._fleet(tenant_id, device)
        if selector is not None:
            entries = [e for e in entries if selector.matches(e["labels"])]
        if status:
            entries = [e for e in entries if status in e["conditions"]]
        if reason:
            entries = [e for e in entries if reason in e["reason_codes"]]
        return entries

    def device(self, tenant_id: int, device: str) -> DeviceView:
        """One device's fleet entry with its last report (`last_report`) and what its agent
        reported about itself (`agent`: version, supported apiVersions and sections, and
        what of the desired revision it does not support)."""
        entry = self._fleet(tenant_id, device)[0]
        with self.store.db.read() as conn:
            row = self.store.device(conn, tenant_id, device)
            report = conn.execute(
                select(device_state.c.report).where(device_state.c.device_id == row["id"])
            ).scalar_one_or_none()
            desired = conn.execute(
                select(revisions.c.document).where(
                    and_(
                        revisions.c.device_id == row["id"],
                        revisions.c.version == row["desired_version"],
                    )
                )
            ).scalar_one_or_none()
        last_report = json.loads(report) if report else None
        return {
            **entry,
            "last_report": last_report,
            "agent": agent_support(last_report, json.loads(desired) if desired else None),
        }

    def _fleet(self, tenant_id: int, device: str | None = None) -> list[FleetEntry]:
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
            drifts = last_drift(conn, tenant_id)
            confirmed = confirmations(conn, tenant_id)
            labels = tenant_labels(conn, tenant_id, [r["id"] for r in rows] if device else None)
            active_acks: dict[int, list[ActiveAck]] = {}
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
        out: list[FleetEntry] = []
        for row in rows:
            override: Override | None = json.loads(row["override"]) if row["override"] else None
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
                    "labels": labels.get(row["id"], {}),
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
                    # The newest drift record, going on or healed ("healed 2 min ago").
                    "last_drift": drift_entry(drifts.get(row["id"])),
                    # The last revision applied with a confirmation window: pending,
                    # confirmed or rolled-back by the agent itself, and why.
                    "confirmation": confirmed.get(row["id"]),
                }
            )
        return out

    def confirmation_of(self, tenant_id: int, device_id: int) -> ConfirmationEntry | None:
        """The device's latest confirmation as its agent reported it — {version, state
        (pending | confirmed | rolled-back), deadline (epoch), reason, …} — or None; what a
        rollout's gate reads."""
        with self.store.db.read() as conn:
            record = confirmation_of(conn, tenant_id, device_id)
            if record is None:
                return None
            seq = self.store.covered(conn).rolled_back.get((device_id, record["version"]))
        if seq is not None and record["state"] != "rolled-back":
            # The table was changed behind the server's back: the log's word holds.
            record["reason"] = (
                f"the audit log says rolled back (seq={seq}); the stored state "
                f"{record['state']!r} is not the audited one"
            )
            record["state"] = "rolled-back"
        return record

    def last_report(self, tenant_id: int, device: str) -> JSONObject | None:
        """The device's last report, as its agent sent it."""
        with self.store.db.read() as conn:
            row = self.store.device(conn, tenant_id, device)
            report = conn.execute(
                select(device_state.c.report).where(device_state.c.device_id == row["id"])
            ).scalar_one_or_none()
        return json.loads(report) if report else None

    def drift_history(self, tenant_id: int, device: str, limit: int = 50) -> list[DriftEntry]:
        """The device's drift records, newest first: paths, who changed it, who healed it."""
        with self.store.db.read() as conn:
            row = self.store.device(conn, tenant_id, device)
            return [
                entry for r in drift_history(conn, row["id"], limit) if (entry := drift_entry(r))
            ]

    def report_history(self, tenant_id: int, device: str, limit: int) -> list[JSONObject]:
        """The newest `limit` reports, newest first (evidence; never deleted): each as its
        agent sent it, after its `id` and `received_at`."""
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
    ) -> Acknowledgement:
        """Record that an operator accepts a subsystem's state for `seconds`, and why."""
        # The same rules as the API's and the dashboard's (trueup.server.inputs).
        problems = [
            *SUBSYSTEM.problems("subsystem", subsystem),
            *ACK_SECONDS.problems("for_seconds", seconds),
            *ACK_REASON.problems("reason", reason),
        ]
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
