"""Every control-plane operation, shared by the HTTP API and the `trueup server` CLI.

Each write runs in one transaction together with its audit entry. Every query
that takes a tenant-visible name (device, user, token) is filtered by the
caller's tenant; a name from another tenant is simply not found.

Errors::

    ServiceError
    ├── NotFound        the named thing does not exist in this tenant
    ├── Invalid         bad input; `problems` names each path
    ├── Conflict        If-Match was stale (STATE_CONCURRENT_MODIFICATION)
    └── Unauthorized    a token that is unknown, revoked, expired or used
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, RowMapping, and_, func, select, update
from sqlalchemy.exc import IntegrityError

from trueup.model.document import DocumentError, document_digest, parse_document
from trueup.model.reasons import CORRECTIVE_ACTIONS, ReasonCode
from trueup.server import audit
from trueup.server.db import Database
from trueup.server.fleet import DeviceFacts, FleetView, derive
from trueup.server.keys import SecretBox, SecretRefused, ServerKey, new_data_key
from trueup.server.tables import (
    acks,
    audit_head,
    audit_log,
    device_reports,
    device_state,
    devices,
    revisions,
    secrets,
    tenants,
    tokens,
    users,
)
from trueup.server.tokens import Role, TokenKind, hash_token, new_token, tokens_equal

__all__ = [
    "Conflict",
    "ControlPlane",
    "Invalid",
    "NotFound",
    "Principal",
    "Revision",
    "ServiceError",
    "Unauthorized",
]

ENROLLMENT_LIFETIME = 24 * 3600.0
_NAME_PATTERN = "letters, digits, '_', '.', '-' (1-200 characters, starting with a letter or digit)"


class ServiceError(Exception):
    pass


class NotFound(ServiceError):
    pass


class Invalid(ServiceError):
    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("; ".join(problems))


class Conflict(ServiceError):
    def __init__(self, device: str, expected: int, current: int) -> None:
        self.device = device
        self.expected = expected
        self.current = current
        super().__init__(
            f"{ReasonCode.CONCURRENT_MODIFICATION}: device {device} is at version {current}, "
            f"not {expected}; nothing was changed"
        )

    def body(self) -> dict[str, Any]:
        return {
            "reason": ReasonCode.CONCURRENT_MODIFICATION.value,
            "detail": str(self),
            "device": self.device,
            "expected_version": self.expected,
            "current_version": self.current,
            "action": CORRECTIVE_ACTIONS[ReasonCode.CONCURRENT_MODIFICATION],
        }


class Unauthorized(ServiceError):
    pass


@dataclass(frozen=True)
class Principal:
    """Who is calling: a user (with a role) or a device (its own credential)."""

    tenant_id: int
    tenant: str
    kind: TokenKind
    token_id: int
    role: Role | None = None
    user_id: int | None = None
    user: str | None = None
    device_id: int | None = None
    device: str | None = None

    @property
    def actor(self) -> str:
        if self.kind == TokenKind.USER:
            return f"user:{self.tenant}/{self.user}"
        return f"device:{self.tenant}/{self.device}"


@dataclass(frozen=True)
class Revision:
    device: str
    version: int
    parent_version: int | None
    author: str
    comment: str
    content_hash: str
    created_at: float
    document: dict[str, Any]

    def summary(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "version": self.version,
            "parent_version": self.parent_version,
            "author": self.author,
            "comment": self.comment,
            "content_hash": self.content_hash,
            "created_at": self.created_at,
        }


def _check_name(kind: str, value: str) -> None:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,199}", value or ""):
        raise Invalid([f"{kind}: {value!r} is not a valid name ({_NAME_PATTERN})"])


def _revision(device: str, row: RowMapping) -> Revision:
    return Revision(
        device=device,
        version=row["version"],
        parent_version=row["parent_version"],
        author=row["author"],
        comment=row["comment"],
        content_hash=row["content_hash"],
        created_at=row["created_at"],
        document=json.loads(row["document"]),
    )


class ControlPlane:
    """The control plane's operations over one database and one server key."""

    def __init__(
        self,
        database: Database,
        server_key: ServerKey,
        *,
        stale_intervals: int = 3,
        auth_cache_seconds: float = 2.0,
    ) -> None:
        self.db = database
        self.key = server_key
        self.stale_intervals = stale_intervals
        self.auth_cache_seconds = auth_cache_seconds
        # token hash -> (hard expiry, audit generation, principal)
        self._auth_cache: dict[str, tuple[float, int, Principal]] = {}
        self._auth_lock = threading.Lock()
        self._generation_lock = threading.Lock()
        self._generation = -1
        self._generation_checked = float("-inf")

    # -- lookups ---------------------------------------------------------------------------

    def _tenant_id(self, conn: Connection, tenant: str) -> int:
        row = conn.execute(select(tenants.c.id).where(tenants.c.name == tenant)).one_or_none()
        if row is None:
            raise NotFound(f"tenant {tenant!r} does not exist")
        return int(row.id)

    def tenant_id(self, tenant: str) -> int:
        with self.db.read() as conn:
            return self._tenant_id(conn, tenant)

    def _device(self, conn: Connection, tenant_id: int, device: str) -> RowMapping:
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

    def _box(self, conn: Connection, tenant_id: int) -> SecretBox:
        wrapped = conn.execute(
            select(tenants.c.data_key_wrapped).where(tenants.c.id == tenant_id)
        ).scalar_one()
        return SecretBox(tenant_id, self.key.unwrap_tenant_key(tenant_id, wrapped))

    # -- tenants, users, tokens ------------------------------------------------------------

    def create_tenant(self, name: str, actor: str) -> int:
        _check_name("tenant", name)
        try:
            with self.db.write() as conn:
                tenant_id = int(
                    conn.execute(
                        tenants.insert().values(name=name, created_at=time.time())
                    ).inserted_primary_key[0]  # type: ignore[index]
                )
                wrapped = self.key.wrap_tenant_key(tenant_id, new_data_key())
                conn.execute(
                    update(tenants)
                    .where(tenants.c.id == tenant_id)
                    .values(data_key_wrapped=wrapped)
                )
                audit.append(
                    conn,
                    self.key,
                    tenant_id=tenant_id,
                    actor=actor,
                    action="tenant.create",
                    target=f"tenant:{name}",
                )
                return tenant_id
        except IntegrityError:
            raise Invalid([f"tenant: {name!r} already exists"]) from None

    def create_user(self, tenant_id: int, name: str, role: Role, actor: str) -> int:
        _check_name("user", name)
        try:
            with self.db.write() as conn:
                user_id = int(
                    conn.execute(
                        users.insert().values(
                            tenant_id=tenant_id, name=name, role=role.value, created_at=time.time()
                        )
                    ).inserted_primary_key[0]  # type: ignore[index]
                )
                audit.append(
                    conn,
                    self.key,
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
        with self.db.write() as conn:
            user = self._user(conn, tenant_id, name)
            conn.execute(update(users).where(users.c.id == user["id"]).values(role=role.value))
            audit.append(
                conn,
                self.key,
                tenant_id=tenant_id,
                actor=actor,
                action="user.role",
                target=f"user:{name}",
                detail={"user_id": user["id"], "role": role.value, "previous": user["role"]},
            )
        self._forget_cached()

    def list_users(self, tenant_id: int) -> list[dict[str, Any]]:
        with self.db.read() as conn:
            rows = conn.execute(
                select(users.c.name, users.c.role, users.c.created_at)
                .where(users.c.tenant_id == tenant_id)
                .order_by(users.c.name)
            ).mappings()
            return [dict(r) for r in rows]

    def create_token(
        self, tenant_id: int, user: str, actor: str, label: str = ""
    ) -> tuple[int, str]:
        token = new_token(TokenKind.USER)
        with self.db.write() as conn:
            row = self._user(conn, tenant_id, user)
            token_id = int(
                conn.execute(
                    tokens.insert().values(
                        tenant_id=tenant_id,
                        kind=TokenKind.USER.value,
                        user_id=row["id"],
                        token_hash=hash_token(token),
                        label=label,
                        created_at=time.time(),
                    )
                ).inserted_primary_key[0]  # type: ignore[index]
            )
            audit.append(
                conn,
                self.key,
                tenant_id=tenant_id,
                actor=actor,
                action="token.create",
                target=f"user:{user}",
                detail={"token_id": token_id, "label": label},
            )
        return token_id, token

    def revoke_token(self, tenant_id: int, token_id: int, actor: str) -> None:
        with self.db.write() as conn:
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
            audit.append(
                conn,
                self.key,
                tenant_id=tenant_id,
                actor=actor,
                action="token.revoke",
                target=f"token:{token_id}",
            )
        self._forget_cached()

    def list_tokens(self, tenant_id: int) -> list[dict[str, Any]]:
        with self.db.read() as conn:
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
            return [dict(r) for r in rows]

    # -- authentication ----------------------------------------------------------------------

    def _forget_cached(self) -> None:
        with self._auth_lock:
            self._auth_cache.clear()

    # A cached principal stays valid while nothing that could change it was written:
    # every token revocation, enrollment and role change appends to the audit log, so
    # the audit head's sequence number is the cache's generation. Each process reads
    # it at most once per `auth_cache_seconds` (one tiny query), so a revocation made
    # by any process takes effect everywhere within that time, and the number of
    # authentication queries does not grow with the fleet.
    _HARD_EXPIRY_SECONDS = 300.0

    def _refresh_generation(self, now: float) -> int:
        with self._generation_lock:
            if now - self._generation_checked < self.auth_cache_seconds:
                return self._generation
            with self.db.read() as conn:
                row = conn.execute(
                    select(audit_head.c.seq).where(audit_head.c.id == 1)
                ).one_or_none()
            generation = int(row.seq) if row is not None else 0
            if generation != self._generation:
                with self._auth_lock:
                    self._auth_cache.clear()
                self._generation = generation
            self._generation_checked = now
            return generation

    def cached_principal(self, token: str) -> Principal | None:
        """The principal if this token was authenticated and nothing was revoked since.

        Never touches the database (it runs on the event loop); when the
        generation is due for a check, it answers None and `authenticate` checks.
        """
        if self.auth_cache_seconds <= 0:
            return None
        now = time.monotonic()
        if now - self._generation_checked >= self.auth_cache_seconds:
            return None
        cached = self._auth_cache.get(hash_token(token))
        if cached is not None and cached[0] > now and cached[1] == self._generation:
            return cached[2]
        return None

    def authenticate(self, token: str) -> Principal:
        """The principal behind a user or device token. Raises Unauthorized."""
        now = time.monotonic()
        token_hash = hash_token(token)
        generation = 0
        if self.auth_cache_seconds > 0:
            generation = self._refresh_generation(now)
            with self._auth_lock:
                cached = self._auth_cache.get(token_hash)
            if cached is not None and cached[0] > now and cached[1] == generation:
                return cached[2]
        with self.db.read() as conn:
            row = (
                conn.execute(
                    select(
                        tokens.c.id,
                        tokens.c.kind,
                        tokens.c.token_hash,
                        tokens.c.tenant_id,
                        tokens.c.expires_at,
                        tenants.c.name.label("tenant"),
                        users.c.id.label("user_id"),
                        users.c.name.label("user"),
                        users.c.role,
                        devices.c.id.label("device_id"),
                        devices.c.name.label("device"),
                    )
                    .join(tenants, tenants.c.id == tokens.c.tenant_id)
                    .outerjoin(users, users.c.id == tokens.c.user_id)
                    .outerjoin(devices, devices.c.id == tokens.c.device_id)
                    .where(
                        and_(
                            tokens.c.token_hash == token_hash,
                            tokens.c.revoked_at.is_(None),
                            tokens.c.kind != TokenKind.ENROLLMENT.value,
                        )
                    )
                )
                .mappings()
                .one_or_none()
            )
        if row is None or not tokens_equal(row["token_hash"], token):
            raise Unauthorized("unknown or revoked token")
        if row["expires_at"] is not None and row["expires_at"] < time.time():
            raise Unauthorized("token expired")
        principal = Principal(
            tenant_id=row["tenant_id"],
            tenant=row["tenant"],
            kind=TokenKind(row["kind"]),
            token_id=row["id"],
            role=Role(row["role"]) if row["role"] else None,
            user_id=row["user_id"],
            user=row["user"],
            device_id=row["device_id"],
            device=row["device"],
        )
        if self.auth_cache_seconds > 0:
            expiry = now + self._HARD_EXPIRY_SECONDS
            if row["expires_at"] is not None:
                expiry = min(expiry, now + (row["expires_at"] - time.time()))
            with self._auth_lock:
                if len(self._auth_cache) > 200_000:
                    self._auth_cache.clear()
                self._auth_cache[token_hash] = (expiry, generation, principal)
        return principal

    # -- devices and enrollment ----------------------------------------------------------------

    def _create_device(self, conn: Connection, tenant_id: int, name: str, actor: str) -> int:
        device_id = int(
            conn.execute(
                devices.insert().values(tenant_id=tenant_id, name=name, created_at=time.time())
            ).inserted_primary_key[0]  # type: ignore[index]
        )
        audit.append(
            conn,
            self.key,
            tenant_id=tenant_id,
            actor=actor,
            action="device.create",
            target=f"device:{name}",
            detail={"device_id": device_id},
        )
        return device_id

    def create_device(self, tenant_id: int, name: str, actor: str) -> int:
        problems = _device_name_problems(name)
        if problems:
            raise Invalid(problems)
        try:
            with self.db.write() as conn:
                return self._create_device(conn, tenant_id, name, actor)
        except IntegrityError:
            raise Invalid([f"name: device {name!r} already exists"]) from None

    def enroll(
        self,
        tenant_id: int,
        device: str,
        actor: str,
        *,
        url: str,
        fingerprint: str | None = None,
        create_missing: bool = True,
    ) -> dict[str, Any]:
        """A one-time enrollment bundle. Revokes the device's current credential."""
        problems = _device_name_problems(device)
        if problems:
            raise Invalid(problems)
        token = new_token(TokenKind.ENROLLMENT)
        now = time.time()
        with self.db.write() as conn:
            existing = conn.execute(
                select(devices.c.id).where(
                    and_(devices.c.tenant_id == tenant_id, devices.c.name == device)
                )
            ).one_or_none()
            if existing is None and not create_missing:
                raise NotFound(f"device {device!r} not found")
            device_id = (
                int(existing.id)
                if existing is not None
                else self._create_device(conn, tenant_id, device, actor)
            )
            revoked = conn.execute(
                update(tokens)
                .where(
                    and_(
                        tokens.c.device_id == device_id,
                        tokens.c.revoked_at.is_(None),
                        tokens.c.kind.in_([TokenKind.DEVICE.value, TokenKind.ENROLLMENT.value]),
                    )
                )
                .values(revoked_at=now)
            ).rowcount
            token_id = int(
                conn.execute(
                    tokens.insert().values(
                        tenant_id=tenant_id,
                        kind=TokenKind.ENROLLMENT.value,
                        device_id=device_id,
                        token_hash=hash_token(token),
                        label="enrollment",
                        created_at=now,
                        expires_at=now + ENROLLMENT_LIFETIME,
                    )
                ).inserted_primary_key[0]  # type: ignore[index]
            )
            tenant = conn.execute(
                select(tenants.c.name).where(tenants.c.id == tenant_id)
            ).scalar_one()
            audit.append(
                conn,
                self.key,
                tenant_id=tenant_id,
                actor=actor,
                action="device.enroll",
                target=f"device:{device}",
                detail={"token_id": token_id, "revoked_credentials": revoked},
            )
        self._forget_cached()
        bundle: dict[str, Any] = {
            "kind": "trueup-enrollment",
            "control_plane": url,
            "tenant": tenant,
            "device": device,
            "token": token,
            "expires_at": now + ENROLLMENT_LIFETIME,
        }
        if fingerprint:
            bundle["server_certificate_sha256"] = fingerprint
        return bundle

    def exchange_enrollment(self, token: str) -> dict[str, Any]:
        """Trade a one-time enrollment token for a device credential."""
        now = time.time()
        credential = new_token(TokenKind.DEVICE)
        with self.db.write() as conn:
            row = (
                conn.execute(
                    select(
                        tokens.c.id,
                        tokens.c.tenant_id,
                        tokens.c.device_id,
                        tokens.c.token_hash,
                        devices.c.name.label("device"),
                        tenants.c.name.label("tenant"),
                    )
                    .join(devices, devices.c.id == tokens.c.device_id)
                    .join(tenants, tenants.c.id == tokens.c.tenant_id)
                    .where(
                        and_(
                            tokens.c.token_hash == hash_token(token),
                            tokens.c.kind == TokenKind.ENROLLMENT.value,
                        )
                    )
                )
                .mappings()
                .one_or_none()
            )
            if row is None or not tokens_equal(row["token_hash"], token):
                raise Unauthorized("unknown enrollment token")
            used = conn.execute(
                update(tokens)
                .where(
                    and_(
                        tokens.c.id == row["id"],
                        tokens.c.used_at.is_(None),
                        tokens.c.revoked_at.is_(None),
                        tokens.c.expires_at > now,
                    )
                )
                .values(used_at=now, revoked_at=now)
            ).rowcount
            if used != 1:
                raise Unauthorized(
                    "enrollment token already used, revoked or expired; "
                    "run `trueup server device enroll` again"
                )
            conn.execute(
                update(tokens)
                .where(
                    and_(
                        tokens.c.device_id == row["device_id"],
                        tokens.c.kind == TokenKind.DEVICE.value,
                        tokens.c.revoked_at.is_(None),
                    )
                )
                .values(revoked_at=now)
            )
            credential_id = int(
                conn.execute(
                    tokens.insert().values(
                        tenant_id=row["tenant_id"],
                        kind=TokenKind.DEVICE.value,
                        device_id=row["device_id"],
                        token_hash=hash_token(credential),
                        label="device credential",
                        created_at=now,
                    )
                ).inserted_primary_key[0]  # type: ignore[index]
            )
            audit.append(
                conn,
                self.key,
                tenant_id=row["tenant_id"],
                actor=f"device:{row['tenant']}/{row['device']}",
                action="device.credential",
                target=f"device:{row['device']}",
                detail={"token_id": credential_id, "enrollment_token_id": row["id"]},
            )
        self._forget_cached()
        return {"tenant": row["tenant"], "device": row["device"], "credential": credential}

    # -- desired revisions -------------------------------------------------------------------

    def put_desired(
        self,
        tenant_id: int,
        device: str,
        expected_version: int,
        data: Any,
        *,
        author: str,
        comment: str = "",
    ) -> Revision:
        with self.db.read() as conn:
            self._device(conn, tenant_id, device)
        try:
            document = parse_document(data, source=f"device {device}")
        except DocumentError as exc:
            raise Invalid(exc.problems) from None
        if document.metadata.device != device:
            raise Invalid(
                [
                    f"metadata.device: {document.metadata.device!r} does not match the device "
                    f"in the URL ({device!r})"
                ]
            )
        content_hash = document_digest(document)
        now = time.time()
        with self.db.write() as conn:
            row = self._device(conn, tenant_id, device)
            new_version = expected_version + 1
            # Compare-and-set: the loser of a race updates no row and gets 409.
            swapped = conn.execute(
                update(devices)
                .where(
                    and_(devices.c.id == row["id"], devices.c.desired_version == expected_version)
                )
                .values(desired_version=new_version)
            ).rowcount
            if swapped != 1:
                current = conn.execute(
                    select(devices.c.desired_version).where(devices.c.id == row["id"])
                ).scalar_one()
                raise Conflict(device, expected_version, int(current))
            body = document.with_version(new_version).canonical()
            conn.execute(
                revisions.insert().values(
                    device_id=row["id"],
                    version=new_version,
                    parent_version=expected_version or None,
                    author=author,
                    comment=comment,
                    content_hash=content_hash,
                    document=json.dumps(body, sort_keys=True),
                    created_at=now,
                )
            )
            audit.append(
                conn,
                self.key,
                tenant_id=tenant_id,
                actor=author,
                action="revision.create",
                target=f"device:{device}",
                detail={
                    "device_id": row["id"],
                    "version": new_version,
                    "parent_version": expected_version or None,
                    "content_hash": content_hash,
                    "comment": comment,
                },
                at=now,
            )
        return Revision(
            device=device,
            version=new_version,
            parent_version=expected_version or None,
            author=author,
            comment=comment,
            content_hash=content_hash,
            created_at=now,
            document=body,
        )

    def desired(self, tenant_id: int, device: str) -> Revision | None:
        with self.db.read() as conn:
            row = self._device(conn, tenant_id, device)
            return self._revision_at(conn, device, row["id"], row["desired_version"])

    def _revision_at(
        self, conn: Connection, device: str, device_id: int, version: int
    ) -> Revision | None:
        if version <= 0:
            return None
        rev = (
            conn.execute(
                select(revisions).where(
                    and_(revisions.c.device_id == device_id, revisions.c.version == version)
                )
            )
            .mappings()
            .one_or_none()
        )
        return _revision(device, rev) if rev is not None else None

    def desired_after(self, device_id: int, device: str, after: int) -> Revision | None:
        """The newest revision if it is newer than `after` (the agent's long-poll question)."""
        with self.db.read() as conn:
            version = conn.execute(
                select(devices.c.desired_version).where(devices.c.id == device_id)
            ).scalar_one()
            if version <= after:
                return None
            return self._revision_at(conn, device, device_id, version)

    def revision(self, tenant_id: int, device: str, version: int) -> Revision:
        with self.db.read() as conn:
            row = self._device(conn, tenant_id, device)
            rev = self._revision_at(conn, device, row["id"], version)
        if rev is None:
            raise NotFound(f"device {device!r} has no revision {version}")
        return rev

    def revisions(self, tenant_id: int, device: str) -> list[Revision]:
        with self.db.read() as conn:
            row = self._device(conn, tenant_id, device)
            rows = conn.execute(
                select(revisions)
                .where(revisions.c.device_id == row["id"])
                .order_by(revisions.c.version)
            ).mappings()
            return [_revision(device, r) for r in rows]

    def device_id(self, tenant_id: int, device: str) -> int:
        with self.db.read() as conn:
            return int(self._device(conn, tenant_id, device)["id"])

    def revisions_since(self, revision_id: int) -> list[tuple[int, int]]:
        """(revision id, device id) of every revision made after `revision_id`, any process."""
        with self.db.read() as conn:
            rows = conn.execute(
                select(revisions.c.id, revisions.c.device_id).where(revisions.c.id > revision_id)
            ).all()
        return [(int(r.id), int(r.device_id)) for r in rows]

    def max_revision_id(self) -> int:
        with self.db.read() as conn:
            return int(
                conn.execute(select(func.coalesce(func.max(revisions.c.id), 0))).scalar_one()
            )

    # -- acknowledgements ------------------------------------------------------------------------

    def acknowledge(
        self, tenant_id: int, device: str, subsystem: str, seconds: float, reason: str, author: str
    ) -> dict[str, Any]:
        problems = []
        if not subsystem:
            problems.append("subsystem: required")
        if not 0 < seconds <= 30 * 24 * 3600:
            problems.append("for_seconds: must be between 1 second and 30 days")
        if not reason.strip():
            problems.append("reason: say why this state is acceptable for now")
        if problems:
            raise Invalid(problems)
        now = time.time()
        with self.db.write() as conn:
            row = self._device(conn, tenant_id, device)
            ack_id = int(
                conn.execute(
                    acks.insert().values(
                        device_id=row["id"],
                        subsystem=subsystem,
                        reason=reason,
                        author=author,
                        created_at=now,
                        expires_at=now + seconds,
                    )
                ).inserted_primary_key[0]  # type: ignore[index]
            )
            audit.append(
                conn,
                self.key,
                tenant_id=tenant_id,
                actor=author,
                action="ack.create",
                target=f"device:{device}",
                detail={"ack_id": ack_id, "subsystem": subsystem, "expires_at": now + seconds},
            )
        return {
            "id": ack_id,
            "device": device,
            "subsystem": subsystem,
            "reason": reason,
            "author": author,
            "expires_at": now + seconds,
        }

    # -- secrets ---------------------------------------------------------------------------------

    def put_secret(
        self, tenant_id: int, device: str, name: str, value: str, actor: str
    ) -> dict[str, Any]:
        _check_name("name", name)
        secret_id = uuid.uuid4().hex
        with self.db.write() as conn:
            row = self._device(conn, tenant_id, device)
            nonce, ciphertext = self._box(conn, tenant_id).seal(secret_id, value.encode())
            existing = conn.execute(
                select(secrets.c.id).where(
                    and_(secrets.c.device_id == row["id"], secrets.c.name == name)
                )
            ).one_or_none()
            if existing is not None:
                conn.execute(secrets.delete().where(secrets.c.id == existing.id))
            conn.execute(
                secrets.insert().values(
                    id=secret_id,
                    tenant_id=tenant_id,
                    device_id=row["id"],
                    name=name,
                    nonce=nonce,
                    ciphertext=ciphertext,
                    created_at=time.time(),
                )
            )
            audit.append(
                conn,
                self.key,
                tenant_id=tenant_id,
                actor=actor,
                action="secret.put",
                target=f"device:{device}/secret:{name}",
                detail={"secret_id": secret_id},
            )
        return {"id": secret_id, "device": device, "name": name}

    def secret_names(self, tenant_id: int, device: str) -> list[dict[str, Any]]:
        with self.db.read() as conn:
            row = self._device(conn, tenant_id, device)
            rows = conn.execute(
                select(secrets.c.id, secrets.c.name, secrets.c.created_at)
                .where(secrets.c.device_id == row["id"])
                .order_by(secrets.c.name)
            ).mappings()
            return [dict(r) for r in rows]

    def device_secrets(self, principal: Principal) -> dict[str, Any]:
        """Plaintext secrets for the calling device only; ones that fail to open are named."""
        assert principal.device_id is not None
        opened: dict[str, str] = {}
        refused: list[dict[str, str]] = []
        with self.db.read() as conn:
            box = self._box(conn, principal.tenant_id)
            rows = conn.execute(
                select(secrets).where(
                    and_(
                        secrets.c.device_id == principal.device_id,
                        secrets.c.tenant_id == principal.tenant_id,
                    )
                )
            ).mappings()
            for row in rows:
                try:
                    opened[row["name"]] = box.open(
                        row["id"], row["nonce"], row["ciphertext"]
                    ).decode()
                except SecretRefused as exc:
                    refused.append({"name": row["name"], "error": str(exc)})
        return {"secrets": opened, "refused": refused}

    # -- fleet -------------------------------------------------------------------------------------

    def fleet(self, tenant_id: int, device: str | None = None) -> list[dict[str, Any]]:
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
        with self.db.read() as conn:
            rows = list(conn.execute(query).mappings())
            active_acks: dict[int, list[dict[str, Any]]] = {}
            for ack in conn.execute(
                select(acks.c.device_id, acks.c.subsystem, acks.c.reason, acks.c.expires_at)
                .join(devices, devices.c.id == acks.c.device_id)
                .where(and_(devices.c.tenant_id == tenant_id, acks.c.expires_at > now))
            ).mappings():
                active_acks.setdefault(ack["device_id"], []).append(
                    {k: ack[k] for k in ("subsystem", "reason", "expires_at")}
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
                    "last_report_at": row["last_report_at"],
                    "heartbeat_interval": row["heartbeat_interval"],
                    "heartbeat_age": view.heartbeat_age,
                    "missed_heartbeats": view.missed_heartbeats,
                    "in_sync_since": view.in_sync_since,
                    "acknowledgements": active_acks.get(row["id"], []),
                }
            )
        return out

    def last_report(self, tenant_id: int, device: str) -> dict[str, Any] | None:
        with self.db.read() as conn:
            row = self._device(conn, tenant_id, device)
            report = conn.execute(
                select(device_state.c.report).where(device_state.c.device_id == row["id"])
            ).scalar_one_or_none()
        return json.loads(report) if report else None

    def report_history(self, tenant_id: int, device: str, limit: int) -> list[dict[str, Any]]:
        with self.db.read() as conn:
            row = self._device(conn, tenant_id, device)
            rows = conn.execute(
                select(device_reports.c.id, device_reports.c.received_at, device_reports.c.payload)
                .where(device_reports.c.device_id == row["id"])
                .order_by(device_reports.c.id.desc())
                .limit(limit)
            ).mappings()
            return [
                {"id": r["id"], "received_at": r["received_at"], **json.loads(r["payload"])}
                for r in rows
            ]

    def audit_entries(self, tenant_id: int, limit: int) -> list[dict[str, Any]]:
        with self.db.read() as conn:
            rows = conn.execute(
                select(
                    audit_log.c.seq,
                    audit_log.c.at,
                    audit_log.c.actor,
                    audit_log.c.action,
                    audit_log.c.target,
                    audit_log.c.detail,
                    audit_log.c.row_hash,
                )
                .where(audit_log.c.tenant_id == tenant_id)
                .order_by(audit_log.c.seq.desc())
                .limit(limit)
            ).mappings()
            return [{**dict(r), "detail": json.loads(r["detail"])} for r in rows]

    def verify_audit(self) -> list[audit.AuditProblem]:
        with self.db.read() as conn:
            return audit.verify(conn, self.key)


def _device_name_problems(name: str) -> list[str]:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,252}", name or ""):
        return [f"name: {name!r} is not a valid device name ({_NAME_PATTERN})"]
    return []
