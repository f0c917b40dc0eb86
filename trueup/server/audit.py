"""The append-only, hash-chained audit log, its anchor, and the seals it vouches for.

Why this module is over 400 lines: verification replays every kind of entry
and checks every security-relevant table against the replay; keeping the
writer, the replay and the checks together keeps what an entry records and
what verification expects in one place.

Every write the control plane makes (tenant, user, role change, token,
enrollment, credential, revision, acknowledgement, secret, backup upload and
delete) appends one row in
the same transaction as the write itself. Each row's hash is an HMAC, keyed by
the server key, over its fields and the previous row's hash; `audit_head`
holds the newest (seq, hash) and is row-locked by every writer, so the chain
stays linear across server processes.

Anchoring: the rows cannot vouch for their own end. After each audited write
commits, the writer advances a signed checkpoint of the head in a file next
to the server key (anchor.py), outside the database; a chain whose stored
rows end before the checkpoint, or differ from it, was truncated or rewound
(`anchor_problems`). Authentication refuses every token while that is so
(service/auth.py): a revocation that was deleted from the log and undone in
the table does not revive the token.

Seals: each token and user row carries an HMAC under the server key over its
security-relevant fields (`token_seal`, `user_seal`); authentication refuses
a row whose seal does not match, so a token hash replaced in the database, or
a role raised, does not authenticate. Whether the log still vouches for a
credential (revoked? role? a break in the chain after it was issued?) is
decided from the rows that verify, in chainproof.py.

`verify()` never raises: it lists every problem it finds. It checks the chain
(edited, deleted, inserted rows; the head), the anchor, and replays the log
to compare every live row with what was audited: tenants, users (tenant,
name, role), devices (tenant, name, desired version), tokens (tenant, kind,
user, device, hash, revocation, seal), revisions (content, and that every
audited revision still exists), acknowledgements, secrets and device backups
(every stored one audited with its sha256 and size, none deleted unaudited);
coverchecks.py adds secret versions and values, deleted secrets,
notification targets, evidence bundles and revision authors and comments,
inputchecks.py profile versions and device inputs (over coverage.py's replay
of the same entries). Entries written
by an older trueup that lack a field are reported as "not covered"
(`AuditProblem.gap`), not as tampering.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, func, select, update

from trueup.model.digests import canonical_json
from trueup.model.document import DocumentError, document_digest, parse_document
from trueup.server import coverage, coverchecks, inputchecks
from trueup.server.anchor import SUFFIX, Checkpoint, CheckpointError, CheckpointFile
from trueup.server.keys import ServerKey
from trueup.server.tables import (
    acks,
    audit_head,
    audit_log,
    backup_chunks,
    backups,
    devices,
    revisions,
    secrets,
    tenants,
    tokens,
    users,
)

__all__ = [
    "GENESIS",
    "AuditProblem",
    "advance_checkpoint",
    "anchor_problems",
    "append",
    "checkpoint_file",
    "reanchor",
    "row_hash_ok",
    "seal_unsealed",
    "token_seal",
    "token_seal_ok",
    "user_seal",
    "user_seal_ok",
    "verify",
]

GENESIS = "0" * 64
_log = logging.getLogger("trueup.server.audit")
# Rows per `audit.seal` entry when rows written by an older trueup are sealed.
_SEAL_BATCH = 500


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


def _canonical(value: Any) -> str:
    return canonical_json(value).decode()


def _row_hash(key: bytes, row: Any) -> str:
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


def row_hash_ok(server_key: ServerKey, row: Any) -> bool:
    """Does an audit row carry its own HMAC (edited or forged rows do not)?"""
    try:
        return hmac.compare_digest(_row_hash(server_key.derive("audit"), row), str(row["row_hash"]))
    except (TypeError, ValueError):
        return False


def _iso(at: float) -> str:
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


def _seal(server_key: ServerKey, purpose: str, fields: list[Any]) -> str:
    body = _canonical(fields).encode()
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


def _token_row_seal(server_key: ServerKey, row: Any) -> str:
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


def _user_row_seal(server_key: ServerKey, row: Any) -> str:
    return user_seal(
        server_key,
        user_id=row["id"],
        tenant_id=row["tenant_id"],
        name=row["name"],
        role=row["role"],
    )


def token_seal_ok(server_key: ServerKey, row: Any) -> bool:
    """Does a token row (id, tenant_id, kind, user_id, device_id, token_hash, expires_at,
    seal) carry its own seal?"""
    seal = row["seal"]
    return seal is not None and hmac.compare_digest(_token_row_seal(server_key, row), seal)


def user_seal_ok(server_key: ServerKey, row: Any) -> bool:
    """Does a user row (id, tenant_id, name, role, seal) carry its own seal?"""
    seal = row["seal"]
    return seal is not None and hmac.compare_digest(_user_row_seal(server_key, row), seal)


# -- the anchor outside the database -------------------------------------------------------


def checkpoint_file(server_key: ServerKey) -> CheckpointFile | None:
    """The checkpoint file in the server's data directory (by default beside the key
    file); None for a key that came from no file."""
    if server_key.path is None or server_key.data_dir is None:
        return None
    path = server_key.data_dir / (server_key.path.name + SUFFIX)
    return CheckpointFile(path, server_key.derive("audit-checkpoint"))


def _first_row_hash(conn: Connection) -> str | None:
    return conn.execute(
        select(audit_log.c.row_hash).where(audit_log.c.seq == 1)
    ).scalar_one_or_none()


def _read_checkpoints(
    server_key: ServerKey,
) -> tuple[CheckpointFile | None, dict[str, Checkpoint] | CheckpointError]:
    file = checkpoint_file(server_key)
    if file is None:
        return None, {}
    try:
        return file, file.read()
    except CheckpointError as exc:
        return file, exc


def anchor_problems(conn: Connection, server_key: ServerKey) -> list[AuditProblem]:
    """Is the stored chain at or past its checkpoint? Reads the file before the database,
    so a writer committing meanwhile (database first, then file) cannot look like a rewind."""
    file, chains = _read_checkpoints(server_key)
    if file is None:
        return [
            AuditProblem(
                "checkpoint",
                "-",
                "the server key was not read from a file, so there is no checkpoint file: "
                "truncation and rewinding of the chain are not detected",
                gap=True,
            )
        ]
    if isinstance(chains, CheckpointError):
        return [AuditProblem("checkpoint", str(file.path), str(chains))]
    head = conn.execute(
        select(audit_head.c.seq, audit_head.c.row_hash).where(audit_head.c.id == 1)
    ).one_or_none()
    first = _first_row_hash(conn)
    if first is None:
        if head is not None and head.seq > 0:
            return [
                AuditProblem(
                    "audit_log",
                    "seq=1",
                    f"missing while the head is at seq={head.seq}: the chain's start was deleted",
                )
            ]
        return []  # nothing audited yet
    cp = chains.get(first)
    if cp is None:
        return [
            AuditProblem(
                "checkpoint",
                str(file.path),
                "no checkpoint for this database's chain yet (no audited write since the "
                "upgrade, or the file was lost): rows deleted from its end are not detected",
                gap=True,
            )
        ]
    problems = []
    stored = conn.execute(
        select(audit_log.c.row_hash).where(audit_log.c.seq == cp.seq)
    ).scalar_one_or_none()
    when = f"the checkpoint of {_iso(cp.at)} in {file.path}"
    if stored is None:
        problems.append(
            AuditProblem(
                "audit_log",
                f"seq={cp.seq}",
                f"missing, but {when} records it: rows were deleted from the end of the chain "
                "(truncated or rewound)",
            )
        )
    elif not hmac.compare_digest(stored, cp.row_hash):
        problems.append(
            AuditProblem(
                "audit_log",
                f"seq={cp.seq}",
                f"differs from {when}: the chain was rewritten from this row on",
            )
        )
    if head is not None and head.seq < cp.seq:
        problems.append(
            AuditProblem(
                "audit_head",
                f"seq={head.seq}",
                f"behind {when} (seq={cp.seq}): the head was rewound",
            )
        )
    return problems


def advance_checkpoint(conn: Connection, server_key: ServerKey) -> Checkpoint | None:
    """Move the checkpoint to the newest committed row, if the chain since the checkpoint
    is intact (links, HMACs, the checkpointed row unchanged). Call it after a commit.

    A chain that no longer contains its checkpoint keeps it: the evidence stays.
    """
    file = checkpoint_file(server_key)
    if file is None:
        return None
    first = _first_row_hash(conn)
    if first is None:
        return None
    newest = conn.execute(
        select(audit_log.c.seq, audit_log.c.row_hash).order_by(audit_log.c.seq.desc()).limit(1)
    ).one()
    key = server_key.derive("audit")

    def step(current: Checkpoint | None) -> Checkpoint | None:
        if current is not None and current.seq >= newest.seq:
            return None
        # Trust on first anchoring: the newest row alone (verify checks the whole chain).
        start = newest.seq if current is None else current.seq
        rows = conn.execute(
            select(audit_log)
            .where(audit_log.c.seq >= start, audit_log.c.seq <= newest.seq)
            .order_by(audit_log.c.seq)
        ).mappings()
        expected, prev = start, None if current is None else current.row_hash
        for row in rows:
            if row["seq"] != expected or not hmac.compare_digest(
                _row_hash(key, row), row["row_hash"]
            ):
                break
            if prev is not None and (
                row["prev_hash"] != prev if row["seq"] != start else row["row_hash"] != prev
            ):
                break
            expected, prev = row["seq"] + 1, row["row_hash"]
        if expected != newest.seq + 1:
            _log.error(
                "audit checkpoint kept at seq=%s: the chain up to seq=%s does not extend it "
                "(run `trueup server audit verify`)",
                None if current is None else current.seq,
                newest.seq,
            )
            return None
        return Checkpoint(first, int(newest.seq), str(newest.row_hash), time.time())

    try:
        return file.advance(first, step)
    except (CheckpointError, OSError) as exc:
        _log.error("audit checkpoint not advanced: %s", exc)
        return None


def reanchor(conn: Connection, server_key: ServerKey) -> Checkpoint:
    """Checkpoint the newest row unconditionally: after an operator restored a backup and
    checked it (the caller appends an `audit.reanchor` entry first). Raises CheckpointError."""
    file = checkpoint_file(server_key)
    if file is None:
        raise CheckpointError("the server key was not read from a file: no checkpoint file")
    first = _first_row_hash(conn)
    newest = conn.execute(
        select(audit_log.c.seq, audit_log.c.row_hash).order_by(audit_log.c.seq.desc()).limit(1)
    ).one_or_none()
    if first is None or newest is None:
        raise CheckpointError("the audit log is empty (or its first row is missing)")
    cp = Checkpoint(first, int(newest.seq), str(newest.row_hash), time.time())
    file.replace(cp)
    return cp


# -- replaying the log ---------------------------------------------------------------------


class _Malformed(Exception):
    pass


def _int(detail: dict[str, Any], key: str, *, required: bool = False) -> int | None:
    value = detail.get(key)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if required or value is not None:
        raise _Malformed(f"{key!r} is {'missing' if value is None else 'not an integer'}")
    return None


def _str(detail: dict[str, Any], key: str, *, required: bool = False) -> str | None:
    value = detail.get(key)
    if isinstance(value, str):
        return value
    if required or value is not None:
        raise _Malformed(f"{key!r} is {'missing' if value is None else 'not a string'}")
    return None


def _ints(detail: dict[str, Any], key: str) -> list[int]:
    value = detail.get(key, [])
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        raise _Malformed(f"{key!r} is not a list of integers")
    return value


def _after(target: str, prefix: str) -> str | None:
    return target[len(prefix) :] if target.startswith(prefix) else None


@dataclass
class _Token:
    seq: int
    tenant_id: int | None
    kind: str
    user_id: int | None = None
    device_id: int | None = None
    token_hash: str | None = None  # None: written by an older trueup
    revoked_seq: int | None = None


@dataclass
class _User:
    seq: int
    tenant_id: int | None
    name: str | None
    role: str


@dataclass
class _Facts:
    """What the log says the security-relevant tables hold."""

    tenants: dict[int, tuple[int, str | None]] = field(default_factory=dict)
    users: dict[int, _User] = field(default_factory=dict)
    devices: dict[int, tuple[int, int | None, str | None]] = field(default_factory=dict)
    tokens: dict[int, _Token] = field(default_factory=dict)
    revisions: dict[tuple[int, int], tuple[int, str]] = field(default_factory=dict)
    acks: dict[int, tuple[int, int | None, str | None, float | None]] = field(default_factory=dict)
    secrets: dict[str, tuple[int, int | None, int | None, str | None]] = field(default_factory=dict)
    # backup id -> (seq, tenant, device, sha256, size); deleted ones -> the deleting seq
    backups: dict[int, tuple[int, int | None, int, str, int]] = field(default_factory=dict)
    deleted_backups: dict[int, int] = field(default_factory=dict)
    user_ids: dict[tuple[int | None, str], int] = field(default_factory=dict)
    device_ids: dict[tuple[int | None, str], int] = field(default_factory=dict)

    def revoke(self, token_ids: Iterable[int], seq: int) -> None:
        for token_id in token_ids:
            if token_id in self.tokens:
                self.tokens[token_id].revoked_seq = seq

    def device_of(self, entry: Any, detail: dict[str, Any]) -> int | None:
        device_id = _int(detail, "device_id")
        if device_id is None:  # older entries name the device in the target
            name = _after(entry["target"], "device:")
            if name is not None:
                device_id = self.device_ids.get((entry["tenant_id"], name.split("/secret:")[0]))
        return device_id


def _apply(facts: _Facts, entry: Any, detail: dict[str, Any]) -> None:
    action, seq, tenant_id, target = (
        entry["action"],
        entry["seq"],
        entry["tenant_id"],
        entry["target"],
    )
    if action == "tenant.create":
        if not isinstance(tenant_id, int):
            raise _Malformed("no tenant id")
        facts.tenants[tenant_id] = (seq, _after(target, "tenant:"))
    elif action in ("user.create", "user.role"):
        user_id = _int(detail, "user_id", required=True)
        role = _str(detail, "role", required=True)
        assert user_id is not None and role is not None
        name = _after(target, "user:")
        facts.users[user_id] = _User(seq, tenant_id, name, role)
        if name is not None:
            facts.user_ids[(tenant_id, name)] = user_id
    elif action == "device.create":
        device_id = _int(detail, "device_id", required=True)
        assert device_id is not None
        name = _after(target, "device:")
        facts.devices[device_id] = (seq, tenant_id, name)
        if name is not None:
            facts.device_ids[(tenant_id, name)] = device_id
    elif action == "token.create":
        token_id = _int(detail, "token_id", required=True)
        assert token_id is not None
        user_id = _int(detail, "user_id")
        if user_id is None:
            user_id = facts.user_ids.get((tenant_id, _after(target, "user:") or ""))
        facts.tokens[token_id] = _Token(
            seq, tenant_id, "user", user_id=user_id, token_hash=_str(detail, "token_hash")
        )
    elif action == "device.enroll":
        token_id = _int(detail, "token_id", required=True)
        assert token_id is not None
        facts.revoke(_ints(detail, "revoked_token_ids"), seq)
        facts.tokens[token_id] = _Token(
            seq,
            tenant_id,
            "enrollment",
            device_id=facts.device_of(entry, detail),
            token_hash=_str(detail, "token_hash"),
        )
    elif action == "device.credential":
        token_id = _int(detail, "token_id", required=True)
        enrollment = _int(detail, "enrollment_token_id")
        assert token_id is not None
        facts.revoke([enrollment] if enrollment is not None else [], seq)
        facts.revoke(_ints(detail, "revoked_token_ids"), seq)
        facts.tokens[token_id] = _Token(
            seq,
            tenant_id,
            "device",
            device_id=facts.device_of(entry, detail),
            token_hash=_str(detail, "token_hash"),
        )
    elif action == "token.revoke":
        token_id = _int(detail, "token_id")
        if token_id is None:
            number = _after(target, "token:") or ""
            if not number.isdigit():
                raise _Malformed("no token id")
            token_id = int(number)
        facts.revoke([token_id], seq)
    elif action == "revision.create":
        device_id = _int(detail, "device_id", required=True)
        version = _int(detail, "version", required=True)
        content_hash = _str(detail, "content_hash", required=True)
        assert device_id is not None and version is not None and content_hash is not None
        facts.revisions[(device_id, version)] = (seq, content_hash)
    elif action == "ack.create":
        ack_id = _int(detail, "ack_id", required=True)
        assert ack_id is not None
        expires = detail.get("expires_at")
        facts.acks[ack_id] = (
            seq,
            facts.device_of(entry, detail),
            _str(detail, "subsystem"),
            float(expires) if isinstance(expires, int | float) else None,
        )
    elif action == "secret.put":
        secret_id = _str(detail, "secret_id", required=True)
        assert secret_id is not None
        name = target.split("/secret:", 1)[1] if "/secret:" in target else None
        facts.secrets[secret_id] = (seq, tenant_id, facts.device_of(entry, detail), name)
    elif action == "audit.seal":
        _apply_seal(facts, seq, detail)
    elif action in ("backup.upload", "backup.delete"):
        _apply_backup(facts, entry, detail)


def _apply_backup(facts: _Facts, entry: Any, detail: dict[str, Any]) -> None:
    backup_id = _int(detail, "backup_id", required=True)
    device_id = _int(detail, "device_id", required=True)
    assert backup_id is not None and device_id is not None
    if entry["action"] == "backup.delete":
        facts.backups.pop(backup_id, None)
        facts.deleted_backups[backup_id] = entry["seq"]
        return
    sha256 = _str(detail, "sha256", required=True)
    size = _int(detail, "size", required=True)
    assert sha256 is not None and size is not None
    facts.backups[backup_id] = (entry["seq"], entry["tenant_id"], device_id, sha256, size)


def _apply_seal(facts: _Facts, seq: int, detail: dict[str, Any]) -> None:
    for item in detail.get("tokens", []):
        if not isinstance(item, dict):
            raise _Malformed("a sealed token is not an object")
        token_id = _int(item, "token_id", required=True)
        kind = _str(item, "kind", required=True)
        assert token_id is not None and kind is not None
        token = _Token(
            seq,
            _int(item, "tenant_id"),
            kind,
            user_id=_int(item, "user_id"),
            device_id=_int(item, "device_id"),
            token_hash=_str(item, "token_hash", required=True),
        )
        previous = facts.tokens.get(token_id)
        token.revoked_seq = previous.revoked_seq if previous is not None else None
        if item.get("revoked") is True and token.revoked_seq is None:
            token.revoked_seq = seq
        facts.tokens[token_id] = token
    for item in detail.get("users", []):
        if not isinstance(item, dict):
            raise _Malformed("a sealed user is not an object")
        user_id = _int(item, "user_id", required=True)
        role = _str(item, "role", required=True)
        assert user_id is not None and role is not None
        facts.users[user_id] = _User(seq, _int(item, "tenant_id"), _str(item, "name"), role)


def _entry_name(entry: Any) -> str:
    return f"seq={entry['seq']} ({entry['action']} {entry['target']})"


def _replay(
    entries: Iterable[Any], facts: _Facts | None = None
) -> tuple[_Facts, list[AuditProblem]]:
    """`facts` (new ones by default) with `entries` applied in order, and the malformed ones."""
    facts = _Facts() if facts is None else facts
    problems = []
    for entry in entries:
        try:
            detail = json.loads(entry["detail"])
            if not isinstance(detail, dict):
                raise _Malformed("detail is not a JSON object")
            _apply(facts, entry, detail)
        except (_Malformed, ValueError, TypeError, KeyError, AttributeError) as exc:
            problems.append(
                AuditProblem(
                    "audit_log",
                    _entry_name(entry),
                    f"detail malformed ({exc}); the rows this entry vouches for are not covered",
                )
            )
    return facts, problems


# -- verification --------------------------------------------------------------------------


def verify(conn: Connection, server_key: ServerKey) -> list[AuditProblem]:
    """Every inconsistency between the chain, its anchor, its head and the live tables.

    Never raises: a check that fails unexpectedly is itself reported.
    """
    problems: list[AuditProblem] = []
    entries: list[dict[str, Any]] = []

    def run(what: str, check: Callable[[], list[AuditProblem]]) -> None:
        try:
            problems.extend(check())
        except Exception as exc:  # verification reports; it never stops half-way
            problems.append(AuditProblem("verify", what, f"could not be checked: {exc!r}"))

    run("checkpoint", lambda: anchor_problems(conn, server_key))
    run("audit_log", lambda: _check_chain(conn, server_key, entries))
    facts, replay_problems = _replay(entries)
    problems.extend(replay_problems)
    for name, check in _LIVE_CHECKS.items():
        run(name, functools.partial(check, conn, server_key, facts))
    covered = coverage.replay(entries)
    for name, cover_check in {**coverchecks.CHECKS, **inputchecks.CHECKS}.items():
        run(name, functools.partial(_cover_problems, cover_check, conn, server_key, covered))
    return problems


def _cover_problems(
    check: Callable[[Connection, ServerKey, coverage.CoverFacts], list[coverchecks.Finding]],
    conn: Connection,
    server_key: ServerKey,
    covered: coverage.CoverFacts,
) -> list[AuditProblem]:
    return [
        AuditProblem(f.table, f.row, f.problem, f.gap) for f in check(conn, server_key, covered)
    ]


def _check_chain(
    conn: Connection, server_key: ServerKey, entries: list[dict[str, Any]]
) -> list[AuditProblem]:
    key = server_key.derive("audit")
    problems: list[AuditProblem] = []
    expected_seq = 1
    prev_hash = GENESIS
    for r in conn.execute(select(audit_log).order_by(audit_log.c.seq)).mappings():
        row = dict(r)
        name = _entry_name(row)
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
        try:
            intact = hmac.compare_digest(_row_hash(key, row), str(row["row_hash"]))
        except (TypeError, ValueError):
            intact = False
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
        # Only rows that authenticate vouch for anything.
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


def _not_audited(table: str, name: str) -> AuditProblem:
    return AuditProblem(table, name, "has no audit entry (inserted directly)")


def _differs(table: str, name: str, what: str, live: Any, audited: Any, seq: int) -> AuditProblem:
    return AuditProblem(
        table,
        name,
        f"{what} is {live!r} but the audit log (seq={seq}) says {audited!r} "
        "(changed behind the server's back)",
    )


def _field_problems(
    table: str, name: str, row: Any, seq: int, audited: dict[str, Any]
) -> list[AuditProblem]:
    """A problem for each field whose live value differs from the audited one (None: unaudited)."""
    return [
        _differs(table, name, what, row[what], value, seq)
        for what, value in audited.items()
        if value is not None and row[what] != value
    ]


def _check_tenants(conn: Connection, _key: ServerKey, facts: _Facts) -> list[AuditProblem]:
    problems = []
    for t in conn.execute(select(tenants.c.id, tenants.c.name).order_by(tenants.c.id)):
        name = f"{t.name} (id={t.id})"
        fact = facts.tenants.get(t.id)
        if fact is None:
            problems.append(_not_audited("tenants", name))
        elif fact[1] is not None and fact[1] != t.name:
            problems.append(_differs("tenants", name, "name", t.name, fact[1], fact[0]))
    return problems


def _check_users(conn: Connection, key: ServerKey, facts: _Facts) -> list[AuditProblem]:
    problems = []
    rows = conn.execute(
        select(users, tenants.c.name.label("tenant"))
        .join(tenants, tenants.c.id == users.c.tenant_id)
        .order_by(users.c.id)
    ).mappings()
    for user in rows:
        name = f"{user['tenant']}/{user['name']}"
        fact = facts.users.get(user["id"])
        if fact is None:
            problems.append(_not_audited("users", name))
            continue
        if fact.role != user["role"]:
            problems.append(
                AuditProblem(
                    "users",
                    name,
                    f"role is {user['role']} but the last audited role is {fact.role} (edited)",
                )
            )
        if fact.tenant_id is not None and fact.tenant_id != user["tenant_id"]:
            problems.append(
                _differs("users", name, "tenant", user["tenant_id"], fact.tenant_id, fact.seq)
            )
        if fact.name is not None and fact.name != user["name"]:
            problems.append(_differs("users", name, "name", user["name"], fact.name, fact.seq))
        if user["seal"] is None:
            problems.append(
                AuditProblem("users", name, "not sealed (written by an older trueup)", gap=True)
            )
        elif not user_seal_ok(key, user):
            problems.append(
                AuditProblem(
                    "users",
                    name,
                    "seal does not match the row (changed behind the server's back); "
                    "authentication refuses this user's tokens",
                )
            )
    return problems


def _check_tokens(conn: Connection, key: ServerKey, facts: _Facts) -> list[AuditProblem]:
    problems = []
    for token in conn.execute(select(tokens).order_by(tokens.c.id)).mappings():
        name = f"id={token['id']} ({token['kind']}, tenant {token['tenant_id']})"
        fact = facts.tokens.get(token["id"])
        if fact is None:
            problems.append(_not_audited("tokens", name))
            continue
        problems += _field_problems(
            "tokens",
            name,
            token,
            fact.seq,
            {
                "tenant_id": fact.tenant_id,
                "kind": fact.kind,
                "user_id": fact.user_id,
                "device_id": fact.device_id,
            },
        )
        if fact.token_hash is None:
            problems.append(
                AuditProblem(
                    "tokens",
                    name,
                    "its hash is not in the audit log (written by an older trueup)",
                    gap=True,
                )
            )
        elif not hmac.compare_digest(str(token["token_hash"]), fact.token_hash):
            problems.append(
                AuditProblem(
                    "tokens",
                    name,
                    f"token_hash differs from the one audited at seq={fact.seq}: replaced "
                    "behind the server's back (a token chosen by someone else)",
                )
            )
        if fact.revoked_seq is not None and token["revoked_at"] is None:
            problems.append(
                AuditProblem(
                    "tokens",
                    name,
                    f"revoked at seq={fact.revoked_seq} but not revoked in the table "
                    "(revocation undone)",
                )
            )
        if token["seal"] is None:
            problems.append(
                AuditProblem("tokens", name, "not sealed (written by an older trueup)", gap=True)
            )
        elif not token_seal_ok(key, token):
            problems.append(
                AuditProblem(
                    "tokens",
                    name,
                    "seal does not match the row (changed behind the server's back); "
                    "authentication refuses this token",
                )
            )
    return problems


def _device_names(conn: Connection) -> dict[int, str]:
    rows = conn.execute(
        select(devices.c.id, devices.c.name, tenants.c.name.label("tenant")).join(
            tenants, tenants.c.id == devices.c.tenant_id
        )
    )
    return {r.id: f"{r.tenant}/{r.name}" for r in rows}


def _check_devices(conn: Connection, _key: ServerKey, facts: _Facts) -> list[AuditProblem]:
    problems = []
    newest: dict[int, tuple[int, int]] = {}
    for (device_id, version), (seq, _hash) in facts.revisions.items():
        if version > newest.get(device_id, (0, 0))[0]:
            newest[device_id] = (version, seq)
    names = _device_names(conn)
    for dev in conn.execute(select(devices).order_by(devices.c.id)).mappings():
        name = names.get(dev["id"], f"id={dev['id']}")
        fact = facts.devices.get(dev["id"])
        if fact is None:
            problems.append(_not_audited("devices", name))
        else:
            seq, tenant_id, audited_name = fact
            if tenant_id is not None and tenant_id != dev["tenant_id"]:
                problems.append(
                    _differs("devices", name, "tenant", dev["tenant_id"], tenant_id, seq)
                )
            if audited_name is not None and audited_name != dev["name"]:
                problems.append(_differs("devices", name, "name", dev["name"], audited_name, seq))
        version, seq = newest.get(dev["id"], (0, 0))
        if dev["desired_version"] != version:
            problems.append(
                AuditProblem(
                    "devices",
                    name,
                    f"desired_version is {dev['desired_version']} but the newest audited "
                    f"revision is version {version}"
                    + (f" (seq={seq})" if seq else "")
                    + ": rewound or advanced behind the server's back",
                )
            )
    return problems


def _check_revisions(conn: Connection, _key: ServerKey, facts: _Facts) -> list[AuditProblem]:
    problems = []
    names = _device_names(conn)
    live: set[tuple[int, int]] = set()
    for rev in conn.execute(select(revisions).order_by(revisions.c.id)).mappings():
        live.add((rev["device_id"], rev["version"]))
        device = names.get(rev["device_id"], f"device id={rev['device_id']}")
        name = f"{device} version={rev['version']}"
        audited = facts.revisions.get((rev["device_id"], rev["version"]))
        if audited is None:
            problems.append(_not_audited("revisions", name))
            continue
        try:
            digest = document_digest(parse_document(json.loads(rev["document"])))
        except (ValueError, TypeError, DocumentError):
            digest = "(unparsable document)"
        if digest != audited[1] or rev["content_hash"] != audited[1]:
            problems.append(
                AuditProblem(
                    "revisions",
                    name,
                    f"document or content hash differs from the audited {audited[1]} (edited)",
                )
            )
    for (device_id, version), (seq, _hash) in sorted(facts.revisions.items()):
        if (device_id, version) not in live:
            device = names.get(device_id, f"device id={device_id}")
            problems.append(
                AuditProblem(
                    "revisions",
                    f"{device} version={version}",
                    f"audited at seq={seq} but missing from the table (deleted)",
                )
            )
    return problems


def _check_acks(conn: Connection, _key: ServerKey, facts: _Facts) -> list[AuditProblem]:
    problems = []
    live = set()
    for ack in conn.execute(select(acks).order_by(acks.c.id)).mappings():
        live.add(ack["id"])
        name = f"id={ack['id']} ({ack['subsystem']})"
        fact = facts.acks.get(ack["id"])
        if fact is None:
            problems.append(_not_audited("acks", name))
            continue
        seq, device_id, subsystem, expires_at = fact
        problems += _field_problems(
            "acks",
            name,
            ack,
            seq,
            {"device_id": device_id, "subsystem": subsystem, "expires_at": expires_at},
        )
    for ack_id, (seq, *_rest) in sorted(facts.acks.items()):
        if ack_id not in live:
            problems.append(
                AuditProblem("acks", f"id={ack_id}", f"audited at seq={seq} but missing (deleted)")
            )
    return problems


def _check_secrets(conn: Connection, _key: ServerKey, facts: _Facts) -> list[AuditProblem]:
    problems = []
    for secret in conn.execute(
        select(secrets.c.id, secrets.c.tenant_id, secrets.c.device_id, secrets.c.name)
    ).mappings():
        name = f"{secret['id']} ({secret['name']})"
        fact = facts.secrets.get(secret["id"])
        if fact is None:
            problems.append(_not_audited("secrets", name))
            continue
        seq, tenant_id, device_id, audited_name = fact
        problems += _field_problems(
            "secrets",
            name,
            secret,
            seq,
            {"tenant_id": tenant_id, "device_id": device_id, "name": audited_name},
        )
    return problems


def _check_backups(conn: Connection, _key: ServerKey, facts: _Facts) -> list[AuditProblem]:
    """Every stored backup audited as uploaded (tenant, device, sha256, size, and its chunks
    adding up to the size); every audited upload not audited as deleted still present."""
    problems = []
    stored = dict(
        conn.execute(
            select(backup_chunks.c.backup_id, func.sum(func.length(backup_chunks.c.data))).group_by(
                backup_chunks.c.backup_id
            )
        ).all()
    )
    live = set()
    for row in conn.execute(select(backups).order_by(backups.c.id)).mappings():
        live.add(row["id"])
        name = f"id={row['id']}"
        fact = facts.backups.get(row["id"])
        if fact is None:
            deleted = facts.deleted_backups.get(row["id"])
            problems.append(
                _not_audited("backups", name)
                if deleted is None
                else AuditProblem(
                    "backups", name, f"deleted at seq={deleted} but still present (restored)"
                )
            )
            continue
        seq, tenant_id, device_id, sha256, size = fact
        problems += _field_problems(
            "backups",
            name,
            row,
            seq,
            {"tenant_id": tenant_id, "device_id": device_id, "sha256": sha256, "size": size},
        )
        content = int(stored.get(row["id"]) or 0)
        if content != size:
            problems.append(
                AuditProblem(
                    "backups",
                    name,
                    f"its chunks hold {content} bytes but {size} were audited at seq={seq} "
                    "(content changed behind the server's back)",
                )
            )
    for backup_id, (seq, *_rest) in sorted(facts.backups.items()):
        if backup_id not in live:
            problems.append(
                AuditProblem(
                    "backups",
                    f"id={backup_id}",
                    f"uploaded at seq={seq}, never audited as deleted, but missing (deleted "
                    "behind the server's back)",
                )
            )
    return problems


_LIVE_CHECKS: dict[str, Callable[[Connection, ServerKey, _Facts], list[AuditProblem]]] = {
    "tenants": _check_tenants,
    "users": _check_users,
    "devices": _check_devices,
    "tokens": _check_tokens,
    "revisions": _check_revisions,
    "acks": _check_acks,
    "secrets": _check_secrets,
    "backups": _check_backups,
}


# -- sealing rows written by an older trueup -------------------------------------------------


def _matches(fact_value: Any, live: Any) -> bool:
    return fact_value is None or fact_value == live


def _verified_entries(conn: Connection, server_key: ServerKey) -> tuple[list[Any], list[int]]:
    """The rows whose HMAC verifies, in seq order, and every seq where the chain breaks (a
    gap, a row whose HMAC fails, a row that does not link to the one before it) — the same
    rule as chainproof's walk, so sealing never vouches for a row the walk would refuse."""
    key = server_key.derive("audit")
    entries: list[Any] = []
    breaks: list[int] = []
    expected = 1
    link: str | None = GENESIS
    for r in conn.execute(select(audit_log).order_by(audit_log.c.seq)).mappings():
        seq = int(r["seq"])
        if seq > expected:
            breaks.append(expected)
            link = None
        expected = seq + 1
        try:
            intact = hmac.compare_digest(_row_hash(key, r), str(r["row_hash"]))
        except (TypeError, ValueError):
            intact = False
        if not intact:
            breaks.append(seq)
            link = None
            continue
        if link is not None and r["prev_hash"] != link:
            breaks.append(seq)
        link = str(r["row_hash"])
        entries.append(r)
    return entries, breaks


def seal_unsealed(conn: Connection, server_key: ServerKey, actor: str) -> int:
    """Seal the token and user rows without a seal that the audit log vouches for.

    Rows from before seals existed are sealed once (the next server start after the
    upgrade); a row the log does not vouch for, or contradicts, stays unsealed and
    authentication keeps refusing it. Each batch is recorded in an `audit.seal` entry
    with the sealed facts, so verification covers these rows from then on.
    Call inside a write transaction. Returns the number of rows sealed.
    """
    unsealed_tokens = list(
        conn.execute(select(tokens).where(tokens.c.seal.is_(None)).order_by(tokens.c.id))
        .mappings()
        .all()
    )
    unsealed_users = list(
        conn.execute(select(users).where(users.c.seal.is_(None)).order_by(users.c.id))
        .mappings()
        .all()
    )
    if not unsealed_tokens and not unsealed_users:
        return 0
    entries, breaks = _verified_entries(conn, server_key)
    facts, _problems = _replay(entries)

    def broken_since(seq: int) -> int | None:
        """The first break in the chain at or after `seq`: the log may be missing a later
        record of the row (a revocation, a demotion), so it cannot vouch for it."""
        return next((b for b in breaks if b >= seq), None)

    sealed_tokens: list[dict[str, Any]] = []
    for row in unsealed_tokens:
        fact = facts.tokens.get(row["id"])
        if fact is not None and broken_since(fact.seq) is not None:
            _log.error(
                "token id=%s not sealed: the audit chain is broken at seq=%s after it was "
                "issued (seq=%s)",
                row["id"],
                broken_since(fact.seq),
                fact.seq,
            )
            continue
        if (
            fact is None
            or not _matches(fact.tenant_id, row["tenant_id"])
            or fact.kind != row["kind"]
            or not _matches(fact.user_id, row["user_id"])
            or not _matches(fact.device_id, row["device_id"])
            or not _matches(fact.token_hash, row["token_hash"])
            or (fact.revoked_seq is not None and row["revoked_at"] is None)
        ):
            _log.error("token id=%s not sealed: the audit log does not vouch for it", row["id"])
            continue
        conn.execute(
            update(tokens)
            .where(tokens.c.id == row["id"])
            .values(seal=_token_row_seal(server_key, row))
        )
        sealed_tokens.append(
            {
                "token_id": row["id"],
                "tenant_id": row["tenant_id"],
                "kind": row["kind"],
                "user_id": row["user_id"],
                "device_id": row["device_id"],
                "token_hash": row["token_hash"],
                "revoked": row["revoked_at"] is not None,
            }
        )
    sealed_users: list[dict[str, Any]] = []
    for row in unsealed_users:
        user = facts.users.get(row["id"])
        if user is not None and broken_since(user.seq) is not None:
            _log.error(
                "user id=%s not sealed: the audit chain is broken at seq=%s after its role was "
                "recorded (seq=%s)",
                row["id"],
                broken_since(user.seq),
                user.seq,
            )
            continue
        if (
            user is None
            or user.role != row["role"]
            or not _matches(user.tenant_id, row["tenant_id"])
            or not _matches(user.name, row["name"])
        ):
            _log.error("user id=%s not sealed: the audit log does not vouch for it", row["id"])
            continue
        conn.execute(
            update(users)
            .where(users.c.id == row["id"])
            .values(seal=_user_row_seal(server_key, row))
        )
        sealed_users.append(
            {
                "user_id": row["id"],
                "tenant_id": row["tenant_id"],
                "name": row["name"],
                "role": row["role"],
            }
        )
    for i in range(0, max(len(sealed_tokens), len(sealed_users)), _SEAL_BATCH):
        append(
            conn,
            server_key,
            tenant_id=None,
            actor=actor,
            action="audit.seal",
            target="tokens+users",
            detail={
                "tokens": sealed_tokens[i : i + _SEAL_BATCH],
                "users": sealed_users[i : i + _SEAL_BATCH],
            },
        )
    return len(sealed_tokens) + len(sealed_users)
