"""The append-only, hash-chained audit log, its anchor, and the seals it vouches for: the
one module the rest of the control plane imports for them.

The parts: auditchain.py (the rows, their HMAC chain, appending, the seals),
auditanchor.py (the checkpoint outside the database), auditverify.py (the engine that
replays the log and compares live rows with it), audittables.py (the audited tables,
declared: their keys, the actions that write them, how each action's detail maps to a
row) and auditseal.py (sealing the rows an older trueup wrote).

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
from collections.abc import Callable

from sqlalchemy import Connection, RowMapping

from trueup.server import coverage, coverchecks, inputchecks
from trueup.server.auditanchor import (
    advance_checkpoint,
    anchor_problems,
    checkpoint_file,
    reanchor,
)
from trueup.server.auditchain import (
    GENESIS,
    AuditProblem,
    append,
    check_chain,
    row_hash_ok,
    token_seal,
    token_seal_ok,
    user_seal,
    user_seal_ok,
)
from trueup.server.auditseal import seal_unsealed
from trueup.server.audittables import replay, verify_tables
from trueup.server.keys import ServerKey

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


def verify(conn: Connection, server_key: ServerKey) -> list[AuditProblem]:
    """Every inconsistency between the chain, its anchor, its head and the live tables.

    Never raises: a check that fails unexpectedly is itself reported.
    """
    problems: list[AuditProblem] = []
    entries: list[RowMapping] = []

    def run(what: str, check: Callable[[], list[AuditProblem]]) -> None:
        try:
            problems.extend(check())
        except Exception as exc:  # verification reports; it never stops half-way
            problems.append(AuditProblem("verify", what, f"could not be checked: {exc!r}"))

    run("checkpoint", lambda: anchor_problems(conn, server_key))
    run("audit_log", lambda: check_chain(conn, server_key, entries))
    facts, replay_problems = replay(entries)
    problems.extend(replay_problems)
    for name, check in verify_tables(conn, server_key, facts):
        run(name, check)
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
