"""What every unit of the service shares: the database, the server key, the audit writer.

A unit opens its own transactions (`store.db.read()` / `store.db.write()`) and
appends its audit entry with `store.audit(conn, …)` inside the write it
records. Lookups of tenant-visible names are filtered by tenant here, once:
a name from another tenant is simply not found.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, CursorResult, RowMapping, and_, select

from trueup.server import audit
from trueup.server.db import Database
from trueup.server.keys import ServerKey
from trueup.server.service.errors import NotFound
from trueup.server.tables import devices, tenants

__all__ = ["Store", "inserted_id"]


def inserted_id(result: CursorResult[Any]) -> int:
    """The primary key of the row a single-row INSERT made."""
    key = result.inserted_primary_key
    assert key is not None, "not a single-row INSERT"
    return int(key[0])


@dataclass(frozen=True)
class Store:
    db: Database
    key: ServerKey

    def audit(
        self,
        conn: Connection,
        *,
        tenant_id: int | None,
        actor: str,
        action: str,
        target: str,
        detail: dict[str, Any] | None = None,
        at: float | None = None,
    ) -> int:
        """Append an audit entry inside the caller's write transaction."""
        return audit.append(
            conn,
            self.key,
            tenant_id=tenant_id,
            actor=actor,
            action=action,
            target=target,
            detail=detail,
            at=at,
        )

    def tenant_id(self, conn: Connection, tenant: str) -> int:
        row = conn.execute(select(tenants.c.id).where(tenants.c.name == tenant)).one_or_none()
        if row is None:
            raise NotFound(f"tenant {tenant!r} does not exist")
        return int(row.id)

    def device(self, conn: Connection, tenant_id: int, device: str) -> RowMapping:
        """The device's row in this tenant. Raises NotFound."""
        row = (
            conn.execute(
                select(devices).where(
                    and_(devices.c.tenant_id == tenant_id, devices.c.name == device)
                )
            )
            .mappings()
            .one_or_none()
        )
        if row is None:
            raise NotFound(f"device {device!r} not found")
        return row
