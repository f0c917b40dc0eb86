"""Authentication: the principal behind a bearer token, and the per-process token cache.

A cached principal stays valid while nothing that could change it was
written: every token revocation, enrollment and role change appends to the
audit log, so the audit head's sequence number is the cache's generation. Each
process reads it at most once per `auth_cache_seconds` (one tiny query), so a
revocation made by any process takes effect everywhere within that time, and
the number of authentication queries does not grow with the fleet. Writes made
in this process call `forget()` and take effect here at once.

The audit chain is also the authority on credentials (audit.py). With the
generation, each process checks the chain against its checkpoint outside the
database; while the stored chain is behind or differs from the checkpoint
(rows deleted from its end and the head rewound, as when a revocation is
removed from the log and undone in the table), every token is refused: the
database's credential state cannot be trusted until an operator has run
`trueup server audit verify` and re-anchored. A token or user row whose seal
does not match (a hash replaced, a role raised, a row inserted directly) is
refused on its own, and so is one that the verified log contradicts (a
revocation cleared, a user's earlier role restored with its earlier seal) or
can no longer vouch for (a break in the chain — a row deleted or rewritten —
after the token was issued or its user's role recorded): `Store.credential_refusal`,
chainproof.py. Each refusal is logged with the token, its tenant and its user or
device, and what to run.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from sqlalchemy import Connection, RowMapping, and_, select

from trueup.server.chainproof import credential_name
from trueup.server.service.errors import Unauthorized
from trueup.server.service.store import Store
from trueup.server.tables import audit_head, devices, tenants, tokens, users
from trueup.server.tokens import Role, TokenKind, hash_token, tokens_equal

__all__ = ["Authenticator", "Principal"]

_log = logging.getLogger("trueup.server.auth")

# A cached principal is checked against the database again after this long at the latest.
_HARD_EXPIRY_SECONDS = 300.0
# Past this many cached tokens the cache starts over (bounded memory under token spraying).
_MAX_CACHED = 200_000


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


class Authenticator:
    def __init__(self, store: Store, *, cache_seconds: float = 2.0) -> None:
        self.store = store
        self.cache_seconds = cache_seconds
        # token hash -> (hard expiry, audit generation, principal)
        self._cache: dict[str, tuple[float, int, Principal]] = {}
        self._cache_lock = threading.Lock()
        self._generation_lock = threading.Lock()
        self._generation = -1
        self._generation_checked = float("-inf")
        # Why the audit chain contradicts its checkpoint (all tokens refused), or None.
        self._rewound: str | None = None

    def forget(self) -> None:
        """Drop every cached principal (a credential or role changed in this process)."""
        with self._cache_lock:
            self._cache.clear()

    def _check_chain(self, conn: Connection) -> None:
        problems = self.store.anchor_problems(conn)
        if problems:
            if self._rewound is None:
                _log.error("authentication suspended: %s", problems[0])
            self.forget()
            self._rewound = str(problems[0])
        else:
            self._rewound = None

    def _refresh_generation(self, now: float) -> int:
        with self._generation_lock:
            if now - self._generation_checked < self.cache_seconds:
                return self._generation
            with self.store.db.read() as conn:
                self._check_chain(conn)
                row = conn.execute(
                    select(audit_head.c.seq).where(audit_head.c.id == 1)
                ).one_or_none()
            generation = int(row.seq) if row is not None else 0
            if generation != self._generation:
                self.forget()
                self._generation = generation
            self._generation_checked = now
            return generation

    def _refuse_if_rewound(self) -> None:
        if self._rewound is not None:
            raise Unauthorized(
                "authentication suspended: the audit chain contradicts its checkpoint "
                f"({self._rewound}); an operator must run `trueup server audit verify`"
            )

    def cached_principal(self, token: str) -> Principal | None:
        """The principal if this token was authenticated and nothing was revoked since.

        Never touches the database (it runs on the event loop); when the
        generation is due for a check, it answers None and `authenticate` checks.
        """
        if self.cache_seconds <= 0 or self._rewound is not None:
            return None
        now = time.monotonic()
        if now - self._generation_checked >= self.cache_seconds:
            return None
        cached = self._cache.get(hash_token(token))
        if cached is not None and cached[0] > now and cached[1] == self._generation:
            return cached[2]
        return None

    def authenticate(self, token: str) -> Principal:
        """The principal behind a user or device token. Raises Unauthorized."""
        now = time.monotonic()
        token_hash = hash_token(token)
        generation = 0
        self.store.ensure_sealed()
        if self.cache_seconds > 0:
            generation = self._refresh_generation(now)
            self._refuse_if_rewound()
            with self._cache_lock:
                cached = self._cache.get(token_hash)
            if cached is not None and cached[0] > now and cached[1] == generation:
                return cached[2]
        with self.store.db.read() as conn:
            if self.cache_seconds <= 0:
                self._check_chain(conn)
            row = _token_row(conn, token_hash)
            refusal = None
            if row is not None:
                refusal = self.store.credential_refusal(
                    conn, row["id"], row["user_id"], row["role"]
                )
        self._refuse_if_rewound()
        row = self._checked(row, token, refusal)
        principal = _principal(row)
        if self.cache_seconds > 0:
            expiry = now + _HARD_EXPIRY_SECONDS
            if row["expires_at"] is not None:
                expiry = min(expiry, now + (row["expires_at"] - time.time()))
            with self._cache_lock:
                if len(self._cache) > _MAX_CACHED:
                    self._cache.clear()
                self._cache[token_hash] = (expiry, generation, principal)
        return principal

    def _checked(self, row: RowMapping | None, token: str, refusal: str | None) -> RowMapping:
        """Raise Unauthorized unless the token row found is the token's, its seals hold,
        the audit trail vouches for it and it has not expired."""
        if row is None or not tokens_equal(row["token_hash"], token):
            raise Unauthorized("unknown or revoked token")
        if not self.store.token_seal_ok(row):
            _log.error("token id=%s refused: its row does not match its seal", row["id"])
            raise Unauthorized("token refused: its record was changed behind the server's back")
        if row["kind"] == TokenKind.USER.value and not self.store.user_seal_ok(
            {
                "id": row["user_id"],
                "tenant_id": row["user_tenant_id"],
                "name": row["user"],
                "role": row["role"],
                "seal": row["user_seal"],
            }
        ):
            _log.error("user id=%s refused: its row does not match its seal", row["user_id"])
            raise Unauthorized("token refused: its user was changed behind the server's back")
        if refusal is not None:
            _log.error(
                "%s refused: %s; run `trueup server audit verify`",
                credential_name(row),
                refusal,
            )
            raise Unauthorized(
                f"token refused: {refusal}; an operator must run `trueup server audit verify`"
            )
        if row["expires_at"] is not None and row["expires_at"] < time.time():
            raise Unauthorized("token expired")
        return row


def _token_row(conn: Connection, token_hash: str) -> RowMapping | None:
    """The live (not revoked) user or device token with this hash, with its tenant, user
    and device."""
    return (
        conn.execute(
            select(
                tokens.c.id,
                tokens.c.kind,
                tokens.c.token_hash,
                tokens.c.tenant_id,
                tokens.c.user_id,
                tokens.c.device_id,
                tokens.c.expires_at,
                tokens.c.seal,
                tenants.c.name.label("tenant"),
                users.c.tenant_id.label("user_tenant_id"),
                users.c.name.label("user"),
                users.c.role,
                users.c.seal.label("user_seal"),
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


def _principal(row: RowMapping) -> Principal:
    return Principal(
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
