"""Who exists: tenants, users and their roles, user tokens.

Every write is audited in its own transaction. A role change or a token
revocation also tells the authenticator (`credentials_changed`) so this
process forgets cached principals at once; other processes notice through the
audit head within `auth_cache_seconds` (see auth.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy import Connection, RowMapping, and_, select, update
from sqlalchemy.exc import IntegrityError

from trueup.server.keys import new_data_key
from trueup.server.service.errors import Invalid, NotFound, check_name
from trueup.server.service.records import TokenEntry, UserEntry
from trueup.server.service.store import Store, inserted_id
from trueup.server.tables import devices, tenants, tokens, users
from trueup.server.tokens import Role, TokenKind, hash_token, new_token

__all__ = ["Identity"]


class Identity:
    def __init__(self, store: Store, credentials_changed: Callable[[], None]) -> None:
        self.store = store
        self._credentials_changed = credentials_changed

    def tenant_id(self, tenant: str) -> int:
        with self.store.db.read() as conn:
            return self.store.tenant_id(conn, tenant)

    def create_tenant(self, name: str, actor: str) -> int:
        """A tenant with its own data key (wrapped by the server key)."""
        check_name("tenant", name)
        try:
            with self.store.write() as conn:
                tenant_id = inserted_id(
                    conn.execute(tenants.insert().values(name=name, created_at=time.time()))
                )
                wrapped = self.store.key.wrap_tenant_key(tenant_id, new_data_key())
                conn.execute(
                    update(tenants)
                    .where(tenants.c.id == tenant_id)
                    .values(data_key_wrapped=wrapped)
                )
                self.store.audit(
                    conn,
                    tenant_id=tenant_id,
                    actor=actor,
                    action="tenant.create",
                    target=f"tenant:{name}",
                )
                return tenant_id
        except IntegrityError:
            raise Invalid([f"tenant: {name!r} already exists"]) from None

    # -- users and roles -------------------------------------------------------------------

    def _user(self, conn: Connection, tenant_id: int, user: str) -> RowMapping:
        row = (
            conn.execute(
                select(users).where(and_(users.c.tenant_id == tenant_id, users.c.name == user))
            )
            .mappings()
            .one_or_none()
        )
        if row is None:
            raise NotFound(f"user {user!r} not found")
        return row

    def create_user(self, tenant_id: int, name: str, role: Role, actor: str) -> int:
        check_name("user", name)
        try:
            with self.store.write() as conn:
                user_id = inserted_id(
                    conn.execute(
                        users.insert().values(
                            tenant_id=tenant_id, name=name, role=role.value, created_at=time.time()
                        )
                    )
                )
                self.store.seal_user(conn, user_id)
                self.store.audit(
                    conn,
                    tenant_id=tenant_id,
                    actor=actor,
                    action="user.create",
                    target=f"user:{name}",
                    detail={"user_id": user_id, "role": role.value},
                )
                return user_id
        except IntegrityError:
            raise Invalid([f"user: {name!r} already exists"]) from None

    def set_role(self, tenant_id: int, name: str, role: Role, actor: str) -> None:
        with self.store.write() as conn:
            user = self._user(conn, tenant_id, name)
            conn.execute(update(users).where(users.c.id == user["id"]).values(role=role.value))
            self.store.seal_user(conn, user["id"])
            self.store.audit(
                conn,
                tenant_id=tenant_id,
                actor=actor,
                action="user.role",
                target=f"user:{name}",
                detail={"user_id": user["id"], "role": role.value, "previous": user["role"]},
            )
        self._credentials_changed()

    def list_users(self, tenant_id: int) -> list[UserEntry]:
        with self.store.db.read() as conn:
            rows = conn.execute(
                select(users.c.name, users.c.role, users.c.created_at)
                .where(users.c.tenant_id == tenant_id)
                .order_by(users.c.name)
            ).mappings()
            return [
                {"name": r["name"], "role": r["role"], "created_at": r["created_at"]} for r in rows
            ]

    # -- user tokens -----------------------------------------------------------------------

    def create_token(
        self, tenant_id: int, user: str, actor: str, label: str = ""
    ) -> tuple[int, str]:
        """(token id, token): the token is shown this once; only its hash is stored."""
        token = new_token(TokenKind.USER)
        token_hash = hash_token(token)
        with self.store.write() as conn:
            row = self._user(conn, tenant_id, user)
            token_id = self.store.insert_token(
                conn,
                tenant_id=tenant_id,
                kind=TokenKind.USER.value,
                user_id=row["id"],
                token_hash=token_hash,
                label=label,
                created_at=time.time(),
            )
            self.store.audit(
                conn,
                tenant_id=tenant_id,
                actor=actor,
                action="token.create",
                target=f"user:{user}",
                detail={
                    "token_id": token_id,
                    "label": label,
                    "kind": TokenKind.USER.value,
                    "user_id": row["id"],
                    "token_hash": token_hash,
                },
            )
        return token_id, token

    def revoke_token(self, tenant_id: int, token_id: int, actor: str) -> None:
        """Revoke any token of this tenant (user, device credential or enrollment)."""
        with self.store.write() as conn:
            result = conn.execute(
                update(tokens)
                .where(
                    and_(
                        tokens.c.id == token_id,
                        tokens.c.tenant_id == tenant_id,
                        tokens.c.revoked_at.is_(None),
                    )
                )
                .values(revoked_at=time.time())
            )
            if result.rowcount != 1:
                raise NotFound(f"token {token_id} not found (or already revoked)")
            self.store.audit(
                conn,
                tenant_id=tenant_id,
                actor=actor,
                action="token.revoke",
                target=f"token:{token_id}",
                detail={"token_id": token_id},
            )
        self._credentials_changed()

    def list_tokens(self, tenant_id: int) -> list[TokenEntry]:
        """Every token of the tenant, without hashes."""
        with self.store.db.read() as conn:
            rows = conn.execute(
                select(
                    tokens.c.id,
                    tokens.c.kind,
                    tokens.c.label,
                    tokens.c.created_at,
                    tokens.c.revoked_at,
                    users.c.name.label("user"),
                    devices.c.name.label("device"),
                )
                .outerjoin(users, users.c.id == tokens.c.user_id)
                .outerjoin(devices, devices.c.id == tokens.c.device_id)
                .where(tokens.c.tenant_id == tenant_id)
                .order_by(tokens.c.id)
            ).mappings()
            return [
                {
                    "id": r["id"],
                    "kind": r["kind"],
                    "label": r["label"],
                    "created_at": r["created_at"],
                    "revoked_at": r["revoked_at"],
                    "user": r["user"],
                    "device": r["device"],
                }
                for r in rows
            ]
