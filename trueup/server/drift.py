"""Drift history: the drift records agents report, stored once each, read per device.

Who calls this: report ingest (`trueup.server.ingest`) writes, in the batch's
transaction, the drift records of each report (`write_drift`); the fleet view
(`trueup.server.service.fleetview`) reads the newest one per device
(`last_drift`) and a device's history (`drift_history`).

An agent repeats its recent drift in every report until it falls out of its
history, so a record is identified by (device, subsystem, since) and upserted:
the first report inserts it, later ones only fill in what changed (it ended,
who healed it, more notifications that explain it). A record that ended stays
ended (a later report cannot reopen it). Each device keeps its newest
`DRIFT_KEEP` records.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, RowMapping, and_, func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from trueup.model.jsontypes import JSONObject
from trueup.server.records import DriftRecord, DriftRow
from trueup.server.tables import device_drift, devices

__all__ = [
    "DRIFT_KEEP",
    "drift_history",
    "drift_rows",
    "end_unreported_drift",
    "last_drift",
    "write_drift",
]

log = logging.getLogger(__name__)

DRIFT_KEEP = 200  # drift records kept per device


def _epoch(value: Any) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def drift_rows(device_id: int, payload: JSONObject, received_at: float) -> list[DriftRow]:
    """The rows of one report's drift history (records without a readable `since` skipped)."""
    rows: dict[tuple[str, float], DriftRow] = {}
    for record in payload.get("drift_history") or []:
        if not isinstance(record, dict):
            continue
        since = _epoch(record.get("since"))
        subsystem = record.get("subsystem")
        if since is None or not isinstance(subsystem, str):
            continue
        healed_by = record.get("healed_by")
        rows[(subsystem, since)] = {
            "device_id": device_id,
            "subsystem": subsystem,
            "since": since,
            "healed_at": _epoch(record.get("healed_at")),
            "detected_by": record.get("detected_by"),
            "paths": json.dumps(record.get("paths") or []),
            "changed_by": json.dumps(record.get("changed_by") or []),
            "healed_by": json.dumps(healed_by, sort_keys=True) if healed_by else None,
            "attribution": json.dumps(record.get("attribution") or [], sort_keys=True),
            "first_reported_at": received_at,
            "last_reported_at": received_at,
        }
    return list(rows.values())


# Who ended a drift record the agent stopped reporting as going on.
UNREPORTED = {
    "by": "trueup",
    "action": "ended",
    "writer": "the agent no longer reports it (an apply, a rollback or an agent restart "
    "replaced it)",
}


def end_unreported_drift(
    conn: Connection, device_id: int, payload: JSONObject, received_at: float
) -> int:
    """End the device's records still going on here that its newest report does not list
    as going on (an agent always reports its ongoing drift): never ongoing forever.

    Returns how many were ended.
    """
    ongoing = {
        (r.get("subsystem"), _epoch(r.get("since")))
        for r in payload.get("drift_history") or []
        if isinstance(r, dict) and not r.get("healed_at")
    }
    current = device_drift.c
    stale = [
        row.id
        for row in conn.execute(
            select(current.id, current.subsystem, current.since).where(
                and_(current.device_id == device_id, current.healed_at.is_(None))
            )
        )
        if (row.subsystem, row.since) not in ongoing
    ]
    if stale:
        conn.execute(
            device_drift.update()
            .where(current.id.in_(stale))
            .values(healed_at=received_at, healed_by=json.dumps(UNREPORTED, sort_keys=True))
        )
    return len(stale)


def write_drift(conn: Connection, rows: list[DriftRow], *, is_sqlite: bool) -> None:
    """Upsert `rows` (`drift_rows`), then keep each device's newest `DRIFT_KEEP`."""
    if not rows:
        return
    insert = sqlite_insert(device_drift) if is_sqlite else pg_insert(device_drift)
    excluded = insert.excluded
    current = device_drift.c
    statement = insert.on_conflict_do_update(
        index_elements=[current.device_id, current.subsystem, current.since],
        set_={
            # Once ended it stays ended; an ongoing record takes the newer facts.
            "healed_at": func.coalesce(current.healed_at, excluded.healed_at),
            "healed_by": func.coalesce(current.healed_by, excluded.healed_by),
            "paths": excluded.paths,
            "changed_by": excluded.changed_by,
            "attribution": excluded.attribution,
            "detected_by": excluded.detected_by,
            "last_reported_at": excluded.last_reported_at,
        },
    )
    # Sorted: two writers touching the same records take their locks in one order.
    rows = sorted(rows, key=lambda r: (r["device_id"], r["subsystem"], r["since"]))
    conn.execute(statement, rows)
    for device_id in sorted({r["device_id"] for r in rows}):
        oldest_kept = (
            select(current.since)
            .where(current.device_id == device_id)
            .order_by(current.since.desc())
            .limit(1)
            .offset(DRIFT_KEEP - 1)
            .scalar_subquery()
        )
        conn.execute(
            device_drift.delete().where(
                and_(current.device_id == device_id, current.since < oldest_kept)
            )
        )


def _record(row: RowMapping) -> DriftRecord:
    healed_by = json.loads(row["healed_by"]) if row["healed_by"] else None
    return {
        "subsystem": row["subsystem"],
        "since": row["since"],
        "healed_at": row["healed_at"],
        "state": "healed" if row["healed_at"] is not None else "ongoing",
        "detected_by": row["detected_by"],
        "paths": json.loads(row["paths"]),
        "changed_by": json.loads(row["changed_by"]),
        "healed_by": healed_by,
        "attribution": json.loads(row["attribution"]),
        "first_reported_at": row["first_reported_at"],
        "last_reported_at": row["last_reported_at"],
    }


def drift_history(conn: Connection, device_id: int, limit: int = 50) -> list[DriftRecord]:
    """One device's drift records, newest first (times as epoch seconds)."""
    rows = conn.execute(
        select(device_drift)
        .where(device_drift.c.device_id == device_id)
        .order_by(device_drift.c.since.desc(), device_drift.c.id.desc())
        .limit(limit)
    ).mappings()
    return [_record(r) for r in rows]


def last_drift(conn: Connection, tenant_id: int) -> dict[int, DriftRecord]:
    """Device id → its newest drift record, for every device of the tenant that has one."""
    newest = (
        select(device_drift.c.device_id, func.max(device_drift.c.since).label("since"))
        .join(devices, devices.c.id == device_drift.c.device_id)
        .where(devices.c.tenant_id == tenant_id)
        .group_by(device_drift.c.device_id)
        .subquery()
    )
    rows = conn.execute(
        select(device_drift)
        .join(
            newest,
            and_(
                newest.c.device_id == device_drift.c.device_id,
                newest.c.since == device_drift.c.since,
            ),
        )
        .order_by(device_drift.c.id)
    ).mappings()
    out: dict[int, DriftRecord] = {}
    for row in rows:
        out[int(row["device_id"])] = _record(row)  # two subsystems at once: the later row
    return out
