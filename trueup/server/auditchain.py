"""The audit log's rows: their HMAC chain, how one is appended, how the chain is walked,
and the seals token and user rows carry.

Each row's hash is an HMAC, keyed by the server key (purpose "audit"), over its fields
and the previous row's hash; `audit_head` holds the newest (seq, hash) and is row-locked
by every writer (`append`), so the chain stays linear across server processes.

Two walks read the chain: `check_chain` (verification: every deleted, edited, inserted
row and the head, in words) and `verified_rows` (sealing: the rows that verify and the
seqs where the chain breaks, by the same rule as chainproof.py's walk).

Seals: each token and user row carries an HMAC under the server key over its
security-relevant fields (`token_seal`, `user_seal`); authentication refuses a row whose
seal does not match.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from sqlalchemy import Connection, RowMapping, select, update

from trueup.model.digests import canonical_json
from trueup.server.keys import ServerKey
from trueup.server.tables import audit_head, audit_log

__all__ = [
    "GENESIS",
    "AuditProblem",
    "append",
    "canonical",
    "check_chain",
    "entry_hash",
    "entry_name",
    "iso",
    "row_hash_ok",
    "token_row_seal",
    "token_seal",
    "token_seal_ok",
    "user_row_seal",
    "user_seal",
    "user_seal_ok",
    "verified_rows",
]

GENESIS = "0" * 64

# A token or user row: read from its table, or put together from a join (service/auth.py).
SealedRow = RowMapping | Mapping[str, Any]


@dataclass(frozen=True)
class AuditProblem:
    table: str
    row: str
    problem: str
    # True: not evidence of tampering, but something the log cannot vouch for
    # (an entry written by an older trueup, no checkpoint yet).
    gap: bool = False

    def __str__(self) -> str:
        return f"{'not covered: ' if self.gap else ''}{self.table} {self.row}: {self.problem}"


class _Columns(TypedDict):
    """An audit row's columns, as `append` writes them (the hash aside)."""

    seq: int
    tenant_id: int | None
    at: float
    actor: str
    action: str
    target: str
    detail: str
    prev_hash: str


def canonical(value: object) -> str:
    return canonical_json(value).decode()


def entry_hash(key: bytes, row: RowMapping | _Columns) -> str:
    """The HMAC an audit row (its columns, read from the table or about to be written)
    carries, under the derived "audit" key."""
    body = canonical(
        [
            row["seq"],
            row["tenant_id"],
            repr(float(row["at"])),
            row["actor"],
            row["action"],
            row["target"],
            row["detail"],
            row["prev_hash"],
        ]
    )
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest()


def _intact(key: bytes, row: RowMapping) -> bool:
    try:
        return hmac.compare_digest(entry_hash(key, row), str(row["row_hash"]))
    except (TypeError, ValueError):
        return False


def row_hash_ok(server_key: ServerKey, row: RowMapping) -> bool:
    """Does an audit row carry its own HMAC (edited or forged rows do not)?"""
    return _intact(server_key.derive("audit"), row)


def entry_name(entry: RowMapping) -> str:
    """How findings name an audit row: "seq=7 (token.create user:ops)"."""
    return f"seq={entry['seq']} ({entry['action']} {entry['target']})"


def iso(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


# -- writing ------------------------------------------------------------------------------


def append(
    conn: Connection,
    server_key: ServerKey,
    *,
    tenant_id: int | None,
    actor: str,
    action: str,
    target: str,
    detail: Mapping[str, object] | None = None,
    at: float | None = None,
) -> int:
    """Append one entry inside the caller's transaction; return its sequence number.

    `detail` is the action's own record (each action's keys: auditfacts.py), stored as
    canonical JSON."""
    head = conn.execute(
        select(audit_head.c.seq, audit_head.c.row_hash)
        .where(audit_head.c.id == 1)
        .with_for_update()
    ).one()
    row = _Columns(
        seq=head.seq + 1,
        tenant_id=tenant_id,
        at=time.time() if at is None else at,
        actor=actor,
        action=action,
        target=target,
        detail=canonical(detail or {}),
        prev_hash=head.row_hash,
    )
    row_hash = entry_hash(server_key.derive("audit"), row)
    conn.execute(audit_log.insert().values(**row, row_hash=row_hash))
    conn.execute(
        update(audit_head).where(audit_head.c.id == 1).values(seq=row["seq"], row_hash=row_hash)
    )
    return int(row["seq"])


# -- seals ----------------------------------------------------------------------------------


def _seal(server_key: ServerKey, purpose: str, fields: list[object]) -> str:
    body = canonical(fields).encode()
    return hmac.new(server_key.derive(purpose), body, hashlib.sha256).hexdigest()


def token_seal(
    server_key: ServerKey,
    *,
    token_id: int,
    tenant_id: int,
    kind: str,
    user_id: int | None,
    device_id: int | None,
    token_hash: str,
    expires_at: float | None,
) -> str:
    """The HMAC a token row carries; authentication refuses a row that does not match it."""
    expiry = None if expires_at is None else repr(float(expires_at))
    return _seal(
        server_key,
        "token-seal",
        [token_id, tenant_id, kind, user_id, device_id, token_hash, expiry],
    )


def user_seal(server_key: ServerKey, *, user_id: int, tenant_id: int, name: str, role: str) -> str:
    """The HMAC a user row carries (a role raised behind the server's back does not match)."""
    return _seal(server_key, "user-seal", [user_id, tenant_id, name, role])


def token_row_seal(server_key: ServerKey, row: SealedRow) -> str:
    """The seal a token row (id, tenant_id, kind, user_id, device_id, token_hash,
    expires_at) should carry."""
    return token_seal(
        server_key,
        token_id=row["id"],
        tenant_id=row["tenant_id"],
        kind=row["kind"],
        user_id=row["user_id"],
        device_id=row["device_id"],
        token_hash=row["token_hash"],
        expires_at=row["expires_at"],
    )


def user_row_seal(server_key: ServerKey, row: SealedRow) -> str:
    """The seal a user row (id, tenant_id, name, role) should carry."""
    return user_seal(
        server_key,
        user_id=row["id"],
        tenant_id=row["tenant_id"],
        name=row["name"],
        role=row["role"],
    )


def token_seal_ok(server_key: ServerKey, row: SealedRow) -> bool:
    """Does a token row (id, tenant_id, kind, user_id, device_id, token_hash, expires_at,
    seal) carry its own seal?"""
    seal = row["seal"]
    return seal is not None and hmac.compare_digest(token_row_seal(server_key, row), seal)


def user_seal_ok(server_key: ServerKey, row: SealedRow) -> bool:
    """Does a user row (id, tenant_id, name, role, seal) carry its own seal?"""
    seal = row["seal"]
    return seal is not None and hmac.compare_digest(user_row_seal(server_key, row), seal)


# -- walking the chain ----------------------------------------------------------------------


def _all_rows(conn: Connection) -> list[RowMapping]:
    return list(conn.execute(select(audit_log).order_by(audit_log.c.seq)).mappings())


def check_chain(
    conn: Connection, server_key: ServerKey, entries: list[RowMapping]
) -> list[AuditProblem]:
    """Every row deleted, unlinked or edited, and a head that is not the last row; appends
    to `entries` the rows whose HMAC verifies (only those vouch for anything)."""
    key = server_key.derive("audit")
    problems: list[AuditProblem] = []
    expected_seq = 1
    prev_hash = GENESIS
    for row in _all_rows(conn):
        name = entry_name(row)
        if row["seq"] > expected_seq:
            missing = (
                f"seq={expected_seq}"
                if row["seq"] == expected_seq + 1
                else f"seq={expected_seq}..{row['seq'] - 1}"
            )
            problems.append(AuditProblem("audit_log", missing, "row(s) deleted from the chain"))
        if row["prev_hash"] != prev_hash:
            problems.append(
                AuditProblem(
                    "audit_log",
                    name,
                    "does not link to the previous row (inserted, reordered or a neighbour "
                    "was removed)",
                )
            )
        intact = _intact(key, row)
        if not intact:
            problems.append(
                AuditProblem(
                    "audit_log",
                    name,
                    "contents do not match the row's hash (edited, or inserted without the "
                    "server key)",
                )
            )
        expected_seq = row["seq"] + 1
        prev_hash = row["row_hash"]
        if intact:
            entries.append(row)
    head = conn.execute(select(audit_head).where(audit_head.c.id == 1)).one_or_none()
    if head is None:
        problems.append(AuditProblem("audit_head", "id=1", "missing"))
    elif head.seq != expected_seq - 1 or head.row_hash != prev_hash:
        problems.append(
            AuditProblem(
                "audit_head",
                f"seq={head.seq}",
                f"head does not match the last row (seq={expected_seq - 1}); "
                "rows at the end of the chain were deleted or the head was edited",
            )
        )
    return problems


def verified_rows(conn: Connection, server_key: ServerKey) -> tuple[list[RowMapping], list[int]]:
    """The rows whose HMAC verifies, in seq order, and every seq where the chain breaks (a
    gap, a row whose HMAC fails, a row that does not link to the one before it) — the same
    rule as chainproof's walk, so sealing never vouches for a row the walk would refuse."""
    key = server_key.derive("audit")
    entries: list[RowMapping] = []
    breaks: list[int] = []
    expected = 1
    link: str | None = GENESIS
    for row in _all_rows(conn):
        seq = int(row["seq"])
        if seq > expected:
            breaks.append(expected)
            link = None
        expected = seq + 1
        if not _intact(key, row):
            breaks.append(seq)
            link = None
            continue
        if link is not None and row["prev_hash"] != link:
            breaks.append(seq)
        link = str(row["row_hash"])
        entries.append(row)
    return entries, breaks
