"""The append-only, hash-chained audit log.

Every write the control plane makes (tenant, user, role change, token,
enrollment, credential, revision, acknowledgement, secret) appends one row in
the same transaction as the write itself. Each row's hash is an HMAC, keyed by
the server key, over its fields and the previous row's hash; `audit_head`
holds the newest (seq, hash) and is row-locked by every writer, so the chain
stays linear across server processes.

`verify()` finds rows edited, deleted or inserted behind the server's back:
an edited row no longer matches its hash, a deleted row leaves a gap (or a head
pointing past the end), an inserted row cannot carry a valid HMAC without the
server key. It also checks the live tables against the log: a revision whose
document differs from its audited content hash, a user whose role is not the
last audited one, a token that was never audited.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, select, update

from trueup.model.digests import canonical_json
from trueup.model.document import DocumentError, document_digest, parse_document
from trueup.server.keys import ServerKey
from trueup.server.tables import audit_head, audit_log, devices, revisions, tenants, tokens, users

__all__ = ["GENESIS", "AuditProblem", "append", "verify"]

GENESIS = "0" * 64


@dataclass(frozen=True)
class AuditProblem:
    table: str
    row: str
    problem: str

    def __str__(self) -> str:
        return f"{self.table} {self.row}: {self.problem}"


def _canonical(value: Any) -> str:
    return canonical_json(value).decode()


def _row_hash(key: bytes, row: dict[str, Any]) -> str:
    body = _canonical(
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


def append(
    conn: Connection,
    server_key: ServerKey,
    *,
    tenant_id: int | None,
    actor: str,
    action: str,
    target: str,
    detail: dict[str, Any] | None = None,
    at: float | None = None,
) -> int:
    """Append one entry inside the caller's transaction; return its sequence number."""
    head = conn.execute(
        select(audit_head.c.seq, audit_head.c.row_hash)
        .where(audit_head.c.id == 1)
        .with_for_update()
    ).one()
    row: dict[str, Any] = {
        "seq": head.seq + 1,
        "tenant_id": tenant_id,
        "at": time.time() if at is None else at,
        "actor": actor,
        "action": action,
        "target": target,
        "detail": _canonical(detail or {}),
        "prev_hash": head.row_hash,
    }
    row["row_hash"] = _row_hash(server_key.derive("audit"), row)
    conn.execute(audit_log.insert().values(**row))
    conn.execute(
        update(audit_head)
        .where(audit_head.c.id == 1)
        .values(seq=row["seq"], row_hash=row["row_hash"])
    )
    return int(row["seq"])


def verify(conn: Connection, server_key: ServerKey) -> list[AuditProblem]:
    """Every inconsistency between the chain, its head and the live tables."""
    key = server_key.derive("audit")
    problems: list[AuditProblem] = []
    expected_seq = 1
    prev_hash = GENESIS
    entries: list[dict[str, Any]] = []
    for r in conn.execute(select(audit_log).order_by(audit_log.c.seq)).mappings():
        row = dict(r)
        name = f"seq={row['seq']} ({row['action']} {row['target']})"
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
        if not hmac.compare_digest(_row_hash(key, row), row["row_hash"]):
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
    problems.extend(_check_live_tables(conn, entries))
    return problems


def _check_live_tables(conn: Connection, entries: list[dict[str, Any]]) -> list[AuditProblem]:
    problems: list[AuditProblem] = []
    audited_revisions: dict[tuple[int, int], str] = {}
    audited_roles: dict[int, str] = {}
    audited_tokens: set[int] = set()
    for entry in entries:
        try:
            detail = json.loads(entry["detail"])
        except ValueError:
            continue
        if not isinstance(detail, dict):
            continue
        action = entry["action"]
        if action == "revision.create":
            audited_revisions[(detail["device_id"], detail["version"])] = detail["content_hash"]
        elif action in ("user.create", "user.role"):
            audited_roles[detail["user_id"]] = detail["role"]
        if "token_id" in detail:
            audited_tokens.add(detail["token_id"])

    rows = conn.execute(
        select(
            revisions.c.id,
            revisions.c.device_id,
            revisions.c.version,
            revisions.c.content_hash,
            revisions.c.document,
            devices.c.name,
            tenants.c.name.label("tenant"),
        )
        .join(devices, devices.c.id == revisions.c.device_id)
        .join(tenants, tenants.c.id == devices.c.tenant_id)
        .order_by(revisions.c.id)
    )
    for rev in rows:
        name = f"{rev.tenant}/{rev.name} version={rev.version}"
        audited = audited_revisions.get((rev.device_id, rev.version))
        if audited is None:
            problems.append(
                AuditProblem("revisions", name, "has no audit entry (inserted directly)")
            )
            continue
        try:
            digest = document_digest(parse_document(json.loads(rev.document)))
        except (ValueError, DocumentError):
            digest = "(unparsable document)"
        if digest != audited or rev.content_hash != audited:
            problems.append(
                AuditProblem(
                    "revisions",
                    name,
                    f"document or content hash differs from the audited {audited} (edited)",
                )
            )
    for user in conn.execute(
        select(users.c.id, users.c.name, users.c.role, tenants.c.name.label("tenant")).join(
            tenants, tenants.c.id == users.c.tenant_id
        )
    ):
        name = f"{user.tenant}/{user.name}"
        audited_role = audited_roles.get(user.id)
        if audited_role is None:
            problems.append(AuditProblem("users", name, "has no audit entry (inserted directly)"))
        elif audited_role != user.role:
            problems.append(
                AuditProblem(
                    "users",
                    name,
                    f"role is {user.role} but the last audited role is {audited_role} (edited)",
                )
            )
    for token in conn.execute(select(tokens.c.id, tokens.c.kind, tokens.c.tenant_id)):
        if token.id not in audited_tokens:
            problems.append(
                AuditProblem(
                    "tokens",
                    f"id={token.id} ({token.kind}, tenant {token.tenant_id})",
                    "has no audit entry (inserted directly)",
                )
            )
    return problems
