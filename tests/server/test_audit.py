"""Tampering behind the server's back is found by `trueup server audit verify`."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from sqlalchemy import Connection, text
from typer.testing import CliRunner

from tests.server.conftest import BACKENDS, Server, document
from trueup.cli.server import server_app
from trueup.server.tokens import Role, hash_token


def populate(server: Server) -> str:
    tenant = server.tenant("acme", devices=("edge-01",))
    tenant_id = server.plane.tenant_id(tenant.name)
    server.plane.put_desired(tenant_id, "edge-01", 0, document("edge-01"), author="alice")
    server.plane.put_desired(
        tenant_id, "edge-01", 1, document("edge-01", address="198.51.100.3/24"), author="alice"
    )
    server.plane.set_role(tenant_id, "viewer-user", Role.OPERATOR, "test")
    assert server.plane.verify_audit() == []
    return tenant.name


def _edit_audit_row(conn: Connection, _tenant: str) -> None:
    conn.execute(text("UPDATE audit_log SET actor = 'mallory' WHERE seq = 3"))


def _delete_middle_row(conn: Connection, _tenant: str) -> None:
    conn.execute(text("DELETE FROM audit_log WHERE seq = 4"))


def _delete_last_row(conn: Connection, _tenant: str) -> None:
    conn.execute(text("DELETE FROM audit_log WHERE seq = (SELECT MAX(seq) FROM audit_log)"))


def _insert_row(conn: Connection, _tenant: str) -> None:
    last = conn.execute(text("SELECT seq, row_hash FROM audit_log ORDER BY seq DESC")).first()
    assert last is not None
    conn.execute(
        text(
            "INSERT INTO audit_log (seq, tenant_id, at, actor, action, target, detail, "
            "prev_hash, row_hash) VALUES (:seq, NULL, 0, 'mallory', 'token.create', 'x', '{}', "
            ":prev, :hash)"
        ),
        {"seq": last.seq + 1, "prev": last.row_hash, "hash": "f" * 64},
    )
    conn.execute(
        text("UPDATE audit_head SET seq = :seq, row_hash = :hash"),
        {"seq": last.seq + 1, "hash": "f" * 64},
    )


def _edit_revision(conn: Connection, _tenant: str) -> None:
    row = conn.execute(text("SELECT id, document FROM revisions WHERE version = 1")).one()
    body = json.loads(row.document)
    body["spec"]["management"]["addresses"] = ["198.51.100.66/24"]
    conn.execute(
        text("UPDATE revisions SET document = :doc WHERE id = :id"),
        {"doc": json.dumps(body), "id": row.id},
    )


def _escalate_role(conn: Connection, _tenant: str) -> None:
    conn.execute(text("UPDATE users SET role = 'admin' WHERE name = 'viewer-user'"))


def _insert_token(conn: Connection, _tenant: str) -> None:
    conn.execute(
        text(
            "INSERT INTO tokens (tenant_id, kind, user_id, token_hash, label, created_at) "
            "SELECT tenant_id, 'user', id, :hash, 'backdoor', 0 FROM users "
            "WHERE name = 'admin-user'"
        ),
        {"hash": hash_token("tu_u_backdoor")},
    )


TAMPERING: dict[str, tuple[Callable[[Connection, str], None], str]] = {
    "edit-audit-row": (_edit_audit_row, "audit_log seq=3"),
    "delete-middle-row": (_delete_middle_row, "audit_log seq=4: row(s) deleted"),
    "delete-last-row": (_delete_last_row, "audit_head"),
    "insert-audit-row": (_insert_row, "contents do not match"),
    "edit-revision": (_edit_revision, "/edge-01 version=1: document or content hash differs"),
    "escalate-role": (
        _escalate_role,
        "/viewer-user: role is admin but the last audited role is operator",
    ),
    "insert-token": (_insert_token, "has no audit entry (inserted directly)"),
}


@pytest.mark.parametrize("isolated_server", BACKENDS, indirect=True)
@pytest.mark.parametrize("kind", sorted(TAMPERING))
def test_audit_verify_names_rows_changed_behind_the_servers_back(
    isolated_server: Server, kind: str
) -> None:
    server = isolated_server
    tenant = populate(server)
    tamper, expected = TAMPERING[kind]
    with server.plane.db.engine.begin() as conn:
        tamper(conn, tenant)
    problems = [str(p) for p in server.plane.verify_audit()]
    assert any(expected in p for p in problems), problems
    result = CliRunner().invoke(
        server_app,
        ["audit", "verify", "--db", server.url, "--key-file", str(server.key_file)],
    )
    assert result.exit_code == 1, result.output
    assert expected in result.output


@pytest.mark.parametrize("isolated_server", BACKENDS, indirect=True)
def test_audit_verify_passes_an_untouched_database(isolated_server: Server) -> None:
    populate(isolated_server)
    result = CliRunner().invoke(
        server_app,
        [
            "audit",
            "verify",
            "--db",
            isolated_server.url,
            "--key-file",
            str(isolated_server.key_file),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "audit log intact" in result.output


@pytest.mark.parametrize("isolated_server", BACKENDS, indirect=True)
def test_a_forged_chain_needs_the_server_key(isolated_server: Server, tmp_path) -> None:
    """Verification with another key fails: the chain is keyed, not a plain hash."""
    populate(isolated_server)
    other_key = tmp_path / "other.key"
    result = CliRunner().invoke(
        server_app,
        ["audit", "verify", "--db", isolated_server.url, "--key-file", str(other_key)],
    )
    assert result.exit_code == 1
    assert "contents do not match the row's hash" in result.output
