"""The audit log's anchor outside the database: a signed checkpoint of its head.

The rows cannot vouch for their own end. After each audited write commits, the writer
advances a signed checkpoint of the head in a file next to the server key (anchor.py),
outside the database; a chain whose stored rows end before the checkpoint, or differ
from it, was truncated or rewound (`anchor_problems`). Authentication refuses every
token while that is so (service/auth.py): a revocation that was deleted from the log
and undone in the table does not revive the token.
"""

from __future__ import annotations

import hmac
import logging
import time

from sqlalchemy import Connection, select

from trueup.server.anchor import SUFFIX, Checkpoint, CheckpointError, CheckpointFile
from trueup.server.auditchain import AuditProblem, entry_hash, iso
from trueup.server.keys import ServerKey
from trueup.server.tables import audit_head, audit_log

__all__ = ["advance_checkpoint", "anchor_problems", "checkpoint_file", "reanchor"]

_log = logging.getLogger("trueup.server.audit")


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
    when = f"the checkpoint of {iso(cp.at)} in {file.path}"
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
                entry_hash(key, row), row["row_hash"]
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
