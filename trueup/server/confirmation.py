"""Each device's confirm-or-rollback, as its agent reports it: stored latest per device.

Who calls this: report ingest (`trueup.server.ingest`) writes, in the batch's
transaction, the `confirmation` record of each device's latest report
(`confirmation_row`, `write_confirmations`); the fleet view and the rollout
controller read it (`confirmations`, `confirmation_of`).

An agent applies a revision delivered with a confirmation window, confirms it
itself once its own health holds (the apply verified, management ready, the
control plane reached again) or rolls it back when the window passes. Its
reports carry {version, state: pending|confirmed|rolled-back, deadline,
reason}. A report that first says a version was rolled back is handed to
`on_rolled_back` (ingest audits it as `revision.rolled_back`), once: later
reports repeating it only refresh `reported_at`. A record naming an older version
than the stored one, or turning a rolled-back version into pending or confirmed,
is not stored: versions only grow, and the audited rollback stands.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Literal

from sqlalchemy import Connection, RowMapping, and_, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from trueup.model.jsontypes import JSONObject
from trueup.server.records import ConfirmationEntry, ConfirmationRow, ConfirmationState
from trueup.server.tables import device_confirmation, devices, tenants

__all__ = [
    "STATES",
    "confirmation_of",
    "confirmation_row",
    "confirmations",
    "write_confirmations",
]

STATES = tuple(state.value for state in ConfirmationState)
REASON_LENGTH = 1000

# (connection, tenant id, tenant name, device name, the stored row) for a new rollback.
RolledBack = Callable[[Connection, int, str, str, ConfirmationRow], None]


def confirmation_row(
    device_id: int, payload: JSONObject, received_at: float
) -> ConfirmationRow | None:
    """The row of one report's `confirmation`, or None when it carries none."""
    record = payload.get("confirmation")
    if not isinstance(record, dict) or record.get("state") not in STATES:
        return None
    deadline = record.get("deadline")
    return {
        "device_id": device_id,
        "version": _int(record.get("version")),
        "state": record["state"],
        "deadline": float(deadline) if isinstance(deadline, int | float) else None,
        "reason": str(record.get("reason") or "")[:REASON_LENGTH],
        "rollback_to": _int(record.get("rollback_to")),
        "rolled_back_to_version": _int(record.get("rolled_back_to_version")),
        "since": received_at,
        "reported_at": received_at,
    }


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def write_confirmations(
    conn: Connection,
    rows: list[ConfirmationRow],
    *,
    is_sqlite: bool,
    on_rolled_back: RolledBack | None = None,
) -> None:
    """Store each device's latest confirmation; `on_rolled_back` for each new rollback."""
    if not rows:
        return
    ids = sorted({row["device_id"] for row in rows})
    before: dict[int, ConfirmationRow] = {
        int(r["device_id"]): _stored(r)
        for r in conn.execute(
            select(device_confirmation).where(device_confirmation.c.device_id.in_(ids))
        ).mappings()
    }
    # In arrival order: a rollback followed in the same batch by a newer record is seen.
    new_rollbacks: list[ConfirmationRow] = []
    latest: dict[int, ConfirmationRow] = {}
    for row in rows:
        earlier = latest.get(row["device_id"]) or before.get(row["device_id"])
        if earlier is not None and _goes_back(earlier, row):
            continue  # versions only grow, and a rollback is not undone by a later word
        if (
            earlier is not None
            and earlier["version"] == row["version"]
            and earlier["state"] == row["state"]
        ):
            row["since"] = earlier["since"]
        elif row["state"] == "rolled-back":
            new_rollbacks.append(row)
        latest[row["device_id"]] = row
    # Every heartbeat repeats the record: only what changed is written.
    changed = [
        latest[device_id]
        for device_id in sorted(latest)
        if _changed(before.get(device_id), latest[device_id])
    ]
    if changed:
        _upsert(conn, changed, is_sqlite=is_sqlite)
    if on_rolled_back is None or not new_rollbacks:
        return
    names = {
        int(r.id): (int(r.tenant_id), str(r.tenant), str(r.name))
        for r in conn.execute(
            select(
                devices.c.id, devices.c.tenant_id, tenants.c.name.label("tenant"), devices.c.name
            )
            .join(tenants, tenants.c.id == devices.c.tenant_id)
            .where(devices.c.id.in_(sorted({r["device_id"] for r in new_rollbacks})))
        )
    }
    for row in new_rollbacks:
        on_rolled_back(conn, *names[row["device_id"]], row)


_Column = Literal["version", "state", "deadline", "reason", "rollback_to", "rolled_back_to_version"]
_COLUMNS: tuple[_Column, ...] = (
    "version",
    "state",
    "deadline",
    "reason",
    "rollback_to",
    "rolled_back_to_version",
)


def _goes_back(earlier: ConfirmationRow, row: ConfirmationRow) -> bool:
    """`row` names an older version than `earlier`, or says a version `earlier` records as
    rolled back is pending or confirmed: not believed (the log audited the rollback)."""
    old, new = earlier["version"], row["version"]
    if old is None or new is None:
        return False
    if new < old:
        return True
    return bool(new == old and earlier["state"] == "rolled-back" and row["state"] != "rolled-back")


def _changed(stored: ConfirmationRow | None, row: ConfirmationRow) -> bool:
    return stored is None or any(stored[name] != row[name] for name in _COLUMNS)


def _upsert(conn: Connection, rows: list[ConfirmationRow], *, is_sqlite: bool) -> None:
    insert = sqlite_insert(device_confirmation) if is_sqlite else pg_insert(device_confirmation)
    excluded = insert.excluded
    conn.execute(
        insert.on_conflict_do_update(
            index_elements=[device_confirmation.c.device_id],
            set_={name: getattr(excluded, name) for name in (*_COLUMNS, "since", "reported_at")},
        ),
        rows,
    )


def _stored(row: RowMapping) -> ConfirmationRow:
    return {
        "device_id": row["device_id"],
        "version": row["version"],
        "state": row["state"],
        "deadline": row["deadline"],
        "reason": row["reason"],
        "rollback_to": row["rollback_to"],
        "rolled_back_to_version": row["rolled_back_to_version"],
        "since": row["since"],
        "reported_at": row["reported_at"],
    }


def _entry(row: RowMapping) -> ConfirmationEntry:
    return {
        "version": row["version"],
        "state": row["state"],
        "deadline": row["deadline"],
        "deadline_at": _iso(row["deadline"]),
        "reason": row["reason"],
        "rollback_to": row["rollback_to"],
        "rolled_back_to_version": row["rolled_back_to_version"],
        "since": _iso(row["since"]),
        "reported_at": _iso(row["reported_at"]),
    }


def _iso(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def confirmations(conn: Connection, tenant_id: int) -> dict[int, ConfirmationEntry]:
    """Device id → its latest confirmation, for every device of the tenant that has one."""
    query = (
        select(device_confirmation)
        .join(devices, devices.c.id == device_confirmation.c.device_id)
        .where(devices.c.tenant_id == tenant_id)
    )
    return {int(r["device_id"]): _entry(r) for r in conn.execute(query).mappings()}


def confirmation_of(conn: Connection, tenant_id: int, device_id: int) -> ConfirmationEntry | None:
    """The device's latest confirmation ({version, state, deadline, reason, …}) or None."""
    row = (
        conn.execute(
            select(device_confirmation)
            .join(devices, devices.c.id == device_confirmation.c.device_id)
            .where(and_(devices.c.tenant_id == tenant_id, devices.c.id == device_id))
        )
        .mappings()
        .one_or_none()
    )
    return _entry(row) if row is not None else None
