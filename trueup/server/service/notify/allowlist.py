"""A tenant's allowlist of internal webhook receivers: set by an admin, audited, shown.

The target policy (policy.py) refuses internal addresses by default; the
allowlist names the networks (CIDRs) and host names a tenant's targets may
reach anyway. Setting it replaces the whole list and writes a
`notify.allowlist.set` audit entry with the new and the previous list. A stored
list that no longer parses (an edited row) counts as empty: it fails closed.
"""

from __future__ import annotations

import json
import time
from typing import Any

from sqlalchemy import Connection, select

from trueup.server.service.errors import Invalid
from trueup.server.service.notify.audited import ALLOWLIST_AUDITED_FIELDS, audited
from trueup.server.service.notify.events import iso
from trueup.server.service.notify.policy import Allowlist
from trueup.server.service.notify.records import AllowlistView
from trueup.server.service.store import Store
from trueup.server.tables import notify_allowlists, tenants

__all__ = ["Allowlists", "load_allowlist"]


def _stored(conn: Connection, tenant_id: int) -> Any:
    return (
        conn.execute(select(notify_allowlists).where(notify_allowlists.c.tenant_id == tenant_id))
        .mappings()
        .one_or_none()
    )


def load_allowlist(conn: Connection, tenant_id: int) -> Allowlist:
    row = _stored(conn, tenant_id)
    if row is None:
        return Allowlist()
    try:
        entries = json.loads(row["entries"])
        if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
            return Allowlist()
        return Allowlist.parse(entries)
    except (ValueError, Invalid):
        return Allowlist()


class Allowlists:
    def __init__(self, store: Store) -> None:
        self.store = store

    def allowlist(self, tenant_id: int) -> AllowlistView:
        with self.store.db.read() as conn:
            row = _stored(conn, tenant_id)
            entries = load_allowlist(conn, tenant_id).entries()
        return {"entries": entries, "updated_at": iso(row["updated_at"]) if row else None}

    def set_allowlist(self, tenant_id: int, entries: list[str], actor: str) -> AllowlistView:
        """Replace the tenant's allowlist (an empty list: none). Raises Invalid per entry."""
        canonical = Allowlist.parse(entries).entries()
        now = time.time()
        with self.store.write() as conn:
            # One writer per tenant's list (PostgreSQL; SQLite serialises writes anyway).
            conn.execute(select(tenants.c.id).where(tenants.c.id == tenant_id).with_for_update())
            previous = load_allowlist(conn, tenant_id).entries()
            values = {"entries": json.dumps(canonical), "updated_at": now}
            if _stored(conn, tenant_id) is None:
                conn.execute(notify_allowlists.insert().values(tenant_id=tenant_id, **values))
            else:
                conn.execute(
                    notify_allowlists.update()
                    .where(notify_allowlists.c.tenant_id == tenant_id)
                    .values(values)
                )
            self.store.audit(
                conn,
                tenant_id=tenant_id,
                actor=actor,
                action="notify.allowlist.set",
                target="notify-allowlist",
                detail={
                    **audited({"entries": canonical}, ALLOWLIST_AUDITED_FIELDS),
                    "previous": previous,
                },
            )
        return {"entries": canonical, "updated_at": iso(now)}
