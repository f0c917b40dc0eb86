"""A seal cleared in the database does not launder a revocation or a demotion.

Each process seals the token and user rows it finds without a seal (rows of an older
trueup), if the audit log vouches for them, and records what it sealed in an `audit.seal`
entry. An attacker with write access to the database but not the key deletes the middle
audit rows that revoked a token and demoted an admin, puts the live rows back (revocation
cleared, role raised) and clears their seals. Were the next process to seal them, its
`audit.seal` entry — written after the break — would vouch for the revived rows, and the
chain walk would accept them. Sealing follows the walk's rule instead: a row whose last
audited record precedes a break in the chain is not sealed, so it stays refused, and
`audit verify` names it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from tests.server.conftest import BACKENDS, create_pg_database, drop_pg_database
from trueup.cli.server import server_app
from trueup.server.db import Database
from trueup.server.keys import load_or_create_server_key
from trueup.server.service import ControlPlane, Unauthorized
from trueup.server.tokens import Role


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/server.db"
        return
    name = create_pg_database()
    try:
        yield f"postgresql://postgres@127.0.0.1:5432/{name}"
    finally:
        drop_pg_database(name)


def test_clearing_seals_after_deleting_a_revocation_and_a_demotion_revives_nothing(
    db_url: str, tmp_path: Path
) -> None:
    key_file = tmp_path / "server.key"
    database = Database(db_url)
    database.migrate()
    plane = ControlPlane(database, load_or_create_server_key(key_file))
    tenant_id = plane.create_tenant("acme", "test")
    plane.create_user(tenant_id, "ops", Role.OPERATOR, "test")
    plane.create_user(tenant_id, "boss", Role.ADMIN, "test")
    ops_id, ops_token = plane.create_token(tenant_id, "ops", "test")
    boss_id, boss_token = plane.create_token(tenant_id, "boss", "test")
    plane.revoke_token(tenant_id, ops_id, "test")
    plane.set_role(tenant_id, "boss", Role.VIEWER, "test")
    plane.create_user(tenant_id, "later", Role.VIEWER, "test")  # the edits are mid-chain
    with database.engine.begin() as conn:
        conn.execute(text("DELETE FROM audit_log WHERE action IN ('token.revoke', 'user.role')"))
        conn.execute(
            text("UPDATE tokens SET revoked_at = NULL, seal = NULL WHERE id IN (:a, :b)"),
            {"a": ops_id, "b": boss_id},
        )
        conn.execute(text("UPDATE users SET role = 'admin', seal = NULL WHERE name = 'boss'"))
        conn.execute(text("UPDATE users SET seal = NULL WHERE name = 'ops'"))
    for _process in range(2):  # each new process tries to seal them; neither may
        fresh = ControlPlane(Database(db_url), load_or_create_server_key(key_file))
        for token in (ops_token, boss_token):
            with pytest.raises(Unauthorized):
                fresh.authenticate(token)
    with database.engine.begin() as conn:
        assert (
            conn.execute(
                text("SELECT count(*) FROM audit_log WHERE action = 'audit.seal'")
            ).scalar()
            == 0
        )
    result = CliRunner().invoke(
        server_app, ["audit", "verify", "--db", db_url, "--key-file", str(key_file)]
    )
    assert result.exit_code == 1, result.output
    for named in (
        f"token {ops_id} (tenant acme, user ops): accepted by the database, but the audit "
        "chain is broken",
        f"token {boss_id} (tenant acme, user boss): accepted by the database",
        "user acme/boss: role admin in the database, but the audit chain is broken",
    ):
        assert named in result.output, (named, result.output)
    # A credential issued after the break, on a verified stretch, works (the recovery).
    plane.set_role(tenant_id, "later", Role.OPERATOR, "test")
    _later_id, later_token = plane.create_token(tenant_id, "later", "test")
    fresh = ControlPlane(Database(db_url), load_or_create_server_key(key_file))
    assert fresh.authenticate(later_token).role == Role.OPERATOR
