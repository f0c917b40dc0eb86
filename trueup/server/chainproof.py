"""Credential state from a verified chain only: which tokens, device credentials and user
roles the audit log still vouches for.

Who calls it: `Store.credential_refusal` (authentication and the enrollment exchange, on
every lookup that misses the token cache) through one `CredentialProof` per process, and
`AuditTrail.verify_audit` (`trueup server audit verify`) through `credential_problems`.

A seal proves the server wrote a row, not that the row is in its newest state, so the
log decides whether a token was revoked or a role changed. The log can only decide from
rows it can vouch for: a row counts when its HMAC verifies, its seq follows the previous
row's and its `prev_hash` is the previous row's hash. Where that fails the chain has a
*break* (a row deleted, rewritten in place, or replaced by one from another chain): from
there on the log may be missing exactly the record that revoked a token or demoted a user.
So a credential is refused, with the break named, when any break lies at or after the
record that last stated it in full:

- a token (user, device credential, enrollment): its issuing record (`token.create`,
  `device.enroll`, `device.credential`; `audit.seal` for rows sealed on an upgrade) —
  a revocation may follow at any later seq;
- a user's role: the newest of `user.create`, `user.role`, `audit.seal` for that user.

A credential issued after the break, on a stretch that verifies, is vouched for by that
stretch and keeps working; that is how an operator recovers (`docs/control-plane.md`,
Audit). A token with no verified issuing record at all is refused too.

The walk is incremental: each process remembers the last row it read (seq, hash) and
reads only the rows from there on (one small query when nothing was written); the first
call reads the whole log. If the remembered row is gone or changed, it starts over from
seq 1. Rows deleted from the very end of the log leave no gap for the walk to see: that
is the checkpoint's to catch (`audit.anchor_problems`, which suspends authentication).
"""

from __future__ import annotations

import bisect
import hmac
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, RowMapping, select

from trueup.server.auditchain import GENESIS, AuditProblem, entry_hash
from trueup.server.audittables import TOKENS, USERS, replay
from trueup.server.auditverify import Facts
from trueup.server.keys import ServerKey
from trueup.server.tables import audit_log, devices, tenants, tokens, users

__all__ = ["ChainBreak", "CredentialProof", "credential_name", "credential_problems"]


@dataclass(frozen=True)
class ChainBreak:
    """The first seq from which the log cannot vouch for what follows, and why."""

    seq: int
    problem: str

    def __str__(self) -> str:
        return f"seq {self.seq} ({self.problem})"


@dataclass
class _Walk:
    """Rows verified in seq order; only the ones that verify are replayed into `facts`."""

    facts: Facts = field(default_factory=Facts)
    breaks: list[ChainBreak] = field(default_factory=list)
    expected: int = 1
    # The hash the next row must link to; None right after a break (nothing to link to).
    link: str | None = GENESIS
    # The last row read (seq, stored hash), verified or not: where the next read resumes.
    last: tuple[int, str] = (0, GENESIS)

    def feed(self, key: bytes, rows: Iterable[RowMapping]) -> None:
        for row in rows:
            seq = int(row["seq"])
            self.last = (seq, str(row["row_hash"]))
            if seq > self.expected:
                gap = "" if seq == self.expected + 1 else f"..{seq - 1}"
                self._break(self.expected, f"seq {self.expected}{gap} deleted")
            self.expected = seq + 1
            try:
                intact = hmac.compare_digest(entry_hash(key, row), str(row["row_hash"]))
            except (TypeError, ValueError):
                intact = False
            if not intact:
                self._break(seq, "its contents do not match its HMAC: rewritten")
                continue
            if self.link is not None and row["prev_hash"] != self.link:
                self._break(seq, "it does not link to the row before it: replaced or reordered")
            self.link = str(row["row_hash"])
            replay([row], self.facts)

    def _break(self, seq: int, problem: str) -> None:
        self.link = None
        self.breaks.append(ChainBreak(seq, problem))

    def break_since(self, seq: int) -> ChainBreak | None:
        """The first break at or after `seq`, or None."""
        index = bisect.bisect_left([b.seq for b in self.breaks], seq)
        return self.breaks[index] if index < len(self.breaks) else None

    def token_refusal(self, token_id: int) -> str | None:
        token = self.facts.of(TOKENS).get(token_id)
        if token is None:
            return "no verified audit record issues it" + self._anywhere()
        if token.revoked_seq is not None:
            return f"the audit log revoked it at seq {token.revoked_seq}"
        broken = self.break_since(token.seq)
        if broken is not None:
            return f"the audit chain is broken at {broken} after it was issued (seq {token.seq})"
        return None

    def role_refusal(self, user_id: int, role: str | None, subject: str = "its user") -> str | None:
        user = self.facts.of(USERS).get(user_id)
        if user is None:
            return f"no verified audit record creates {subject} (id {user_id})" + self._anywhere()
        if role is not None and user.role != role:
            return (
                f"{subject} has role {role} but the last audited role is {user.role} "
                f"(seq {user.seq})"
            )
        broken = self.break_since(user.seq)
        if broken is not None:
            return (
                f"the audit chain is broken at {broken} after {subject}'s role was recorded "
                f"(seq {user.seq})"
            )
        return None

    def _anywhere(self) -> str:
        return f" (the audit chain is broken at {self.breaks[0]})" if self.breaks else ""


def _rows_from(conn: Connection, seq: int) -> list[RowMapping]:
    return list(
        conn.execute(
            select(audit_log).where(audit_log.c.seq >= seq).order_by(audit_log.c.seq)
        ).mappings()
    )


class CredentialProof:
    """One process's verified walk of the log, extended on each `refresh`. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._walk = _Walk()

    def refresh(self, conn: Connection, server_key: ServerKey) -> None:
        """Verify and replay the rows appended since the last call (all of them the first
        time, or when the last row read is no longer there as it was)."""
        key = server_key.derive("audit")
        with self._lock:
            seq, row_hash = self._walk.last
            rows = _rows_from(conn, seq)  # seq 0: the whole log (seqs start at 1)
            if seq > 0:
                if rows and (int(rows[0]["seq"]), str(rows[0]["row_hash"])) == (seq, row_hash):
                    rows = rows[1:]
                else:  # the row read last is gone or changed: verify the whole log again
                    self._walk = _Walk()
                    rows = _rows_from(conn, 1)
            self._walk.feed(key, rows)

    def refusal(
        self, token_id: int, user_id: int | None = None, role: str | None = None
    ) -> str | None:
        """Why the verified log refuses this token (and its user's role), or None.
        Call `refresh` first."""
        with self._lock:
            refusal = self._walk.token_refusal(token_id)
            if refusal is None and user_id is not None:
                refusal = self._walk.role_refusal(user_id, role)
            return refusal


# -- naming the credentials for `audit verify` -------------------------------------------------


def _credential_name(row: Any) -> tuple[str, str]:
    """("token", "12 (tenant acme, user ops)") and the like, for an AuditProblem."""
    if row["kind"] == "user":
        return "token", f"{row['id']} (tenant {row['tenant']}, user {row['user']})"
    what = "device credential" if row["kind"] == "device" else "enrollment token"
    return what, f"{row['id']} (tenant {row['tenant']}, device {row['device']})"


def credential_name(row: Any) -> str:
    """How the server log and `audit verify` name a token row (id, kind, tenant, user,
    device): "token 12 (tenant acme, user ops)", "device credential 14 (tenant acme,
    device edge-01)"."""
    what, name = _credential_name(row)
    return f"{what} {name}"


def _token_problem(walk: _Walk, row: Any) -> str | None:
    token = walk.facts.of(TOKENS).get(row["id"])
    if token is not None and token.revoked_seq is not None:
        return (
            f"revoked at seq {token.revoked_seq} by the log, but the live row says active — refused"
        )
    refusal = walk.token_refusal(row["id"])
    if refusal is None and row["user_id"] is not None:
        refusal = walk.role_refusal(row["user_id"], row["role"])
    if refusal is None:
        return None
    if "chain is broken" in refusal:
        return f"accepted by the database, but {refusal} — refused until reissued"
    return f"{refusal} — refused"


def credential_problems(conn: Connection, server_key: ServerKey) -> list[AuditProblem]:
    """Every live credential the verified log contradicts or can no longer vouch for: active
    tokens (user, device, enrollment) and users' roles, each named."""
    walk = _Walk()
    walk.feed(server_key.derive("audit"), _rows_from(conn, 1))
    problems: list[AuditProblem] = []
    now = time.time()
    rows = conn.execute(
        select(
            tokens.c.id,
            tokens.c.kind,
            tokens.c.user_id,
            tokens.c.expires_at,
            tenants.c.name.label("tenant"),
            users.c.name.label("user"),
            users.c.role,
            devices.c.name.label("device"),
        )
        .join(tenants, tenants.c.id == tokens.c.tenant_id)
        .outerjoin(users, users.c.id == tokens.c.user_id)
        .outerjoin(devices, devices.c.id == tokens.c.device_id)
        .where(tokens.c.revoked_at.is_(None))
        .order_by(tokens.c.id)
    ).mappings()
    for row in rows:
        if row["expires_at"] is not None and row["expires_at"] < now:
            continue  # refused anyway
        problem = _token_problem(walk, row)
        if problem is not None:
            table, name = _credential_name(row)
            problems.append(AuditProblem(table, name, problem))
    for user in conn.execute(
        select(users.c.id, users.c.name, users.c.role, tenants.c.name.label("tenant"))
        .join(tenants, tenants.c.id == users.c.tenant_id)
        .order_by(users.c.id)
    ).mappings():
        refusal = walk.role_refusal(user["id"], user["role"], subject="the user")
        if refusal is None:
            continue
        after = " until its role is set again" if "chain is broken" in refusal else ""
        problems.append(
            AuditProblem(
                "user",
                f"{user['tenant']}/{user['name']}",
                f"role {user['role']} in the database, but {refusal} — its tokens are "
                f"refused{after}",
            )
        )
    return problems
