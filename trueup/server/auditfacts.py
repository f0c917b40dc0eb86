"""What the audit log says one row of an audited table holds (a fact record), how an
entry's detail reads into one, and how a live row is compared with one.

A fact field of None: the entry that stated the row did not record it (written by an
older trueup), so verification cannot compare it. The records, the readers and the
checks here each concern one row of one table; audittables.py declares the tables
from them, with what needs several tables (a token's device named in its target, a
device's newest revision).
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import RowMapping, func, select

from trueup.model.document import DocumentError, document_digest, parse_document
from trueup.server.auditverify import Context, Malformed, Reading, Says
from trueup.server.keys import ServerKey
from trueup.server.tables import backup_chunks

__all__ = [
    "AckFact",
    "BackupFact",
    "DeviceFact",
    "RevisionFact",
    "SecretFact",
    "TenantFact",
    "TokenFact",
    "UserFact",
    "backup_key",
    "chunks_add_up",
    "mark_revoked",
    "requires_device",
    "revoked_id",
    "same_content",
    "same_role",
    "same_token_hash",
    "seal_holds",
    "sealed_token",
    "sealed_user",
    "stated_user",
    "still_revoked",
    "tenant_key",
    "token_key",
    "user_key",
]


@dataclass(frozen=True)
class TenantFact:
    seq: int
    name: str | None


@dataclass(frozen=True)
class UserFact:
    seq: int
    tenant_id: int | None
    name: str | None
    role: str


@dataclass(frozen=True)
class DeviceFact:
    seq: int
    tenant_id: int | None
    name: str | None


@dataclass
class TokenFact:
    seq: int
    tenant_id: int | None
    kind: str
    user_id: int | None = None
    device_id: int | None = None
    token_hash: str | None = None  # None: written by an older trueup
    revoked_seq: int | None = None


@dataclass(frozen=True)
class RevisionFact:
    seq: int
    content_hash: str


@dataclass(frozen=True)
class AckFact:
    seq: int
    device_id: int | None
    subsystem: str | None
    expires_at: float | None


@dataclass(frozen=True)
class SecretFact:
    seq: int
    tenant_id: int | None
    device_id: int | None
    name: str | None


@dataclass(frozen=True)
class BackupFact:
    seq: int
    tenant_id: int | None
    device_id: int
    sha256: str
    size: int


# -- comparing a live row with its fact ----------------------------------------------------


def backup_sizes(ctx: Context) -> dict[int, int]:
    """The bytes each backup's chunks hold."""
    return {
        backup_id: int(size or 0)
        for backup_id, size in ctx.conn.execute(
            select(backup_chunks.c.backup_id, func.sum(func.length(backup_chunks.c.data))).group_by(
                backup_chunks.c.backup_id
            )
        ).all()
    }


def seal_holds(
    seal_ok: Callable[[ServerKey, RowMapping], bool], refused: str
) -> Callable[[RowMapping, object, Context], Says | None]:
    """The row carries its own seal (none at all: an older trueup's row, a gap)."""

    def check(row: RowMapping, _fact: object, ctx: Context) -> Says | None:
        if row["seal"] is None:
            return Says("not sealed (written by an older trueup)", gap=True)
        if seal_ok(ctx.key, row):
            return None
        return Says(
            "seal does not match the row (changed behind the server's back); "
            f"authentication refuses {refused}"
        )

    return check


def same_role(row: RowMapping, fact: UserFact, _ctx: Context) -> Says | None:
    """The role is the last audited one."""
    if fact.role == row["role"]:
        return None
    return Says(f"role is {row['role']} but the last audited role is {fact.role} (edited)")


def same_token_hash(row: RowMapping, fact: TokenFact, _ctx: Context) -> Says | None:
    """The token's hash is the audited one (not recorded: an older trueup's entry, a gap)."""
    if fact.token_hash is None:
        return Says("its hash is not in the audit log (written by an older trueup)", gap=True)
    if hmac.compare_digest(str(row["token_hash"]), fact.token_hash):
        return None
    return Says(
        f"token_hash differs from the one audited at seq={fact.seq}: replaced "
        "behind the server's back (a token chosen by someone else)"
    )


def still_revoked(row: RowMapping, fact: TokenFact, _ctx: Context) -> Says | None:
    """A token the log revoked is revoked in the table."""
    if fact.revoked_seq is None or row["revoked_at"] is not None:
        return None
    return Says(
        f"revoked at seq={fact.revoked_seq} but not revoked in the table (revocation undone)"
    )


def same_content(row: RowMapping, fact: RevisionFact, _ctx: Context) -> Says | None:
    """The document hashes to the audited content hash, and the stored hash is that too."""
    try:
        digest = document_digest(parse_document(json.loads(row["document"])))
    except (ValueError, TypeError, DocumentError):
        digest = "(unparsable document)"
    if digest == fact.content_hash and row["content_hash"] == fact.content_hash:
        return None
    return Says(f"document or content hash differs from the audited {fact.content_hash} (edited)")


def chunks_add_up(row: RowMapping, fact: BackupFact, ctx: Context) -> Says | None:
    """The backup's chunks hold the audited number of bytes."""
    stored = ctx.cached(backup_sizes).get(row["id"], 0)
    if stored == fact.size:
        return None
    return Says(
        f"its chunks hold {stored} bytes but {fact.size} were audited at seq={fact.seq} "
        "(content changed behind the server's back)"
    )


# -- reading an entry's detail into a fact -----------------------------------------------------


def tenant_key(r: Reading) -> int:
    tenant_id = r.tenant_id
    if not isinstance(tenant_id, int):
        raise Malformed("no tenant id")
    return tenant_id


def revoked_id(r: Reading) -> int:
    token_id = r.optional_int("token_id")
    if token_id is None:
        number = r.after("token:") or ""
        if not number.isdigit():
            raise Malformed("no token id")
        token_id = int(number)
    return token_id


def mark_revoked(fact: TokenFact, r: Reading) -> None:
    fact.revoked_seq = r.seq


def requires_device(r: Reading) -> None:
    r.required_int("device_id")


def stated_user(r: Reading, _previous: UserFact | None) -> UserFact:
    role = r.required_str("role")
    return UserFact(r.seq, r.tenant_id, r.after("user:"), role)


def sealed_token(r: Reading, previous: TokenFact | None) -> TokenFact:
    """A token row sealed on an upgrade: its fields as sealed; a revocation the log made
    before stays, and one the row carried counts from the seal."""
    kind = r.required_str("kind")
    token = TokenFact(
        r.seq,
        r.optional_int("tenant_id"),
        kind,
        user_id=r.optional_int("user_id"),
        device_id=r.optional_int("device_id"),
        token_hash=r.required_str("token_hash"),
    )
    token.revoked_seq = previous.revoked_seq if previous is not None else None
    if r.detail.get("revoked") is True and token.revoked_seq is None:
        token.revoked_seq = r.seq
    return token


def sealed_user(r: Reading, _previous: UserFact | None) -> UserFact:
    role = r.required_str("role")
    return UserFact(r.seq, r.optional_int("tenant_id"), r.optional_str("name"), role)


def token_key(r: Reading) -> int:
    return r.required_int("token_id")


def user_key(r: Reading) -> int:
    return r.required_int("user_id")


def backup_key(r: Reading) -> int:
    return r.required_int("backup_id")
