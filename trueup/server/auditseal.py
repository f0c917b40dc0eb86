"""Sealing the token and user rows an older trueup wrote, where the audit log vouches for
them.

Rows from before seals existed are sealed once (the next server start after the upgrade,
`Store.seal_unsealed`). A row is sealed only if the log's verified rows state it and
agree with it (`Sealing.vouches`) and no break in the chain follows the entry that
stated it: the log may be missing a later record of the row (a revocation, a demotion).
A row the log does not vouch for stays unsealed and authentication keeps refusing it.
Each batch of sealed rows is recorded in an `audit.seal` entry (`SealedToken`,
`SealedUser`), which the replay reads (audittables.py), so verification covers these
rows from then on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypedDict, TypeVar

from sqlalchemy import Connection, RowMapping, Table, select, update

from trueup.server.auditchain import (
    append,
    token_row_seal,
    user_row_seal,
    verified_rows,
)
from trueup.server.auditfacts import TokenFact, UserFact
from trueup.server.audittables import TOKENS, USERS, replay
from trueup.server.auditverify import AuditedTable, Fact, Facts
from trueup.server.keys import ServerKey
from trueup.server.tables import tokens, users

__all__ = ["SealedToken", "SealedUser", "seal_unsealed"]

_log = logging.getLogger("trueup.server.audit")
# Rows per `audit.seal` entry when rows written by an older trueup are sealed.
_SEAL_BATCH = 500

F = TypeVar("F", bound=Fact)


class SealedToken(TypedDict):
    """A token row as an `audit.seal` entry records it."""

    token_id: int
    tenant_id: int
    kind: str
    user_id: int | None
    device_id: int | None
    token_hash: str
    revoked: bool


class SealedUser(TypedDict):
    """A user row as an `audit.seal` entry records it."""

    user_id: int
    tenant_id: int
    name: str
    role: str


def _matches(audited: object, live: object) -> bool:
    """An audited value of None: not recorded (an older trueup), so not contradicted."""
    return audited is None or audited == live


def _token_vouched(fact: TokenFact, row: RowMapping) -> bool:
    return (
        _matches(fact.tenant_id, row["tenant_id"])
        and fact.kind == row["kind"]
        and _matches(fact.user_id, row["user_id"])
        and _matches(fact.device_id, row["device_id"])
        and _matches(fact.token_hash, row["token_hash"])
        and not (fact.revoked_seq is not None and row["revoked_at"] is None)
    )


def _user_vouched(fact: UserFact, row: RowMapping) -> bool:
    return (
        fact.role == row["role"]
        and _matches(fact.tenant_id, row["tenant_id"])
        and _matches(fact.name, row["name"])
    )


def _token_record(row: RowMapping) -> SealedToken:
    return SealedToken(
        token_id=row["id"],
        tenant_id=row["tenant_id"],
        kind=row["kind"],
        user_id=row["user_id"],
        device_id=row["device_id"],
        token_hash=row["token_hash"],
        revoked=row["revoked_at"] is not None,
    )


def _user_record(row: RowMapping) -> SealedUser:
    return SealedUser(
        user_id=row["id"], tenant_id=row["tenant_id"], name=row["name"], role=row["role"]
    )


@dataclass(frozen=True)
class Sealing(Generic[F]):
    """One table whose rows carry a seal: where they are, what the log says of them, when
    the log vouches for a row, the seal, and what the `audit.seal` entry records (under
    `recorded_as`). `noun` and `stated` word the server log's line for a row refused."""

    table: Table
    facts: AuditedTable[int, F]
    vouches: Callable[[F, RowMapping], bool]
    seal: Callable[[ServerKey, RowMapping], str]
    record: Callable[[RowMapping], Mapping[str, object]]
    recorded_as: str
    noun: str
    stated: str


SEALINGS: tuple[Sealing[Any], ...] = (
    Sealing(
        tokens,
        TOKENS,
        _token_vouched,
        token_row_seal,
        _token_record,
        "tokens",
        "token",
        "it was issued",
    ),
    Sealing(
        users,
        USERS,
        _user_vouched,
        user_row_seal,
        _user_record,
        "users",
        "user",
        "its role was recorded",
    ),
)


def _unsealed(conn: Connection, table: Table) -> list[RowMapping]:
    return list(
        conn.execute(select(table).where(table.c.seal.is_(None)).order_by(table.c.id))
        .mappings()
        .all()
    )


def _seal_rows(
    conn: Connection,
    server_key: ServerKey,
    sealing: Sealing[Any],
    rows: list[RowMapping],
    facts: Facts,
    breaks: list[int],
) -> list[Mapping[str, object]]:
    """Seal each row the log vouches for; what the `audit.seal` entry records of them."""
    known = facts.of(sealing.facts)
    recorded = []
    for row in rows:
        fact = known.get(row["id"])
        # The first break at or after the entry that stated the row.
        broken = None if fact is None else next((b for b in breaks if b >= fact.seq), None)
        if fact is not None and broken is not None:
            _log.error(
                "%s id=%s not sealed: the audit chain is broken at seq=%s after %s (seq=%s)",
                sealing.noun,
                row["id"],
                broken,
                sealing.stated,
                fact.seq,
            )
            continue
        if fact is None or not sealing.vouches(fact, row):
            _log.error(
                "%s id=%s not sealed: the audit log does not vouch for it", sealing.noun, row["id"]
            )
            continue
        conn.execute(
            update(sealing.table)
            .where(sealing.table.c.id == row["id"])
            .values(seal=sealing.seal(server_key, row))
        )
        recorded.append(sealing.record(row))
    return recorded


def seal_unsealed(conn: Connection, server_key: ServerKey, actor: str) -> int:
    """Seal the token and user rows without a seal that the audit log vouches for.

    Call inside a write transaction. Returns the number of rows sealed.
    """
    pending = [(sealing, _unsealed(conn, sealing.table)) for sealing in SEALINGS]
    if not any(rows for _sealing, rows in pending):
        return 0
    entries, breaks = verified_rows(conn, server_key)
    facts, _problems = replay(entries)
    recorded = {
        sealing.recorded_as: _seal_rows(conn, server_key, sealing, rows, facts, breaks)
        for sealing, rows in pending
    }
    for i in range(0, max(len(r) for r in recorded.values()), _SEAL_BATCH):
        append(
            conn,
            server_key,
            tenant_id=None,
            actor=actor,
            action="audit.seal",
            target="tokens+users",
            detail={name: rows[i : i + _SEAL_BATCH] for name, rows in recorded.items()},
        )
    return sum(len(r) for r in recorded.values())
