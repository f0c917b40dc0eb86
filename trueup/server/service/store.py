"""What every unit of the service shares: the database, the server key, the audit writer.

A unit opens its own transactions (`store.db.read()` / `store.write()`) and
appends its audit entry with `store.audit(conn, …)` inside the write it
records. `store.write()` advances the audit checkpoint (the chain's anchor
outside the database, audit.py) once the transaction has committed. Lookups of tenant-visible names are filtered by tenant here, once:
a name from another tenant is simply not found.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, CursorResult, RowMapping, and_, select, update

from trueup.server import audit, chainproof, coverage
from trueup.server.db import Database
from trueup.server.keys import ServerKey
from trueup.server.service.errors import NotFound
from trueup.server.tables import devices, tenants, tokens, users

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
    # Set once this process has sealed the token and user rows of an older trueup.
    _sealed: threading.Event = field(default_factory=threading.Event, compare=False, repr=False)
    # Revocations, roles and chain breaks as the verified audit log has them
    # (authentication consults it).
    _credentials: chainproof.CredentialProof = field(
        default_factory=chainproof.CredentialProof, compare=False, repr=False
    )
    # Secret versions and evidence digests as the audit log has them (the read paths ask).
    _coverage: coverage.CoverLog = field(
        default_factory=coverage.CoverLog, compare=False, repr=False
    )

    @contextmanager
    def write(self) -> Iterator[Connection]:
        """A write transaction; after it commits, the audit checkpoint moves to the new head.

        The checkpoint is written after the commit, never before, so it is never
        ahead of the database; a failure to write it is logged, not raised.
        """
        with self.db.write() as conn:
            yield conn
        with self.db.read() as conn:
            audit.advance_checkpoint(conn, self.key)

    def ensure_sealed(self) -> None:
        """Once per process: seal token and user rows written before seals existed, if the
        audit log vouches for them (audit.seal_unsealed). Call outside a transaction."""
        if self._sealed.is_set():
            return
        with self.write() as conn:
            audit.seal_unsealed(conn, self.key, actor="server:seal")
        self._sealed.set()

    def token_seal_ok(self, row: Any) -> bool:
        """Does this token row carry its own seal (id, tenant, kind, user, device, hash, expiry)?"""
        return audit.token_seal_ok(self.key, row)

    def user_seal_ok(self, row: Any) -> bool:
        """Does this user row carry its own seal (id, tenant, name, role)?"""
        return audit.user_seal_ok(self.key, row)

    def credential_refusal(
        self, conn: Connection, token_id: int, user_id: int | None = None, role: str | None = None
    ) -> str | None:
        """Why the verified audit log refuses this token: it revoked it; the user's role is
        not the last audited one (a row put back to an earlier, sealed state); no verified
        record issues it; or the chain is broken after it was issued (or after the user's
        role was recorded), so the log can no longer vouch for it. None when it does not."""
        self._credentials.refresh(conn, self.key)
        return self._credentials.refusal(token_id, user_id, role)

    def covered(self, conn: Connection) -> coverage.CoverFacts:
        """What the audit log vouches for (secret versions, evidence digests), up to date."""
        return self._coverage.refresh(conn, lambda row: audit.row_hash_ok(self.key, row))

    def audit_break_after(self, seq: int) -> int | None:
        """The first seq after `seq` where the audit chain does not hold together (call
        `covered` first); None when it holds."""
        return self._coverage.break_after(seq)

    def anchor_problems(self, conn: Connection) -> list[audit.AuditProblem]:
        """Why the stored audit chain contradicts its checkpoint (rewound); [] when it does not."""
        return [p for p in audit.anchor_problems(conn, self.key) if not p.gap]

    def audit(
        self,
        conn: Connection,
        *,
        tenant_id: int | None,
        actor: str,
        action: str,
        target: str,
        detail: Mapping[str, object] | None = None,
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

    def insert_token(
        self,
        conn: Connection,
        *,
        tenant_id: int,
        kind: str,
        token_hash: str,
        label: str,
        created_at: float,
        user_id: int | None = None,
        device_id: int | None = None,
        expires_at: float | None = None,
    ) -> int:
        """Insert a token row with its seal (authentication refuses rows without one)."""
        token_id = inserted_id(
            conn.execute(
                tokens.insert().values(
                    tenant_id=tenant_id,
                    kind=kind,
                    user_id=user_id,
                    device_id=device_id,
                    token_hash=token_hash,
                    label=label,
                    created_at=created_at,
                    expires_at=expires_at,
                )
            )
        )
        seal = audit.token_seal(
            self.key,
            token_id=token_id,
            tenant_id=tenant_id,
            kind=kind,
            user_id=user_id,
            device_id=device_id,
            token_hash=token_hash,
            expires_at=expires_at,
        )
        conn.execute(update(tokens).where(tokens.c.id == token_id).values(seal=seal))
        return token_id

    def seal_user(self, conn: Connection, user_id: int) -> None:
        """(Re)compute a user row's seal after the server wrote it."""
        row = conn.execute(select(users).where(users.c.id == user_id)).mappings().one()
        seal = audit.user_seal(
            self.key,
            user_id=user_id,
            tenant_id=row["tenant_id"],
            name=row["name"],
            role=row["role"],
        )
        conn.execute(update(users).where(users.c.id == user_id).values(seal=seal))

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
