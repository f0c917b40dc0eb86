"""`trueup server audit verify` covers everything with a security meaning: secret versions
and values, deleted secrets, notification targets, evidence bundles, revision authors and
comments, roles and tenant membership. Each case is a direct SQL edit behind a running
server; the data paths that would serve the result (a device's secrets, an evidence
download) refuse it. Every test runs on SQLite and PostgreSQL."""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from typing import Any

import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from tests.server.conftest import BACKENDS, Server, Tenant, document
from tests.server.test_dashboard import browser
from tests.server.test_profiles import profile
from trueup.cli.server import server_app
from trueup.model.document import document_digest, parse_document
from trueup.model.layering import Provenance
from trueup.server import audit
from trueup.server.db import Database
from trueup.server.keys import SecretBox, load_or_create_server_key
from trueup.server.service import ControlPlane
from trueup.server.service.evidence import EvidenceGone
from trueup.server.service.fleettypes import Plan, Target
from trueup.server.tables import notify_targets, revisions, secrets, tenants
from trueup.server.tokens import Role

pytestmark = pytest.mark.parametrize("isolated_server", BACKENDS, indirect=True)

NOTIFY = "/api/v1/notifications"


def verify(server: Server) -> Any:
    return CliRunner().invoke(
        server_app,
        ["audit", "verify", "--db", server.url, "--key-file", str(server.key_file)],
    )


def failed_naming(server: Server, *expected: str) -> str:
    """verify exits 1 and its output contains each expected text; returns the output."""
    result = verify(server)
    assert result.exit_code == 1, result.output
    for text_ in expected:
        assert text_ in result.output, (text_, result.output)
    assert "Traceback" not in result.output
    return str(result.output)


def agent_secrets(server: Server, tenant: Tenant) -> dict[str, Any]:
    response = server.client.get("/api/v1/agent/secrets", headers=tenant.device_auth("edge-01"))
    assert response.status_code == 200, response.text
    return dict(response.json())


def upload_evidence(server: Server, tenant: Tenant, data: bytes) -> int:
    response = server.client.post(
        "/api/v1/agent/evidence",
        content=data,
        headers={
            **tenant.device_auth("edge-01"),
            "Content-Type": "application/octet-stream",
            "X-Trueup-Evidence-Sha256": hashlib.sha256(data).hexdigest(),
        },
    )
    assert response.status_code == 201, response.text
    return int(response.json()["id"])


def populated(server: Server) -> tuple[Tenant, int]:
    """A tenant with every kind of audited write, through the API and the service."""
    tenant = server.tenant("acme", devices=("edge-01",))
    tenant_id = server.plane.tenant_id(tenant.name)
    for version, address in enumerate(("198.51.100.2/24", "198.51.100.3/24")):
        server.plane.put_desired(
            tenant_id,
            "edge-01",
            version,
            document("edge-01", address=address),
            author="alice",
            comment=f"change {version + 1}",
        )
    for value in ("first-key", "second-key"):
        server.plane.put_secret(tenant_id, "edge-01", "wg-key", value, "alice")
    server.plane.put_secret(tenant_id, "edge-01", "api-key", "only-one", "alice")
    admin = tenant.auth("admin")
    for name in ("pager", "old-pager"):
        body = {"name": name, "url": f"https://hooks.example.net/{name}"}
        created = server.client.post(f"{NOTIFY}/targets", json=body, headers=admin)
        assert created.status_code == 201, created.text
    with_header = {
        "name": "ticketing",
        "url": "https://tickets.example.net/hook",
        "auth_header": {"name": "Authorization", "value": "Bearer t0ken"},
    }
    created = server.client.post(f"{NOTIFY}/targets", json=with_header, headers=admin)
    assert created.status_code == 201, created.text
    allowlist = {"entries": ["198.51.100.0/24"]}
    listed = server.client.put(f"{NOTIFY}/allowlist", json=allowlist, headers=admin)
    assert listed.status_code == 200, listed.text
    rule = {"name": "crit", "target": "pager", "match": {"min_severity": "critical"}}
    assert server.client.post(f"{NOTIFY}/rules", json=rule, headers=admin).status_code == 201
    assert server.client.delete(f"{NOTIFY}/targets/old-pager", headers=admin).status_code == 204
    server.plane.request_evidence(tenant_id, "edge-01", "alice")
    evidence_id = upload_evidence(server, tenant, b"an evidence bundle")
    download = server.client.get(
        f"/api/v1/devices/edge-01/evidence/{evidence_id}", headers=tenant.auth("viewer")
    )
    assert download.status_code == 200 and download.content == b"an evidence bundle"
    server.plane.acknowledge(tenant_id, "edge-01", "dhcp", 3600, "maintenance", "alice")
    rolled_back = {
        "applied_version": 3,
        "confirmation": {
            "version": 2,
            "state": "rolled-back",
            "deadline": time.time(),
            "reason": "the confirmation window passed while still waiting for: the control "
            "plane reached after the apply",
            "rollback_to": 1,
            "rolled_back_to_version": 3,
        },
    }
    reported = server.client.post(
        "/api/v1/agent/report", json=rolled_back, headers=tenant.device_auth("edge-01")
    )
    assert reported.status_code == 200, reported.text
    labelled = server.client.put(
        "/api/v1/devices/edge-01/labels",
        json={"site": "ams", "role": "edge"},
        headers=tenant.auth("operator"),
    )
    assert labelled.status_code == 200, labelled.text
    server.plane.set_role(tenant_id, "operator-user", Role.VIEWER, "alice")
    token_id, _token = server.plane.create_token(tenant_id, "admin-user", "alice", label="x")
    server.plane.revoke_token(tenant_id, token_id, "alice")
    # Fleet inputs: a profile's versions (a deletion and a re-creation), a device's
    # variables and own layer.
    server.plane.put_profile(tenant_id, "mtu", 0, profile("mtu", selector=""), actor="alice")
    server.plane.put_profile(
        tenant_id,
        "mtu",
        1,
        profile("mtu", selector="", mtu_default=9000),
        actor="alice",
        comment="jumbo",
    )
    server.plane.delete_profile(tenant_id, "mtu", 2, actor="alice")
    server.plane.put_profile(tenant_id, "mtu", 0, profile("mtu", selector=""), actor="alice")
    server.plane.put_device_variables(
        tenant_id, "edge-01", 0, variables={"mtu": 1400}, own={}, actor="alice"
    )
    return tenant, tenant_id


def secret_row(server: Server, tenant_id: int, name: str) -> Any:
    with server.plane.db.engine.begin() as conn:
        return conn.execute(
            text("SELECT * FROM secrets WHERE tenant_id = :t AND name = :n"),
            {"t": tenant_id, "n": name},
        ).one()


def test_an_untouched_database_of_every_kind_of_write_is_intact(isolated_server: Server) -> None:
    server = isolated_server
    tenant, _tenant_id = populated(server)
    assert [str(p) for p in server.plane.verify_audit()] == []
    result = verify(server)
    assert result.exit_code == 0, result.output
    assert result.output.strip().endswith("audit log intact")
    assert agent_secrets(server, tenant) == {
        "secrets": {"wg-key": "second-key", "api-key": "only-one"},
        "refused": [],
    }


def test_a_secret_rolled_back_to_its_old_sealed_row_is_named_and_not_served(
    isolated_server: Server,
) -> None:
    server = isolated_server
    tenant, tenant_id = populated(server)
    old = secret_row(server, tenant_id, "wg-key")  # version 2
    server.plane.put_secret(tenant_id, "edge-01", "wg-key", "third-key", "alice")
    assert agent_secrets(server, tenant)["secrets"]["wg-key"] == "third-key"
    with server.plane.db.engine.begin() as conn:
        conn.execute(
            text("DELETE FROM secrets WHERE tenant_id = :t AND name = 'wg-key'"), {"t": tenant_id}
        )
        conn.execute(secrets.insert().values(**old._asdict()))

    answer = agent_secrets(server, tenant)
    assert answer["secrets"] == {"api-key": "only-one"}  # the other secret is still served
    (refused,) = answer["refused"]
    assert refused["name"] == "wg-key"
    assert "version 2 but the audit log's newest is version 3" in refused["error"]
    assert "second-key" not in str(answer)
    failed_naming(
        server,
        f"secret wg-key (tenant {tenant.name}, device edge-01): the live row is version 2, "
        "the log's newest is version 3",
    )


def test_a_secret_value_swapped_under_its_own_id_is_refused_by_the_digest(
    isolated_server: Server,
) -> None:
    """A row resealed under its own id (someone holding the tenant's data key, not the
    server key) opens, but its value is not the audited one."""
    server = isolated_server
    tenant, tenant_id = populated(server)
    row = secret_row(server, tenant_id, "api-key")
    with server.plane.db.engine.begin() as conn:
        wrapped = conn.execute(
            text("SELECT data_key_wrapped FROM tenants WHERE id = :t"), {"t": tenant_id}
        ).scalar_one()
        box = SecretBox(tenant_id, server.plane.key.unwrap_tenant_key(tenant_id, wrapped))
        nonce, ciphertext = box.seal(row.id, b"attacker-chosen")
        conn.execute(
            text("UPDATE secrets SET nonce = :n, ciphertext = :c WHERE id = :id"),
            {"n": nonce, "c": ciphertext, "id": row.id},
        )
    answer = agent_secrets(server, tenant)
    assert "api-key" not in answer["secrets"]
    assert any(
        r["name"] == "api-key" and "differs from the audited digest" in r["error"]
        for r in answer["refused"]
    ), answer
    failed_naming(
        server,
        f"secret api-key (tenant {tenant.name}, device edge-01): its value differs from the "
        "audited digest",
    )


def test_a_deleted_secret_is_named(isolated_server: Server) -> None:
    server = isolated_server
    tenant, tenant_id = populated(server)
    with server.plane.db.engine.begin() as conn:
        conn.execute(
            text("DELETE FROM secrets WHERE tenant_id = :t AND name = 'api-key'"), {"t": tenant_id}
        )
    failed_naming(
        server,
        f"secret api-key (tenant {tenant.name}, device edge-01): deleted without an audited delete",
    )


def test_a_rewritten_notification_target_is_named(isolated_server: Server) -> None:
    server = isolated_server
    tenant, tenant_id = populated(server)
    with server.plane.db.engine.begin() as conn:
        ids = dict(
            conn.execute(
                text("SELECT name, id FROM notify_targets WHERE tenant_id = :t"), {"t": tenant_id}
            ).all()
        )
        pager = ids["pager"]
        (deleted,) = [i for n, i in ids.items() if n not in ("pager", "ticketing")]
        conn.execute(
            text("UPDATE notify_targets SET url = 'https://attacker.example.net/' WHERE id = :i"),
            {"i": pager},
        )
        # The deleted target brought back, with the other one's sealed signing secret.
        conn.execute(
            text(
                "UPDATE notify_targets SET deleted_at = NULL, nonce = "
                "(SELECT nonce FROM notify_targets WHERE id = :p), ciphertext = "
                "(SELECT ciphertext FROM notify_targets WHERE id = :p) WHERE id = :d"
            ),
            {"p": pager, "d": deleted},
        )
    failed_naming(
        server,
        f"notification target {pager} (tenant {tenant.name}): url differs from the audited one",
        "'https://attacker.example.net/' instead of 'https://hooks.example.net/pager'",
        f"notification target {deleted} (tenant {tenant.name}): deleted_at differs",
        f"notification target {deleted} (tenant {tenant.name}): its sealed signing secret "
        "differs from the audited one",
    )


def test_a_rewritten_webhook_allowlist_or_secret_header_is_named(isolated_server: Server) -> None:
    server = isolated_server
    tenant, tenant_id = populated(server)
    with server.plane.db.engine.begin() as conn:
        conn.execute(
            text("UPDATE notify_allowlists SET entries = :e WHERE tenant_id = :t"),
            {"e": json.dumps(["127.0.0.0/8", "198.51.100.0/24"]), "t": tenant_id},
        )
        conn.execute(
            text(
                "UPDATE notify_targets SET auth_header_name = 'X-Other' "
                "WHERE tenant_id = :t AND name = 'ticketing'"
            ),
            {"t": tenant_id},
        )
    failed_naming(
        server,
        f"webhook allowlist tenant {tenant.name}: entries differs from the audited one",
        "'127.0.0.0/8'",
        "auth_header_name differs from the audited one",
    )
    with server.plane.db.engine.begin() as conn:
        conn.execute(text("DELETE FROM notify_allowlists WHERE tenant_id = :t"), {"t": tenant_id})
    failed_naming(
        server, f"webhook allowlist tenant {tenant.name}: audited at seq=", "missing from the table"
    )


def test_a_target_inserted_directly_is_named(isolated_server: Server) -> None:
    server = isolated_server
    tenant, tenant_id = populated(server)
    with server.plane.db.engine.begin() as conn:
        new_id = conn.execute(
            notify_targets.insert().values(
                tenant_id=tenant_id,
                name="inside",
                url="http://192.0.2.1/",
                secret_id="0" * 32,
                nonce=b"n" * 12,
                ciphertext=b"c" * 32,
                created_at=time.time(),
            )
        ).inserted_primary_key
        assert new_id is not None
    failed_naming(
        server,
        f"notification target {new_id[0]} (tenant {tenant.name}): has no audit entry",
    )


def test_a_swapped_evidence_bundle_is_named_and_not_downloaded(isolated_server: Server) -> None:
    server = isolated_server
    tenant, _tenant_id = populated(server)
    evidence_id = upload_evidence(server, tenant, b"the real bundle")
    forged = b"a forged bundle, longer"
    with server.plane.db.engine.begin() as conn:
        conn.execute(
            text("UPDATE evidence_chunks SET data = :d WHERE evidence_id = :e"),
            {"d": forged, "e": evidence_id},
        )
        conn.execute(
            text("UPDATE evidence SET sha256 = :s, size = :n WHERE id = :e"),
            {"s": hashlib.sha256(forged).hexdigest(), "n": len(forged), "e": evidence_id},
        )
    download = server.client.get(
        f"/api/v1/devices/edge-01/evidence/{evidence_id}", headers=tenant.auth("viewer")
    )
    assert download.status_code == 409, download.text
    assert "not the one the audit log recorded" in download.json()["detail"]
    assert b"forged" not in download.content
    viewer = browser(server, tenant, "viewer")
    page = viewer.get(f"/ui/devices/edge-01/evidence/{evidence_id}")
    assert page.status_code == 409
    assert "not the one the audit log recorded" in page.text and "forged" not in page.text
    failed_naming(
        server,
        f"evidence bundle {evidence_id} (edge-01): sha256 differs from the audited one",
        f"evidence bundle {evidence_id} (edge-01): content digest differs from the audited one",
    )


def test_evidence_content_swapped_alone_is_cut_short(isolated_server: Server) -> None:
    """Same size, row untouched: the summary matches the log, the bytes do not."""
    server = isolated_server
    tenant, _tenant_id = populated(server)
    evidence_id = upload_evidence(server, tenant, b"the real bundle")
    with server.plane.db.engine.begin() as conn:
        conn.execute(
            text("UPDATE evidence_chunks SET data = :d WHERE evidence_id = :e"),
            {"d": b"the fake bundle", "e": evidence_id},
        )
    with pytest.raises(EvidenceGone, match="does not hash to the audited sha256"):
        list(server.plane.evidence_content(evidence_id))
    failed_naming(
        server,
        f"evidence bundle {evidence_id} (edge-01): content digest differs from the audited one",
    )


def test_a_deleted_evidence_bundle_is_named(isolated_server: Server) -> None:
    server = isolated_server
    tenant, _tenant_id = populated(server)
    evidence_id = upload_evidence(server, tenant, b"kept for the incident")
    with server.plane.db.engine.begin() as conn:
        conn.execute(text("DELETE FROM evidence_chunks WHERE evidence_id = :e"), {"e": evidence_id})
        conn.execute(text("DELETE FROM evidence WHERE id = :e"), {"e": evidence_id})
    failed_naming(
        server,
        f"evidence bundle {evidence_id}: uploaded at seq=",
        "never audited as deleted, but missing",
    )


def test_a_rewritten_revision_author_or_comment_is_named(isolated_server: Server) -> None:
    server = isolated_server
    populated(server)
    with server.plane.db.engine.begin() as conn:
        conn.execute(text("UPDATE revisions SET author = 'mallory' WHERE version = 1"))
        conn.execute(text("UPDATE revisions SET comment = 'nothing to see' WHERE version = 2"))
    failed_naming(
        server,
        "revision 1 of edge-01: author differs from the audited one",
        "'mallory' instead of 'alice'",
        "revision 2 of edge-01: comment differs from the audited one",
    )


def test_every_step_of_a_rollout_is_audited_and_its_revisions_are_covered(
    isolated_server: Server,
) -> None:
    """A rollout started, paused, resumed and aborted: each step in the log, the chain
    intact; the revision it sent and the one that put the device back are covered like any
    other (a rewritten one is named)."""
    server = isolated_server
    _tenant, tenant_id = populated(server)
    body = document("edge-01", address="198.51.100.4/24")
    target = Target(
        device_id=server.plane.device_id(tenant_id, "edge-01"),
        device="edge-01",
        from_version=2,
        document=body,
        digest=document_digest(parse_document(body)),
        provenance=Provenance(profiles=(), variables_digest="", own_digest=None),
        changes=(),
    )
    plan = Plan(targets=(target,), refused=(), unchanged=0)
    rollout_id = server.plane.start_rollout(tenant_id, plan, actor="alice")["id"]
    server.plane.rollout_controller.step()  # sends it (this process may hold the lease)
    wait = time.monotonic() + 120
    while server.plane.rollout(tenant_id, rollout_id)["members"][0]["state"] != "sent":
        assert time.monotonic() < wait, "the rollout never sent its revision"
        server.plane.rollout_controller.step()
    server.plane.pause_rollout(tenant_id, rollout_id, actor="alice", reason="a look first")
    server.plane.resume_rollout(tenant_id, rollout_id, actor="alice")
    aborted = server.plane.abort_rollout(tenant_id, rollout_id, actor="alice")
    assert aborted["members"][0]["state"] == "reverted"
    actions = [e["action"] for e in server.plane.audit_entries(tenant_id, limit=1000)]
    for action in (
        "rollout.start",
        "rollout.send",
        "rollout.pause",
        "rollout.resume",
        "rollout.abort",
    ):
        assert action in actions, (action, actions)
    assert [str(p) for p in server.plane.verify_audit()] == []
    assert verify(server).exit_code == 0
    with server.plane.db.engine.begin() as conn:
        conn.execute(text("UPDATE revisions SET comment = 'quietly' WHERE version = 3"))
    failed_naming(server, "revision 3 of edge-01: comment differs from the audited one")


def test_a_role_grant_and_a_tenant_move_in_the_table_are_named(isolated_server: Server) -> None:
    server = isolated_server
    tenant, tenant_id = populated(server)
    other = server.tenant("other")
    other_id = server.plane.tenant_id(other.name)
    with server.plane.db.engine.begin() as conn:
        conn.execute(
            text("UPDATE users SET role = 'admin' WHERE name = 'viewer-user' AND tenant_id = :t"),
            {"t": tenant_id},
        )
        conn.execute(
            text(
                "UPDATE users SET tenant_id = :o, name = 'ops' "
                "WHERE name = 'operator-user' AND tenant_id = :t"
            ),
            {"o": other_id, "t": tenant_id},
        )
    failed_naming(
        server,
        f"users {tenant.name}/viewer-user: role is admin but the last audited role is viewer",
        f"users {other.name}/ops: tenant is {other_id}",
        f"users {other.name}/ops: name is 'ops'",
    )


# -- entries written by an older trueup ----------------------------------------------------------


def _older_writes(server: Server, tenant_id: int) -> tuple[str, int]:
    """A secret, a target and a revision written as an older trueup did: table rows plus
    audit entries in the old shape (no version or digest, no target id, no author or
    comment). Returns (the secret's id, the target's id)."""
    key = server.plane.key
    secret_id = uuid.uuid4().hex
    with server.plane.db.write() as conn:
        device = conn.execute(
            text("SELECT id, desired_version FROM devices WHERE tenant_id = :t"), {"t": tenant_id}
        ).one()
        wrapped = conn.execute(
            tenants.select()
            .with_only_columns(tenants.c.data_key_wrapped)
            .where(tenants.c.id == tenant_id)
        ).scalar_one()
        box = SecretBox(tenant_id, key.unwrap_tenant_key(tenant_id, wrapped))
        nonce, ciphertext = box.seal(secret_id, b"from-an-older-server")
        conn.execute(
            secrets.insert().values(
                id=secret_id,
                tenant_id=tenant_id,
                device_id=device.id,
                name="old-key",
                nonce=nonce,
                ciphertext=ciphertext,
                created_at=time.time(),
            )
        )
        audit.append(
            conn,
            key,
            tenant_id=tenant_id,
            actor="alice",
            action="secret.put",
            target="device:edge-01/secret:old-key",
            detail={"secret_id": secret_id, "device_id": device.id, "name": "old-key"},
        )
        nonce, ciphertext = box.seal("1" * 32, b"signing")
        target_id = conn.execute(
            notify_targets.insert().values(
                tenant_id=tenant_id,
                name="old-hook",
                url="https://hooks.example.net/old",
                secret_id="1" * 32,
                nonce=nonce,
                ciphertext=ciphertext,
                created_at=time.time(),
            )
        ).inserted_primary_key
        assert target_id is not None
        audit.append(
            conn,
            key,
            tenant_id=tenant_id,
            actor="alice",
            action="notify.target.create",
            target="notify-target:old-hook",
            detail={"url": "https://hooks.example.net/old", "secret_generated": True},
        )
        version = device.desired_version + 1
        body = document("edge-01", address="198.51.100.9/24")
        parsed = parse_document(body)
        content_hash = document_digest(parsed)
        conn.execute(
            revisions.insert().values(
                device_id=device.id,
                version=version,
                parent_version=device.desired_version,
                author="alice",
                comment="",
                content_hash=content_hash,
                document=json.dumps(parsed.with_version(version).canonical(), sort_keys=True),
                created_at=time.time(),
            )
        )
        conn.execute(
            text("UPDATE devices SET desired_version = :v WHERE id = :d"),
            {"v": version, "d": device.id},
        )
        audit.append(
            conn,
            key,
            tenant_id=tenant_id,
            actor="alice",
            action="revision.create",
            target="device:edge-01",
            detail={"device_id": device.id, "version": version, "content_hash": content_hash},
        )
    with server.plane.db.read() as conn:
        audit.advance_checkpoint(conn, key)
    return secret_id, int(target_id[0])


def test_entries_of_an_older_trueup_still_verify_as_not_covered(isolated_server: Server) -> None:
    server = isolated_server
    tenant, tenant_id = populated(server)
    _secret_id, target_id = _older_writes(server, tenant_id)

    result = verify(server)
    assert result.exit_code == 0, result.output
    assert "audit log intact (3 item(s) not covered)" in result.output
    assert (
        f"not covered: secret old-key (tenant {tenant.name}, device edge-01): its value's "
        "digest is not in the audit log" in result.output
    )
    assert (
        f"not covered: notification target {target_id} (tenant {tenant.name}): only its url "
        "is in the audit log" in result.output
    )
    assert "not covered: revision 3 of edge-01: its comment is not in the audit log" in (
        result.output
    )
    # The old secret is the newest audited version of its name: it is served.
    assert agent_secrets(server, tenant)["secrets"]["old-key"] == "from-an-older-server"
    # A new put on top of it continues the numbering, and covers it from then on.
    put = server.plane.put_secret(tenant_id, "edge-01", "old-key", "renewed", "alice")
    assert put["version"] == 2
    assert agent_secrets(server, tenant)["secrets"]["old-key"] == "renewed"

    # The old shapes still catch what they recorded: the url, the secret's id.
    with server.plane.db.engine.begin() as conn:
        conn.execute(
            text("UPDATE notify_targets SET url = 'https://attacker.example.net/' WHERE id = :i"),
            {"i": target_id},
        )
    failed_naming(server, f"notification target {target_id} (tenant {tenant.name}): url differs")


def test_a_rollback_with_its_put_entry_deleted_is_refused_by_a_fresh_process(
    isolated_server: Server,
) -> None:
    """The newest put's entry removed from the middle of the log: a process that never saw
    it finds the break after the older version's entry and does not serve that version."""
    server = isolated_server
    tenant, tenant_id = populated(server)
    old = secret_row(server, tenant_id, "wg-key")
    server.plane.put_secret(tenant_id, "edge-01", "wg-key", "third-key", "alice")
    server.plane.create_user(tenant_id, "later", Role.VIEWER, "alice")  # the put is not last
    with server.plane.db.engine.begin() as conn:
        put_seq = conn.execute(
            text("SELECT max(seq) FROM audit_log WHERE action = 'secret.put'")
        ).scalar_one()
        conn.execute(text("DELETE FROM audit_log WHERE seq = :s"), {"s": put_seq})
        conn.execute(
            text("DELETE FROM secrets WHERE tenant_id = :t AND name = 'wg-key'"), {"t": tenant_id}
        )
        conn.execute(secrets.insert().values(**old._asdict()))
        device_id = conn.execute(
            text("SELECT id FROM devices WHERE tenant_id = :t"), {"t": tenant_id}
        ).scalar_one()

    fresh = ControlPlane(Database(server.url), load_or_create_server_key(server.key_file))
    try:
        answer = fresh.device_secrets(tenant_id, device_id)
    finally:
        fresh.db.dispose()
    # Every secret whose newest audited version precedes the break is refused: a newer
    # version of any of them may be what the deleted entry recorded.
    assert answer["secrets"] == {}
    assert sorted(r["name"] for r in answer["refused"]) == ["api-key", "wg-key"]
    assert all(
        f"does not hold together at seq={put_seq + 1}" in r["error"] for r in answer["refused"]
    ), answer
    # The running server refuses more: the device's credential was issued before the
    # break, so the log can no longer vouch that it was not revoked.
    running = server.client.get("/api/v1/agent/secrets", headers=tenant.device_auth("edge-01"))
    assert running.status_code == 401, running.text
    assert f"the audit chain is broken at seq {put_seq}" in running.text
    failed_naming(server, f"audit_log seq={put_seq}: row(s) deleted from the chain")


def test_a_profile_version_rewritten_inserted_or_deleted_is_named(isolated_server: Server) -> None:
    server = isolated_server
    populated(server)
    with server.plane.db.engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE profiles SET document = replace(document, '9000', '9001') "
                "WHERE name = 'mtu' AND version = 2"
            )
        )
        conn.execute(text("UPDATE profiles SET created_by = 'mallory' WHERE version = 1"))
        conn.execute(text("DELETE FROM profiles WHERE version = 3"))
        conn.execute(
            text(
                "INSERT INTO profiles (tenant_id, name, version, document, digest, created_by, "
                "created_at, comment, deleted) SELECT tenant_id, 'forged', 1, document, digest, "
                "created_by, created_at, '', 0 FROM profiles WHERE version = 4"
            )
        )
    failed_naming(
        server,
        "mtu version 2",
        "does not hash to the audited digest",
        "created_by differs",
        "mtu version 3",
        "missing from the table",
        "forged version 1",
        "inserted directly",
    )


def test_device_variables_or_own_layer_changed_behind_the_server_are_named(
    isolated_server: Server,
) -> None:
    server = isolated_server
    populated(server)
    with server.plane.db.engine.begin() as conn:
        conn.execute(text("""UPDATE device_inputs SET variables = '{"mtu": 1280}'"""))
    failed_naming(server, "variables of edge-01", "variables differs")
    with server.plane.db.engine.begin() as conn:
        conn.execute(text("""UPDATE device_inputs SET variables = '{"mtu": 1400}', own = NULL"""))
    failed_naming(server, "variables of edge-01", "own layer differs")
    with server.plane.db.engine.begin() as conn:
        conn.execute(text("UPDATE device_inputs SET version = 2, own = '{}'"))
    failed_naming(server, "variables of edge-01", "the live row is version 2")


def test_labels_changed_inserted_or_deleted_behind_the_server_are_named(
    isolated_server: Server,
) -> None:
    server = isolated_server
    tenant, tenant_id = populated(server)
    server.plane.create_device(tenant_id, "edge-02", "alice", labels={"site": "fra"})
    assert [str(p) for p in server.plane.verify_audit()] == []
    with server.plane.db.engine.begin() as conn:
        conn.execute(
            text("UPDATE device_labels SET value = 'lab' WHERE key = 'role' AND tenant_id = :t"),
            {"t": tenant_id},
        )
    failed_naming(
        server,
        f"device labels {tenant.name}/edge-01: labels differs from the audited one",
        "'role': 'lab'",
    )
    with server.plane.db.engine.begin() as conn:
        conn.execute(text("DELETE FROM device_labels WHERE tenant_id = :t"), {"t": tenant_id})
    failed_naming(server, f"device labels {tenant.name}/edge-02: labels differs", "{}")
    device_id = server.plane.device_id(tenant_id, "edge-01")
    # Labels set again through the service are audited afresh: the log vouches for them.
    server.plane.set_labels(tenant_id, "edge-01", {"site": "ams"}, actor="alice")
    server.plane.set_labels(tenant_id, "edge-02", {"site": "fra"}, actor="alice")
    assert [str(p) for p in server.plane.verify_audit()] == []
    with server.plane.db.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO device_labels (tenant_id, device_id, key, value) "
                "VALUES (:t, :d, 'tier', 'gold')"
            ),
            {"t": tenant_id, "d": device_id},
        )
    failed_naming(server, f"device labels {tenant.name}/edge-01: labels differs", "'tier': 'gold'")
    with server.plane.db.engine.begin() as conn:
        conn.execute(text("DELETE FROM device_labels WHERE key = 'tier'"))
    assert [str(p) for p in server.plane.verify_audit()] == []
    bare = server.plane.create_device(tenant_id, "edge-03", "alice")
    with server.plane.db.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO device_labels (tenant_id, device_id, key, value) "
                "VALUES (:t, :d, 'site', 'ams')"
            ),
            {"t": tenant_id, "d": bare},
        )
    failed_naming(
        server, f"device labels {tenant.name}/edge-03: have no audit entry (inserted directly)"
    )


def test_a_plan_is_never_rendered_from_a_profile_or_variables_the_log_does_not_vouch_for(
    isolated_server: Server,
) -> None:
    server = isolated_server
    tenant, _tenant_id = populated(server)
    viewer = tenant.auth("viewer")
    assert server.client.post("/api/v1/plan", json={}, headers=viewer).status_code == 200
    with server.plane.db.engine.begin() as conn:
        conn.execute(text("""UPDATE device_inputs SET variables = '{"mtu": 1280}'"""))
    refused = server.client.post("/api/v1/plan", json={}, headers=viewer)
    assert refused.status_code == 409, refused.text
    assert "differ from the audited ones" in refused.json()["detail"]
    with server.plane.db.engine.begin() as conn:
        conn.execute(text("""UPDATE device_inputs SET variables = '{"mtu": 1400}'"""))
        conn.execute(text("UPDATE profiles SET document = replace(document, '1500', '1499')"))
    refused = server.client.post("/api/v1/plan", json={}, headers=viewer)
    assert refused.status_code == 409, refused.text
    assert (
        "profile mtu version 4: its document differs from the audited one"
        in (refused.json()["detail"])
    )
    admin = tenant.auth("admin")
    published = server.client.post("/api/v1/plan/publish", json={}, headers=admin)
    assert published.status_code == 409  # nothing is published either
    with server.plane.db.engine.begin() as conn:
        conn.execute(text("UPDATE profiles SET document = replace(document, '1499', '1500')"))
    assert server.client.post("/api/v1/plan", json={}, headers=viewer).status_code == 200
    with server.plane.db.engine.begin() as conn:
        conn.execute(text("DELETE FROM profiles WHERE version = 4"))
    refused = server.client.post("/api/v1/plan", json={}, headers=viewer)
    assert refused.status_code == 409
    assert "profile mtu version 4 is audited but missing" in refused.json()["detail"]
