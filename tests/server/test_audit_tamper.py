"""Tampering that an attacker with write access to the database (but not to the server key
file and the checkpoint next to it) could use to revive or forge credentials: found by
`trueup server audit verify`, and refused by authentication."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from tests.server.conftest import BACKENDS, Server, Tenant, document
from trueup.cli.server import server_app
from trueup.server import audit
from trueup.server.anchor import SUFFIX
from trueup.server.db import Database
from trueup.server.keys import load_or_create_server_key
from trueup.server.service import ControlPlane
from trueup.server.tokens import Role, hash_token

pytestmark = pytest.mark.parametrize("isolated_server", BACKENDS, indirect=True)


def verify_cli(server: Server, *args: str) -> Any:
    return CliRunner().invoke(
        server_app,
        ["audit", *args, "--db", server.url, "--key-file", str(server.key_file)],
    )


def problems(server: Server) -> list[str]:
    return [str(p) for p in server.plane.verify_audit() if not p.gap]


def status(server: Server, token: str) -> int:
    headers = {"Authorization": f"Bearer {token}"}
    return server.client.get("/api/v1/devices", headers=headers).status_code


def setup_tenant(server: Server) -> tuple[Tenant, int]:
    tenant = server.tenant("acme", devices=("edge-01",))
    tenant_id = server.plane.tenant_id(tenant.name)
    for expected, address in enumerate(("198.51.100.2/24", "198.51.100.3/24")):
        server.plane.put_desired(
            tenant_id, "edge-01", expected, document("edge-01", address=address), author="alice"
        )
    assert server.plane.verify_audit() == []
    return tenant, tenant_id


def test_a_deleted_revocation_with_a_rewound_head_is_found_and_the_token_stays_refused(
    isolated_server: Server,
) -> None:
    server = isolated_server
    tenant, tenant_id = setup_tenant(server)
    token_id, token = server.plane.create_token(tenant_id, "admin-user", "test", label="laptop")
    assert status(server, token) == 200
    server.plane.revoke_token(tenant_id, token_id, "test")
    assert status(server, token) == 401

    with server.plane.db.engine.begin() as conn:
        last = conn.execute(text("SELECT seq, action FROM audit_log ORDER BY seq DESC")).first()
        assert last is not None and last.action == "token.revoke"
        conn.execute(text("DELETE FROM audit_log WHERE seq = :seq"), {"seq": last.seq})
        previous = conn.execute(
            text("SELECT seq, row_hash FROM audit_log WHERE seq = :seq"), {"seq": last.seq - 1}
        ).one()
        conn.execute(
            text("UPDATE audit_head SET seq = :seq, row_hash = :hash"),
            {"seq": previous.seq, "hash": previous.row_hash},
        )
        conn.execute(text("UPDATE tokens SET revoked_at = NULL WHERE id = :id"), {"id": token_id})

    found = problems(server)
    assert any(
        f"audit_log seq={last.seq}: missing, but the checkpoint" in p and "rewound" in p
        for p in found
    ), found
    assert any(p.startswith(f"audit_head seq={last.seq - 1}: behind") for p in found), found
    # The revoked token does not work again, nor does any other while the chain is rewound.
    response = server.client.get("/api/v1/devices", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 401
    assert "audit chain contradicts its checkpoint" in response.text
    assert status(server, tenant.tokens["admin"]) == 401
    agent = server.client.get(
        "/api/v1/agent/desired?after=0&wait=0", headers=tenant.device_auth("edge-01")
    )
    assert agent.status_code == 401

    result = verify_cli(server, "verify")
    assert result.exit_code == 1, result.output
    assert f"audit_log seq={last.seq}: missing" in result.output
    assert "Traceback" not in result.output


def test_an_operator_reanchors_a_restored_database_and_authentication_resumes(
    isolated_server: Server,
) -> None:
    server = isolated_server
    tenant, tenant_id = setup_tenant(server)
    # A "backup" of the audit state, then more audited writes, then the "restore".
    with server.plane.db.engine.begin() as conn:
        head = conn.execute(text("SELECT seq, row_hash FROM audit_head")).one()
    server.plane.create_user(tenant_id, "late-user", Role.VIEWER, "test")
    with server.plane.db.engine.begin() as conn:
        conn.execute(text("DELETE FROM audit_log WHERE seq > :seq"), {"seq": head.seq})
        conn.execute(
            text("UPDATE audit_head SET seq = :seq, row_hash = :hash"),
            {"seq": head.seq, "hash": head.row_hash},
        )
        conn.execute(text("DELETE FROM users WHERE name = 'late-user'"))
    assert status(server, tenant.tokens["viewer"]) == 401

    refused = verify_cli(server, "reanchor")
    assert refused.exit_code == 1
    assert "--yes" in refused.output
    accepted = verify_cli(server, "reanchor", "--yes")
    assert accepted.exit_code == 0, accepted.output
    assert f"anchored at seq={head.seq + 1}" in accepted.output

    assert status(server, tenant.tokens["viewer"]) == 200
    result = verify_cli(server, "verify")
    assert result.exit_code == 0, result.output
    assert "audit log intact" in result.output
    with server.plane.db.engine.begin() as conn:
        actions = [r.action for r in conn.execute(text("SELECT action FROM audit_log"))]
    assert actions[-1] == "audit.reanchor"


def test_a_swapped_token_hash_is_found_by_name_and_does_not_authenticate(
    isolated_server: Server,
) -> None:
    server = isolated_server
    tenant, tenant_id = setup_tenant(server)
    admin_token = tenant.tokens["admin"]
    with server.plane.db.engine.begin() as conn:
        token_id = conn.execute(
            text("SELECT id FROM tokens WHERE token_hash = :h"), {"h": hash_token(admin_token)}
        ).scalar_one()
        conn.execute(
            text("UPDATE tokens SET token_hash = :h WHERE id = :id"),
            {"h": hash_token("tu_u_attacker"), "id": token_id},
        )

    assert status(server, "tu_u_attacker") == 401
    assert status(server, admin_token) == 401
    assert status(server, tenant.tokens["viewer"]) == 200  # only that token is refused
    name = f"tokens id={token_id} (user, tenant {tenant_id})"
    found = problems(server)
    assert any(p.startswith(name) and "token_hash differs" in p for p in found), found
    assert any(p.startswith(name) and "seal does not match" in p for p in found), found
    result = verify_cli(server, "verify")
    assert result.exit_code == 1
    assert name in result.output


def test_a_raised_role_does_not_authenticate(isolated_server: Server) -> None:
    server = isolated_server
    tenant, _tenant_id = setup_tenant(server)
    assert status(server, tenant.tokens["viewer"]) == 200
    with server.plane.db.engine.begin() as conn:
        conn.execute(text("UPDATE users SET role = 'admin' WHERE name = 'viewer-user'"))
    assert status(server, tenant.tokens["viewer"]) == 401
    assert any(f"users {tenant.name}/viewer-user: role is admin" in p for p in problems(server)), (
        problems(server)
    )


def test_a_deleted_revision_with_a_rewound_desired_version_is_found(
    isolated_server: Server,
) -> None:
    server = isolated_server
    tenant, _tenant_id = setup_tenant(server)
    with server.plane.db.engine.begin() as conn:
        device_id = conn.execute(text("SELECT id FROM devices WHERE name = 'edge-01'")).scalar_one()
        conn.execute(
            text("DELETE FROM revisions WHERE device_id = :d AND version = 2"), {"d": device_id}
        )
        conn.execute(text("UPDATE devices SET desired_version = 1 WHERE id = :d"), {"d": device_id})
    found = problems(server)
    name = f"revisions {tenant.name}/edge-01 version=2"
    assert any(p.startswith(name) and "missing from the table (deleted)" in p for p in found), found
    assert any(
        f"devices {tenant.name}/edge-01: desired_version is 1 but the newest audited revision "
        "is version 2" in p
        for p in found
    ), found
    result = verify_cli(server, "verify")
    assert result.exit_code == 1
    assert name in result.output


def test_a_desired_version_moved_alone_is_found(isolated_server: Server) -> None:
    server = isolated_server
    tenant, _tenant_id = setup_tenant(server)
    with server.plane.db.engine.begin() as conn:
        conn.execute(text("UPDATE devices SET desired_version = 1 WHERE name = 'edge-01'"))
    assert any(
        f"devices {tenant.name}/edge-01: desired_version is 1" in p for p in problems(server)
    )


def test_a_device_moved_to_another_tenant_is_found(isolated_server: Server) -> None:
    server = isolated_server
    setup_tenant(server)
    other = server.tenant("other")
    other_id = server.plane.tenant_id(other.name)
    with server.plane.db.engine.begin() as conn:
        conn.execute(
            text("UPDATE devices SET tenant_id = :t WHERE name = 'edge-01'"), {"t": other_id}
        )
    found = problems(server)
    assert any(f"devices {other.name}/edge-01: tenant is {other_id}" in p for p in found), found


def test_malformed_details_are_listed_and_verify_never_raises(isolated_server: Server) -> None:
    server = isolated_server
    tenant, tenant_id = setup_tenant(server)
    malformed: list[tuple[str, dict[str, Any]]] = [
        ("revision.create", {}),
        ("revision.create", {"device_id": "one", "version": 1, "content_hash": "x"}),
        ("user.create", {"user_id": 1}),
        ("token.create", {"token_id": None}),
        ("device.enroll", {"token_id": 1, "revoked_token_ids": "all"}),
        ("token.revoke", {}),
        ("ack.create", {"ack_id": [1]}),
        ("secret.put", {"secret_id": 7}),
        ("audit.seal", {"tokens": [1], "users": []}),
    ]
    with server.plane.db.engine.begin() as conn:
        first = None
        for action, detail in malformed:
            seq = audit.append(
                conn,
                server.plane.key,
                tenant_id=tenant_id,
                actor="test",
                action=action,
                target="device:edge-01",
                detail=detail,
            )
            first = first or seq
    assert first is not None
    found = problems(server)
    for offset, (action, _detail) in enumerate(malformed):
        assert any(
            p.startswith(f"audit_log seq={first + offset} ({action} ") and "detail malformed" in p
            for p in found
        ), (action, found)
    # Malformed details do not stop the checks that follow them.
    with server.plane.db.engine.begin() as conn:
        conn.execute(text("UPDATE users SET role = 'admin' WHERE name = 'viewer-user'"))
    assert any(f"{tenant.name}/viewer-user: role is admin" in p for p in problems(server))
    result = verify_cli(server, "verify")
    assert result.exit_code == 1
    assert isinstance(result.exception, SystemExit), result.exception
    for offset in range(len(malformed)):
        assert f"audit_log seq={first + offset} (" in result.output
    assert "viewer-user: role is admin" in result.output


def test_a_detail_edited_into_garbage_is_reported_not_raised(isolated_server: Server) -> None:
    server = isolated_server
    setup_tenant(server)
    with server.plane.db.engine.begin() as conn:
        conn.execute(text("UPDATE audit_log SET detail = 'not json', at = -1 WHERE seq = 2"))
    found = problems(server)
    assert any(p.startswith("audit_log seq=2 ") and "contents do not match" in p for p in found)


def test_an_edited_checkpoint_file_is_reported(isolated_server: Server) -> None:
    server = isolated_server
    setup_tenant(server)
    path = server.key_file.with_name(server.key_file.name + SUFFIX)
    data = json.loads(path.read_text())
    (chain,) = data["chains"]
    data["chains"][chain]["seq"] += 5
    path.write_text(json.dumps(data))
    found = problems(server)
    assert any("does not authenticate under this server key" in p for p in found), found


def test_the_checkpoint_follows_concurrent_writers(isolated_server: Server) -> None:
    server = isolated_server
    _tenant, tenant_id = setup_tenant(server)
    # A second control plane (as another server process would) on the same database and key.
    other = ControlPlane(
        Database(server.url), load_or_create_server_key(server.key_file), auth_cache_seconds=0
    )
    errors: list[BaseException] = []

    def create(plane: ControlPlane, prefix: str) -> None:
        try:
            for i in range(10):
                plane.create_user(tenant_id, f"{prefix}-{i}", Role.VIEWER, "test")
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [
        threading.Thread(target=create, args=(plane, prefix))
        for plane, prefix in ((server.plane, "a"), (other, "b"), (server.plane, "c"))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    path = server.key_file.with_name(server.key_file.name + SUFFIX)
    (checkpoint,) = json.loads(path.read_text())["chains"].values()
    with server.plane.db.engine.begin() as conn:
        head = conn.execute(text("SELECT seq, row_hash FROM audit_head")).one()
    assert (checkpoint["seq"], checkpoint["row_hash"]) == (head.seq, head.row_hash)
    assert server.plane.verify_audit() == []
    other.db.dispose()


def test_rows_of_an_older_trueup_are_sealed_once_if_the_log_vouches_for_them(
    isolated_server: Server,
) -> None:
    server = isolated_server
    tenant, _tenant_id = setup_tenant(server)
    forged = hash_token("tu_u_forged")
    with server.plane.db.engine.begin() as conn:
        conn.execute(text("UPDATE tokens SET seal = NULL"))
        conn.execute(text("UPDATE users SET seal = NULL"))
        # One unsealed row the log contradicts: it must stay refused.
        conn.execute(
            text(
                "UPDATE tokens SET token_hash = :h WHERE token_hash = :old",
            ),
            {"h": forged, "old": hash_token(tenant.tokens["operator"])},
        )
    gaps = [str(p) for p in server.plane.verify_audit() if p.gap]
    assert any("not sealed (written by an older trueup)" in g for g in gaps), gaps

    # A server process started after the upgrade seals what the log vouches for.
    upgraded = ControlPlane(
        Database(server.url), load_or_create_server_key(server.key_file), auth_cache_seconds=0
    )
    try:
        assert upgraded.authenticate(tenant.tokens["viewer"]).role == Role.VIEWER
        assert upgraded.authenticate(tenant.devices["edge-01"]).device == "edge-01"
        with pytest.raises(Exception, match="changed behind the server's back"):
            upgraded.authenticate("tu_u_forged")
    finally:
        upgraded.db.dispose()
    remaining = problems(server)
    assert len(remaining) == 1 and "token_hash differs" in remaining[0], remaining
    with server.plane.db.engine.begin() as conn:
        sealed = conn.execute(
            text("SELECT count(*) FROM audit_log WHERE action = 'audit.seal'")
        ).scalar_one()
    assert sealed == 1


# -- a row rolled back to an earlier, sealed state ---------------------------------------------


def test_a_revocation_undone_in_the_table_alone_stays_refused(isolated_server: Server) -> None:
    """`revoked_at` is not sealed: clearing it must not revive the token the log revoked."""
    server = isolated_server
    tenant, tenant_id = setup_tenant(server)
    token_id, token = server.plane.create_token(tenant_id, "admin-user", "test", label="laptop")
    assert status(server, token) == 200
    server.plane.revoke_token(tenant_id, token_id, "test")
    with server.plane.db.engine.begin() as conn:
        conn.execute(text("UPDATE tokens SET revoked_at = NULL WHERE id = :id"), {"id": token_id})

    assert status(server, token) == 401
    assert status(server, tenant.tokens["admin"]) == 200  # only that token is refused
    assert any("revocation undone" in p for p in problems(server)), problems(server)


def test_a_used_enrollment_token_reset_in_the_table_is_not_exchanged_again(
    isolated_server: Server,
) -> None:
    server = isolated_server
    _tenant, tenant_id = setup_tenant(server)
    bundle = server.plane.enroll(tenant_id, "edge-02", "test", url="http://testserver")
    auth = {"Authorization": f"Bearer {bundle['token']}"}
    first = server.client.post("/api/v1/agent/enroll", headers=auth)
    assert first.status_code == 200, first.text
    with server.plane.db.engine.begin() as conn:
        conn.execute(
            text("UPDATE tokens SET used_at = NULL, revoked_at = NULL WHERE token_hash = :h"),
            {"h": hash_token(bundle["token"])},
        )

    assert server.client.post("/api/v1/agent/enroll", headers=auth).status_code == 401
    assert status(server, first.json()["credential"]) != 401  # the device keeps its credential


def test_a_demotion_undone_with_the_earlier_seal_does_not_authenticate(
    isolated_server: Server,
) -> None:
    """A user row restored to its earlier (role, seal) carries a valid seal: the log decides."""
    server = isolated_server
    tenant, tenant_id = setup_tenant(server)
    admin = tenant.tokens["admin"]
    with server.plane.db.engine.begin() as conn:
        before = conn.execute(
            text("SELECT role, seal FROM users WHERE name = 'admin-user' AND tenant_id = :t"),
            {"t": tenant_id},
        ).one()
    server.plane.set_role(tenant_id, "admin-user", Role.VIEWER, "test")
    users = "/api/v1/users"
    assert server.client.get(users, headers={"Authorization": f"Bearer {admin}"}).status_code == 403
    with server.plane.db.engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE users SET role = :r, seal = :s WHERE name = 'admin-user' AND tenant_id = :t"
            ),
            {"r": before.role, "s": before.seal, "t": tenant_id},
        )

    assert server.client.get(users, headers={"Authorization": f"Bearer {admin}"}).status_code == 401
    assert any(
        "admin-user: role is admin but the last audited role is viewer" in p
        for p in problems(server)
    )
