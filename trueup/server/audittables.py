"""The tables the audit log vouches for, declared: what each one is, its key, which audit
actions create, change or delete its rows, and how an action's detail maps to the row.

Each table is a fact record (what the log says one row holds, in auditfacts.py with the
checks and readers that concern one row), an `AuditedTable` (how verification reads the
live rows, names them and compares them with their facts) and its `Action`s in
`_DECLARED`. The engine that replays and compares is auditverify.py; adding an audited
table is its record and these two declarations, nothing else.

Why this module is over 400 lines: every audited table's declaration and every audited
action's mapping sit side by side, so what each entry records and what verification
expects of each table read in one place; what concerns one row only (the records, their
checks and readers) is already apart, in auditfacts.py.

The tables, in the order verification reports them: tenants (name), users (tenant,
name, role, seal), devices (tenant, name, desired version against the newest audited
revision), tokens (tenant, kind, user, device, hash, revocation, seal), revisions
(content, and every audited revision still there), acknowledgements, secrets (tenant,
device, name) and device backups (tenant, device, sha256, size, the chunks adding up to
it; every upload not audited as deleted still there, none deleted restored).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy import Connection, RowMapping, select

from trueup.server.auditchain import AuditProblem, token_seal_ok, user_seal_ok
from trueup.server.auditfacts import (
    AckFact,
    BackupFact,
    DeviceFact,
    RevisionFact,
    SecretFact,
    TenantFact,
    TokenFact,
    UserFact,
    backup_key,
    chunks_add_up,
    mark_revoked,
    requires_device,
    revoked_id,
    same_content,
    same_role,
    same_token_hash,
    seal_holds,
    sealed_token,
    sealed_user,
    stated_user,
    still_revoked,
    tenant_key,
    token_key,
    user_key,
)
from trueup.server.auditverify import (
    Action,
    AuditedTable,
    Context,
    Each,
    Facts,
    Missing,
    Reading,
    Same,
    Says,
    verify_table,
)
from trueup.server.auditverify import replay as replay_through
from trueup.server.keys import ServerKey
from trueup.server.tables import (
    acks,
    backups,
    devices,
    revisions,
    secrets,
    tenants,
    tokens,
    users,
)

__all__ = [
    "ACKS",
    "ACTIONS",
    "BACKUPS",
    "DEVICES",
    "REVISIONS",
    "SECRETS",
    "TABLES",
    "TENANTS",
    "TOKENS",
    "USERS",
    "replay",
    "verify_tables",
]


# -- lookups the checks share ------------------------------------------------------------------


def _device_names(ctx: Context) -> dict[int, str]:
    rows = ctx.conn.execute(
        select(devices.c.id, devices.c.name, tenants.c.name.label("tenant")).join(
            tenants, tenants.c.id == devices.c.tenant_id
        )
    )
    return {r.id: f"{r.tenant}/{r.name}" for r in rows}


def _device(device_id: int, ctx: Context) -> str:
    return ctx.cached(_device_names).get(device_id, f"device id={device_id}")


def _newest_revisions(ctx: Context) -> dict[int, tuple[int, int]]:
    """Each device's newest audited revision: (version, seq)."""
    newest: dict[int, tuple[int, int]] = {}
    for (device_id, version), fact in ctx.facts.of(REVISIONS).rows.items():
        if version > newest.get(device_id, (0, 0))[0]:
            newest[device_id] = (version, fact.seq)
    return newest


def _select(*columns: Any, order: Any = None) -> Callable[[Connection], Iterable[RowMapping]]:
    def rows(conn: Connection) -> Iterable[RowMapping]:
        query = select(*columns)
        return conn.execute(query if order is None else query.order_by(order)).mappings()

    return rows


# -- checks that read more than the row ----------------------------------------------------------


def _desired_version(row: RowMapping, _fact: DeviceFact | None, ctx: Context) -> Says | None:
    version, seq = ctx.cached(_newest_revisions).get(row["id"], (0, 0))
    if row["desired_version"] == version:
        return None
    return Says(
        f"desired_version is {row['desired_version']} but the newest audited "
        f"revision is version {version}"
        + (f" (seq={seq})" if seq else "")
        + ": rewound or advanced behind the server's back"
    )


# -- the tables --------------------------------------------------------------------------------

TENANTS = AuditedTable[int, TenantFact](
    name="tenants",
    rows=_select(tenants.c.id, tenants.c.name, order=tenants.c.id),
    key=lambda row: row["id"],
    label=lambda row, _ctx: f"{row['name']} (id={row['id']})",
    checks=(Same[TenantFact]("name", lambda f: f.name),),
)

USERS = AuditedTable[int, UserFact](
    name="users",
    rows=lambda conn: conn.execute(
        select(users, tenants.c.name.label("tenant"))
        .join(tenants, tenants.c.id == users.c.tenant_id)
        .order_by(users.c.id)
    ).mappings(),
    key=lambda row: row["id"],
    label=lambda row, _ctx: f"{row['tenant']}/{row['name']}",
    checks=(
        same_role,
        Same[UserFact]("tenant_id", lambda f: f.tenant_id, what="tenant"),
        Same[UserFact]("name", lambda f: f.name),
        seal_holds(user_seal_ok, "this user's tokens"),
    ),
)

DEVICES = AuditedTable[int, DeviceFact](
    name="devices",
    rows=_select(devices, order=devices.c.id),
    key=lambda row: row["id"],
    label=lambda row, ctx: ctx.cached(_device_names).get(row["id"], f"id={row['id']}"),
    checks=(
        Same[DeviceFact]("tenant_id", lambda f: f.tenant_id, what="tenant"),
        Same[DeviceFact]("name", lambda f: f.name),
    ),
    always=(_desired_version,),
)

TOKENS = AuditedTable[int, TokenFact](
    name="tokens",
    rows=_select(tokens, order=tokens.c.id),
    key=lambda row: row["id"],
    label=lambda row, _ctx: f"id={row['id']} ({row['kind']}, tenant {row['tenant_id']})",
    checks=(
        Same[TokenFact]("tenant_id", lambda f: f.tenant_id),
        Same[TokenFact]("kind", lambda f: f.kind),
        Same[TokenFact]("user_id", lambda f: f.user_id),
        Same[TokenFact]("device_id", lambda f: f.device_id),
        same_token_hash,
        still_revoked,
        seal_holds(token_seal_ok, "this token"),
    ),
)

REVISIONS = AuditedTable[tuple[int, int], RevisionFact](
    name="revisions",
    rows=_select(revisions, order=revisions.c.id),
    key=lambda row: (row["device_id"], row["version"]),
    label=lambda row, ctx: f"{_device(row['device_id'], ctx)} version={row['version']}",
    checks=(same_content,),
    missing=Missing(
        "audited at seq={seq} but missing from the table (deleted)",
        lambda key, ctx: f"{_device(key[0], ctx)} version={key[1]}",
    ),
)

ACKS = AuditedTable[int, AckFact](
    name="acks",
    rows=_select(acks, order=acks.c.id),
    key=lambda row: row["id"],
    label=lambda row, _ctx: f"id={row['id']} ({row['subsystem']})",
    checks=(
        Same[AckFact]("device_id", lambda f: f.device_id),
        Same[AckFact]("subsystem", lambda f: f.subsystem),
        Same[AckFact]("expires_at", lambda f: f.expires_at),
    ),
    missing=Missing("audited at seq={seq} but missing (deleted)", lambda key, _ctx: f"id={key}"),
)

SECRETS = AuditedTable[str, SecretFact](
    name="secrets",
    rows=_select(secrets.c.id, secrets.c.tenant_id, secrets.c.device_id, secrets.c.name),
    key=lambda row: row["id"],
    label=lambda row, _ctx: f"{row['id']} ({row['name']})",
    checks=(
        Same[SecretFact]("tenant_id", lambda f: f.tenant_id),
        Same[SecretFact]("device_id", lambda f: f.device_id),
        Same[SecretFact]("name", lambda f: f.name),
    ),
)

BACKUPS = AuditedTable[int, BackupFact](
    name="backups",
    rows=_select(backups, order=backups.c.id),
    key=lambda row: row["id"],
    label=lambda row, _ctx: f"id={row['id']}",
    checks=(
        Same[BackupFact]("tenant_id", lambda f: f.tenant_id),
        Same[BackupFact]("device_id", lambda f: f.device_id),
        Same[BackupFact]("sha256", lambda f: f.sha256),
        Same[BackupFact]("size", lambda f: f.size),
        chunks_add_up,
    ),
    missing=Missing(
        "uploaded at seq={seq}, never audited as deleted, but missing (deleted "
        "behind the server's back)",
        lambda key, _ctx: f"id={key}",
    ),
)

TABLES: tuple[AuditedTable[Any, Any], ...] = (
    TENANTS,
    USERS,
    DEVICES,
    TOKENS,
    REVISIONS,
    ACKS,
    SECRETS,
    BACKUPS,
)


# -- how the actions' details map to the rows ---------------------------------------------------


def _user_of(r: Reading) -> int | None:
    """The user a token is for: its id, or (older entries) the name in the target."""
    user_id = r.optional_int("user_id")
    if user_id is None:
        user_id = r.facts.of(USERS).ids.get((r.tenant_id, r.after("user:") or ""))
    return user_id


def _device_of(r: Reading) -> int | None:
    """The device an entry is about: its id, or (older entries) the name in the target."""
    device_id = r.optional_int("device_id")
    if device_id is None:
        name = r.after("device:")
        if name is not None:
            device_id = r.facts.of(DEVICES).ids.get((r.tenant_id, name.split("/secret:")[0]))
    return device_id


def _revoke(r: Reading, token_ids: Iterable[int]) -> None:
    known = r.facts.of(TOKENS).rows
    for token_id in token_ids:
        if token_id in known:
            known[token_id].revoked_seq = r.seq


def _revokes_listed(r: Reading) -> None:
    _revoke(r, r.ints("revoked_token_ids"))


def _revokes_enrollment(r: Reading) -> None:
    enrollment = r.optional_int("enrollment_token_id")
    _revoke(r, [] if enrollment is None else [enrollment])


def _device_token(kind: str) -> Callable[[Reading, TokenFact | None], TokenFact]:
    def creates(r: Reading, _previous: TokenFact | None) -> TokenFact:
        return TokenFact(
            r.seq,
            r.tenant_id,
            kind,
            device_id=_device_of(r),
            token_hash=r.optional_str("token_hash"),
        )

    return creates


def _secret(r: Reading, _previous: SecretFact | None) -> SecretFact:
    name = r.target.split("/secret:", 1)[1] if "/secret:" in r.target else None
    return SecretFact(r.seq, r.tenant_id, _device_of(r), name)


# Every audited action, by table; the actions of one name apply in the order declared
# here (an `audit.seal` entry's tokens before its users).
_DECLARED: tuple[Action[Any, Any], ...] = (
    Action(
        "tenant.create",
        TENANTS,
        tenant_key,
        creates=lambda r, _: TenantFact(r.seq, r.after("tenant:")),
    ),
    Action("user.create", USERS, user_key, creates=stated_user, names=lambda f: f.name),
    Action("user.role", USERS, user_key, creates=stated_user, names=lambda f: f.name),
    Action(
        "device.create",
        DEVICES,
        lambda r: r.required_int("device_id"),
        creates=lambda r, _: DeviceFact(r.seq, r.tenant_id, r.after("device:")),
        names=lambda f: f.name,
    ),
    Action(
        "token.create",
        TOKENS,
        token_key,
        creates=lambda r, _: TokenFact(
            r.seq, r.tenant_id, "user", user_id=_user_of(r), token_hash=r.optional_str("token_hash")
        ),
    ),
    Action(
        "device.enroll",
        TOKENS,
        token_key,
        first=(_revokes_listed,),
        creates=_device_token("enrollment"),
    ),
    Action(
        "device.credential",
        TOKENS,
        token_key,
        first=(_revokes_enrollment, _revokes_listed),
        creates=_device_token("device"),
    ),
    Action("token.revoke", TOKENS, revoked_id, changes=mark_revoked),
    Action(
        "revision.create",
        REVISIONS,
        lambda r: (r.required_int("device_id"), r.required_int("version")),
        creates=lambda r, _: RevisionFact(r.seq, r.required_str("content_hash")),
    ),
    Action(
        "ack.create",
        ACKS,
        lambda r: r.required_int("ack_id"),
        creates=lambda r, _: AckFact(
            r.seq, _device_of(r), r.optional_str("subsystem"), r.number("expires_at")
        ),
    ),
    Action("secret.put", SECRETS, lambda r: r.required_str("secret_id"), creates=_secret),
    Action(
        "audit.seal",
        TOKENS,
        token_key,
        each=Each("tokens", "a sealed token"),
        creates=sealed_token,
    ),
    Action("audit.seal", USERS, user_key, each=Each("users", "a sealed user"), creates=sealed_user),
    Action(
        "backup.upload",
        BACKUPS,
        backup_key,
        creates=lambda r, _: BackupFact(
            r.seq,
            r.tenant_id,
            r.required_int("device_id"),
            r.required_str("sha256"),
            r.required_int("size"),
        ),
    ),
    Action("backup.delete", BACKUPS, backup_key, first=(requires_device,), deletes=True),
)

# Each audit action's effects, in the order they apply.
ACTIONS: dict[str, list[Action[Any, Any]]] = {}
for _action in _DECLARED:
    ACTIONS.setdefault(_action.name, []).append(_action)


def replay(
    entries: Iterable[RowMapping], facts: Facts | None = None
) -> tuple[Facts, list[AuditProblem]]:
    """`facts` (new ones by default) with `entries` applied in order, and the malformed ones."""
    facts = Facts() if facts is None else facts
    return facts, replay_through(entries, ACTIONS, facts)


def verify_tables(
    conn: Connection, server_key: ServerKey, facts: Facts
) -> list[tuple[str, Callable[[], list[AuditProblem]]]]:
    """Each table's verification, by name, to run one after the other (each may fail alone)."""
    ctx = Context(conn, server_key, facts)
    return [(table.name, functools.partial(verify_table, table, ctx)) for table in TABLES]
