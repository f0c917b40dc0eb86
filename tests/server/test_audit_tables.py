"""Every audited table's findings, word for word and in order: each kind of row inserted,
changed or deleted behind the server's back, and each kind of malformed entry, on SQLite
and PostgreSQL."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from sqlalchemy import text

from tests.server.conftest import BACKENDS, Server, Tenant, document
from trueup.server import audit
from trueup.server.tokens import Role, hash_token

pytestmark = pytest.mark.parametrize("isolated_server", BACKENDS, indirect=True)

# The tables the audit log's own replay covers (coverchecks.py and inputchecks.py cover
# the rest, and chainproof.py the credentials: their own tests pin those).
OWN = {
    "tenants",
    "users",
    "devices",
    "tokens",
    "revisions",
    "acks",
    "secrets",
    "backups",
    "audit_log",
    "audit_head",
    "verify",
}


def found(server: Server) -> list[str]:
    return [str(p) for p in server.plane.verify_audit() if p.table in OWN]


def upload_backup(server: Server, tenant: Tenant, data: bytes) -> int:
    response = server.client.post(
        "/api/v1/agent/backups",
        content=data,
        headers={
            **tenant.device_auth("edge-01"),
            "Content-Type": "application/octet-stream",
            "X-Trueup-Backup-Sha256": hashlib.sha256(data).hexdigest(),
        },
    )
    assert response.status_code == 201, response.text
    return int(response.json()["id"])


def populated(server: Server) -> tuple[Tenant, int]:
    """Every kind of row the audit log's replay covers, written by the server."""
    tenant = server.tenant("acme", devices=("edge-01", "edge-02"))
    server.tenant("other")
    tenant_id = server.plane.tenant_id(tenant.name)
    for version, address in enumerate(("198.51.100.2/24", "198.51.100.3/24")):
        server.plane.put_desired(
            tenant_id, "edge-01", version, document("edge-01", address=address), author="alice"
        )
    server.plane.put_desired(tenant_id, "edge-02", 0, document("edge-02"), author="alice")
    server.plane.put_secret(tenant_id, "edge-01", "wg-key", "first", "alice")
    server.plane.put_secret(tenant_id, "edge-01", "api-key", "only", "alice")
    server.plane.acknowledge(tenant_id, "edge-01", "dhcp", 3600, "maintenance", "alice")
    server.plane.acknowledge(tenant_id, "edge-01", "dns", 3600, "maintenance", "alice")
    server.plane.set_role(tenant_id, "operator-user", Role.VIEWER, "alice")
    server.plane.create_user(tenant_id, "mover", Role.VIEWER, "alice")
    token_id, _token = server.plane.create_token(tenant_id, "admin-user", "alice", label="x")
    server.plane.revoke_token(tenant_id, token_id, "alice")
    for data in (b"first", b"second", b"third", b"fourth"):
        upload_backup(server, tenant, data)
    deleted = server.client.delete(
        "/api/v1/devices/edge-01/backups/1", headers=tenant.auth("admin")
    )
    assert deleted.status_code == 204, deleted.text
    assert [str(p) for p in server.plane.verify_audit()] == []
    return tenant, tenant_id


def tamper(server: Server, tenant_id: int) -> dict[str, Any]:
    """One change behind the server's back of each kind the replay can see; returns what
    the expected findings name."""
    with server.plane.db.engine.begin() as conn:

        def one(sql: str, **params: Any) -> Any:
            return conn.execute(text(sql), params).scalar_one()

        def run(sql: str, **params: Any) -> None:
            conn.execute(text(sql), params)

        other = one("SELECT id FROM tenants WHERE id <> :t", t=tenant_id)
        run("INSERT INTO tenants (name, created_at) VALUES ('direct', 0)")
        run("UPDATE tenants SET name = 'renamed' WHERE id = :t", t=tenant_id)
        # users
        run(
            "INSERT INTO users (tenant_id, name, role, created_at) "
            "VALUES (:t, 'direct-user', 'admin', 0)",
            t=tenant_id,
        )
        run(
            "UPDATE users SET role = 'admin' WHERE name = 'operator-user' AND tenant_id = :o",
            o=other,
        )
        run(
            "UPDATE users SET seal = NULL WHERE name = 'operator-user' AND tenant_id = :t",
            t=tenant_id,
        )
        run(
            "UPDATE users SET name = 'renamed-user' WHERE name = 'admin-user' AND tenant_id = :t",
            t=tenant_id,
        )
        run(
            "UPDATE users SET tenant_id = :o WHERE name = 'mover' AND tenant_id = :t",
            o=other,
            t=tenant_id,
        )
        # devices
        run(
            "INSERT INTO devices (tenant_id, name, created_at, desired_version) "
            "VALUES (:t, 'direct-edge', 0, 0)",
            t=tenant_id,
        )
        run("UPDATE devices SET name = 'edge-03' WHERE name = 'edge-02'")
        run("UPDATE devices SET desired_version = 5 WHERE name = 'edge-01'")
        edge01 = one("SELECT id FROM devices WHERE name = 'edge-01'")
        edge03 = one("SELECT id FROM devices WHERE name = 'edge-03'")
        # tokens
        user = one("SELECT id FROM users WHERE name = 'renamed-user'")
        run(
            "INSERT INTO tokens (tenant_id, kind, user_id, token_hash, label, created_at) "
            "VALUES (:t, 'user', :u, :h, 'backdoor', 0)",
            t=tenant_id,
            u=user,
            h=hash_token("tu_u_backdoor"),
        )
        revoked = one("SELECT id FROM tokens WHERE revoked_at IS NOT NULL AND kind = 'user'")
        run("UPDATE tokens SET revoked_at = NULL WHERE id = :i", i=revoked)
        first_user_token = one(
            "SELECT min(id) FROM tokens WHERE kind = 'user' AND tenant_id = :t", t=tenant_id
        )
        run(
            "UPDATE tokens SET token_hash = :h WHERE id = :i",
            h=hash_token("tu_u_swapped"),
            i=first_user_token,
        )
        device_token = one(
            "SELECT min(id) FROM tokens WHERE kind = 'device' AND device_id = :d", d=edge03
        )
        run("UPDATE tokens SET device_id = :d WHERE id = :i", d=edge01, i=device_token)
        unsealed = one("SELECT max(id) FROM tokens WHERE kind = 'enrollment'")
        run("UPDATE tokens SET seal = NULL WHERE id = :i", i=unsealed)
        # revisions
        run(
            "UPDATE revisions SET content_hash = 'edited' WHERE device_id = :d AND version = 1",
            d=edge01,
        )
        run("DELETE FROM revisions WHERE device_id = :d AND version = 2", d=edge01)
        run(
            "INSERT INTO revisions (device_id, version, author, content_hash, document, "
            "created_at) VALUES (:d, 9, 'mallory', 'x', 'not json', 0)",
            d=edge03,
        )
        # acks
        first_ack = one("SELECT min(id) FROM acks")
        expires = one("SELECT expires_at FROM acks WHERE id = :i", i=first_ack)
        run("UPDATE acks SET subsystem = 'firewall', expires_at = 1.5 WHERE id = :i", i=first_ack)
        run("DELETE FROM acks WHERE id <> :i", i=first_ack)
        run(
            "INSERT INTO acks (id, device_id, subsystem, reason, author, created_at, expires_at) "
            "VALUES (40, :d, 'ha', 'direct', 'mallory', 0, 1)",
            d=edge01,
        )
        # secrets
        wg = one("SELECT id FROM secrets WHERE name = 'wg-key'")
        run("UPDATE secrets SET name = 'wg-renamed', device_id = :d WHERE id = :i", d=edge03, i=wg)
        run(
            "INSERT INTO secrets (id, tenant_id, device_id, name, nonce, ciphertext, "
            "created_at) SELECT 'direct', tenant_id, device_id, 'direct', nonce, ciphertext, 0 "
            "FROM secrets WHERE name = 'api-key'"
        )
        # backups: 1 deleted by the server and restored; 2 deleted behind its back; 3's
        # content and sha256 changed; one inserted directly.
        run(
            "INSERT INTO backups (id, tenant_id, device_id, uploaded_at, size, sha256, "
            "metadata) VALUES (1, :t, :d, 0, 5, 'x', '{}')",
            t=tenant_id,
            d=edge01,
        )
        run("DELETE FROM backup_chunks WHERE backup_id = 2")
        run("DELETE FROM backups WHERE id = 2")
        run("UPDATE backups SET sha256 = 'changed', size = 6 WHERE id = 3")
        run("UPDATE backup_chunks SET data = :b WHERE backup_id = 3", b=b"3")
        run(
            "INSERT INTO backups (id, tenant_id, device_id, uploaded_at, size, sha256, "
            "metadata) VALUES (50, :t, :d, 0, 0, 'x', '{}')",
            t=tenant_id,
            d=edge01,
        )
    return {
        "t": tenant_id,
        "o": other,
        "revoked": revoked,
        "swapped": first_user_token,
        "device_token": device_token,
        "unsealed": unsealed,
        "user": user,
        "edge01": edge01,
        "edge03": edge03,
        "ack": first_ack,
        "expires": expires,
        "wg": wg,
    }


# What verification says about `tamper`'s changes, in this order.
EXPECTED = [
    "tenants renamed (id=1): name is 'renamed' but the audit log (seq=1) says '{tenant}' (changed behind the server's back)",
    "tenants direct (id=3): has no audit entry (inserted directly)",
    "not covered: users renamed/operator-user: not sealed (written by an older trueup)",
    "users renamed/renamed-user: name is 'renamed-user' but the audit log (seq=6) says 'admin-user' (changed behind the server's back)",
    "users renamed/renamed-user: seal does not match the row (changed behind the server's back); authentication refuses this user's tokens",
    "users {other}/operator-user: role is admin but the last audited role is operator (edited)",
    "users {other}/operator-user: seal does not match the row (changed behind the server's back); authentication refuses this user's tokens",
    "users {other}/mover: tenant is 2 but the audit log (seq=29) says 1 (changed behind the server's back)",
    "users {other}/mover: seal does not match the row (changed behind the server's back); authentication refuses this user's tokens",
    "users renamed/direct-user: has no audit entry (inserted directly)",
    "devices renamed/edge-01: desired_version is 5 but the newest audited revision is version 2 (seq=22): rewound or advanced behind the server's back",
    "devices renamed/edge-03: name is 'edge-03' but the audit log (seq=11) says 'edge-02' (changed behind the server's back)",
    "devices renamed/direct-edge: has no audit entry (inserted directly)",
    "tokens id=1 (user, tenant 1): token_hash differs from the one audited at seq=3: replaced behind the server's back (a token chosen by someone else)",
    "tokens id=1 (user, tenant 1): seal does not match the row (changed behind the server's back); authentication refuses this token",
    "not covered: tokens id=6 (enrollment, tenant 1): not sealed (written by an older trueup)",
    "tokens id=7 (device, tenant 1): device_id is 1 but the audit log (seq=13) says 2 (changed behind the server's back)",
    "tokens id=7 (device, tenant 1): seal does not match the row (changed behind the server's back); authentication refuses this token",
    "tokens id=11 (user, tenant 1): revoked at seq=31 but not revoked in the table (revocation undone)",
    "tokens id=12 (user, tenant 1): has no audit entry (inserted directly)",
    "revisions renamed/edge-01 version=1: document or content hash differs from the audited sha256:66dd6451573d23c290ae499176389d1091332d3ade8fee20ba72f5aec3b6cfa0 (edited)",
    "revisions renamed/edge-03 version=9: has no audit entry (inserted directly)",
    "revisions renamed/edge-01 version=2: audited at seq=22 but missing from the table (deleted)",
    "acks id=1 (firewall): subsystem is 'firewall' but the audit log (seq=26) says 'dhcp' (changed behind the server's back)",
    "acks id=1 (firewall): expires_at is 1.5 but the audit log (seq=26) says {expires!r} (changed behind the server's back)",
    "acks id=40 (ha): has no audit entry (inserted directly)",
    "acks id=2: audited at seq=27 but missing (deleted)",
    "secrets {wg} (wg-renamed): device_id is 2 but the audit log (seq=24) says 1 (changed behind the server's back)",
    "secrets {wg} (wg-renamed): name is 'wg-renamed' but the audit log (seq=24) says 'wg-key' (changed behind the server's back)",
    "secrets direct (direct): has no audit entry (inserted directly)",
    "backups id=1: deleted at seq=36 but still present (restored)",
    "backups id=3: sha256 is 'changed' but the audit log (seq=34) says 'b1e99324505bd32da0e1f85dcf5e19a09db0481e8a15f62c41eb320304a8e927' (changed behind the server's back)",
    "backups id=3: size is 6 but the audit log (seq=34) says 5 (changed behind the server's back)",
    "backups id=3: its chunks hold 1 bytes but 5 were audited at seq=34 (content changed behind the server's back)",
    "backups id=50: has no audit entry (inserted directly)",
    "backups id=2: uploaded at seq=33, never audited as deleted, but missing (deleted behind the server's back)",
]


def test_each_table_reports_each_change_in_its_own_words(isolated_server: Server) -> None:
    server = isolated_server
    tenant, tenant_id = populated(server)
    names = tamper(server, tenant_id)
    other = server.plane.db.engine.connect()
    with other:
        other_name = other.execute(
            text("SELECT name FROM tenants WHERE id = :o"), {"o": names["o"]}
        ).scalar_one()
    expected = [
        line.format(tenant=tenant.name, other=other_name, expires=names["expires"], wg=names["wg"])
        for line in EXPECTED
    ]
    assert found(server) == expected


MALFORMED: list[tuple[str, dict[str, Any]]] = [
    ("tenant.create", {}),
    ("user.create", {"user_id": 1}),
    ("user.role", {"user_id": True, "role": "admin"}),
    ("device.create", {"device_id": "one"}),
    ("token.create", {"token_id": None}),
    ("token.create", {"token_id": 1, "user_id": "x"}),
    ("device.enroll", {"token_id": 1, "revoked_token_ids": "all"}),
    ("device.enroll", {"token_id": 1, "device_id": 1, "token_hash": 5}),
    ("device.credential", {"token_id": 1, "enrollment_token_id": "e"}),
    ("device.credential", {"token_id": 1, "revoked_token_ids": [1, None]}),
    ("token.revoke", {}),
    ("revision.create", {}),
    ("revision.create", {"device_id": "one", "version": 1, "content_hash": "x"}),
    ("revision.create", {"device_id": 1, "version": 1, "content_hash": 3}),
    ("ack.create", {"ack_id": [1]}),
    ("ack.create", {"ack_id": 1, "subsystem": 2}),
    ("secret.put", {"secret_id": 7}),
    ("audit.seal", {"tokens": [1], "users": []}),
    ("audit.seal", {"tokens": [{"token_id": 1}], "users": []}),
    ("audit.seal", {"tokens": [], "users": [{"user_id": 1, "role": None}]}),
    ("audit.seal", {"tokens": [], "users": ["u"]}),
    ("backup.upload", {"backup_id": 1}),
    ("backup.upload", {"backup_id": 1, "device_id": 1, "sha256": "x"}),
    ("backup.delete", {"device_id": 1}),
]


# The entries `MALFORMED` appends from seq=11 on, as verification names them.
MALFORMED_FOUND = [
    "audit_log seq=11 (tenant.create tenant:nobody): detail malformed (no tenant id); the rows this entry vouches for are not covered",
    "audit_log seq=13 (user.create device:edge-01): detail malformed ('role' is missing); the rows this entry vouches for are not covered",
    "audit_log seq=14 (user.role device:edge-01): detail malformed ('user_id' is not an integer); the rows this entry vouches for are not covered",
    "audit_log seq=15 (device.create device:edge-01): detail malformed ('device_id' is not an integer); the rows this entry vouches for are not covered",
    "audit_log seq=16 (token.create device:edge-01): detail malformed ('token_id' is missing); the rows this entry vouches for are not covered",
    "audit_log seq=17 (token.create device:edge-01): detail malformed ('user_id' is not an integer); the rows this entry vouches for are not covered",
    "audit_log seq=18 (device.enroll device:edge-01): detail malformed ('revoked_token_ids' is not a list of integers); the rows this entry vouches for are not covered",
    "audit_log seq=19 (device.enroll device:edge-01): detail malformed ('token_hash' is not a string); the rows this entry vouches for are not covered",
    "audit_log seq=20 (device.credential device:edge-01): detail malformed ('enrollment_token_id' is not an integer); the rows this entry vouches for are not covered",
    "audit_log seq=21 (device.credential device:edge-01): detail malformed ('revoked_token_ids' is not a list of integers); the rows this entry vouches for are not covered",
    "audit_log seq=22 (token.revoke device:edge-01): detail malformed (no token id); the rows this entry vouches for are not covered",
    "audit_log seq=23 (revision.create device:edge-01): detail malformed ('device_id' is missing); the rows this entry vouches for are not covered",
    "audit_log seq=24 (revision.create device:edge-01): detail malformed ('device_id' is not an integer); the rows this entry vouches for are not covered",
    "audit_log seq=25 (revision.create device:edge-01): detail malformed ('content_hash' is not a string); the rows this entry vouches for are not covered",
    "audit_log seq=26 (ack.create device:edge-01): detail malformed ('ack_id' is not an integer); the rows this entry vouches for are not covered",
    "audit_log seq=27 (ack.create device:edge-01): detail malformed ('subsystem' is not a string); the rows this entry vouches for are not covered",
    "audit_log seq=28 (secret.put device:edge-01): detail malformed ('secret_id' is not a string); the rows this entry vouches for are not covered",
    "audit_log seq=29 (audit.seal device:edge-01): detail malformed (a sealed token is not an object); the rows this entry vouches for are not covered",
    "audit_log seq=30 (audit.seal device:edge-01): detail malformed ('kind' is missing); the rows this entry vouches for are not covered",
    "audit_log seq=31 (audit.seal device:edge-01): detail malformed ('role' is missing); the rows this entry vouches for are not covered",
    "audit_log seq=32 (audit.seal device:edge-01): detail malformed (a sealed user is not an object); the rows this entry vouches for are not covered",
    "audit_log seq=33 (backup.upload device:edge-01): detail malformed ('device_id' is missing); the rows this entry vouches for are not covered",
    "audit_log seq=34 (backup.upload device:edge-01): detail malformed ('size' is missing); the rows this entry vouches for are not covered",
    "audit_log seq=35 (backup.delete device:edge-01): detail malformed ('backup_id' is missing); the rows this entry vouches for are not covered",
    "audit_log seq=36 (token.revoke token:abc): detail malformed (no token id); the rows this entry vouches for are not covered",
    "audit_log seq=37 (ack.create device:edge-01): detail malformed (detail is not a JSON object); the rows this entry vouches for are not covered",
]


def test_each_malformed_entry_is_named_with_what_is_wrong(isolated_server: Server) -> None:
    server = isolated_server
    tenant = server.tenant("acme", devices=("edge-01",))
    tenant_id = server.plane.tenant_id(tenant.name)
    with server.plane.db.engine.begin() as conn:
        audit.append(
            conn,
            server.plane.key,
            tenant_id=None,
            actor="test",
            action="tenant.create",
            target="tenant:nobody",
            detail={},
        )
        for action, detail in MALFORMED:
            audit.append(
                conn,
                server.plane.key,
                tenant_id=tenant_id,
                actor="test",
                action=action,
                target="device:edge-01",
                detail=detail,
            )
        audit.append(
            conn,
            server.plane.key,
            tenant_id=tenant_id,
            actor="test",
            action="token.revoke",
            target="token:abc",
            detail={},
        )
        audit.append(
            conn,
            server.plane.key,
            tenant_id=tenant_id,
            actor="test",
            action="ack.create",
            target="device:edge-01",
            detail=[1],  # type: ignore[arg-type]
        )
    assert found(server) == MALFORMED_FOUND


def test_sealing_vouches_for_the_rows_the_log_agrees_with_and_records_them(
    isolated_server: Server,
) -> None:
    server = isolated_server
    tenant = server.tenant("acme", devices=("edge-01",))
    tenant_id = server.plane.tenant_id(tenant.name)
    with server.plane.db.engine.begin() as conn:
        conn.execute(text("UPDATE tokens SET seal = NULL"))
        conn.execute(text("UPDATE users SET seal = NULL"))
        # Contradicted by the log: a token's hash and a user's role; both stay unsealed.
        conn.execute(
            text("UPDATE tokens SET token_hash = :h WHERE token_hash = :old"),
            {"h": hash_token("tu_u_forged"), "old": hash_token(tenant.tokens["operator"])},
        )
        conn.execute(text("UPDATE users SET role = 'admin' WHERE name = 'viewer-user'"))
    with server.plane.db.engine.begin() as conn:
        sealed = audit.seal_unsealed(conn, server.plane.key, actor="test")
    with server.plane.db.engine.begin() as conn:
        tokens = conn.execute(text("SELECT * FROM tokens ORDER BY id")).mappings().all()
        users = conn.execute(text("SELECT * FROM users ORDER BY id")).mappings().all()
        (detail,) = conn.execute(
            text("SELECT detail FROM audit_log WHERE action = 'audit.seal'")
        ).scalars()
    unsealed = [t["id"] for t in tokens if t["seal"] is None]
    assert [u["name"] for u in users if u["seal"] is None] == ["viewer-user"]
    assert len(unsealed) == 1 and unsealed[0] != tokens[0]["id"]
    assert json.loads(detail) == {
        "tokens": [
            {
                "token_id": t["id"],
                "tenant_id": tenant_id,
                "kind": t["kind"],
                "user_id": t["user_id"],
                "device_id": t["device_id"],
                "token_hash": t["token_hash"],
                "revoked": t["revoked_at"] is not None,
            }
            for t in tokens
            if t["seal"] is not None
        ],
        "users": [
            {"user_id": u["id"], "tenant_id": tenant_id, "name": u["name"], "role": u["role"]}
            for u in users
            if u["seal"] is not None
        ],
    }
    assert sealed == len(tokens) - 1 + len(users) - 1
    with server.plane.db.engine.begin() as conn:
        assert audit.seal_unsealed(conn, server.plane.key, actor="test") == 0
