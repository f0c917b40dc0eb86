"""The control-plane API on SQLite and on PostgreSQL (the `server` fixture runs both)."""

from __future__ import annotations

import json
import threading
import time

import pytest
from sqlalchemy import select

from tests.server.conftest import Server, document
from trueup.agent.cpclient import report_from_status
from trueup.model.document import document_digest, parse_document
from trueup.server.service import Invalid
from trueup.server.tables import device_reports, tokens


def put(server: Server, tenant, device: str, version: int, body, role: str = "operator", **headers):
    return server.client.put(
        f"/api/v1/devices/{device}/desired",
        json=body,
        headers={**tenant.auth(role), "If-Match": str(version), **headers},
    )


def report(server: Server, tenant, device: str, **payload):
    response = server.client.post(
        "/api/v1/agent/report", json=payload, headers=tenant.device_auth(device)
    )
    assert response.status_code == 200, response.text
    return response


def fleet(server: Server, tenant, query: str = ""):
    response = server.client.get(f"/api/v1/devices{query}", headers=tenant.auth("viewer"))
    assert response.status_code == 200, response.text
    return {d["device"]: d for d in response.json()["devices"]}


def test_revisions_are_numbered_with_author_comment_hash_and_parent(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01",))
    first = put(server, tenant, "edge-01", 0, document("edge-01"), **{"X-Trueup-Comment": "first"})
    assert first.status_code == 201, first.text
    assert first.headers["ETag"] == '"1"'
    body = first.json()
    assert body["version"] == 1 and body["parent_version"] is None
    assert body["author"] == f"user:{tenant.name}/operator-user"
    assert body["comment"] == "first"
    assert body["content_hash"].startswith("sha256:")
    second = put(server, tenant, "edge-01", 1, document("edge-01", address="198.51.100.3/24"))
    assert second.status_code == 201
    assert second.json()["version"] == 2 and second.json()["parent_version"] == 1
    assert second.json()["content_hash"] != body["content_hash"]
    listed = server.client.get(
        "/api/v1/devices/edge-01/revisions", headers=tenant.auth("viewer")
    ).json()["revisions"]
    assert [r["version"] for r in listed] == [1, 2]
    old = server.client.get(
        "/api/v1/devices/edge-01/revisions/1", headers=tenant.auth("viewer")
    ).json()
    assert old["document"]["spec"]["management"]["addresses"] == ["198.51.100.2/24"]
    assert old["document"]["metadata"]["version"] == 1
    desired = server.client.get("/api/v1/devices/edge-01/desired", headers=tenant.auth("viewer"))
    assert desired.headers["ETag"] == '"2"' and desired.json()["version"] == 2


def test_stale_if_match_is_refused_with_concurrent_modification(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01",))
    assert put(server, tenant, "edge-01", 0, document("edge-01")).status_code == 201
    stale = put(server, tenant, "edge-01", 0, document("edge-01", address="198.51.100.9/24"))
    assert stale.status_code == 409
    assert stale.json()["reason"] == "STATE_CONCURRENT_MODIFICATION"
    assert stale.json()["current_version"] == 1
    ahead = put(server, tenant, "edge-01", 5, document("edge-01"))
    assert ahead.status_code == 409 and ahead.json()["current_version"] == 1
    versions = server.client.get(
        "/api/v1/devices/edge-01/revisions", headers=tenant.auth("viewer")
    ).json()["revisions"]
    assert [r["version"] for r in versions] == [1]


def test_missing_or_bad_if_match(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01",))
    missing = server.client.put(
        "/api/v1/devices/edge-01/desired", json=document("edge-01"), headers=tenant.auth("admin")
    )
    assert missing.status_code == 428 and "If-Match" in missing.text
    bad = put(server, tenant, "edge-01", "abc", document("edge-01"))  # type: ignore[arg-type]
    assert bad.status_code == 422 and "header.If-Match" in bad.text
    quoted = server.client.put(
        "/api/v1/devices/edge-01/desired",
        json=document("edge-01"),
        headers={**tenant.auth("operator"), "If-Match": '"0"'},
    )
    assert quoted.status_code == 201


def test_invalid_document_names_paths_and_changes_nothing(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01",))
    body = document(
        "edge-01", interfaces=[{"name": "lan0", "addresses": ["203.0.113.1/24", "nonsense"]}]
    )
    body["spec"]["bogus"] = 1
    response = put(server, tenant, "edge-01", 0, body)
    assert response.status_code == 422
    problems = response.json()["problems"]
    assert any(p.startswith("spec.interfaces[0].addresses[1]:") for p in problems), problems
    assert any(p.startswith("spec.bogus:") for p in problems), problems
    wrong_device = put(server, tenant, "edge-01", 0, document("edge-99"))
    assert wrong_device.status_code == 422
    assert wrong_device.json()["problems"][0].startswith("metadata.device:")
    not_json = server.client.put(
        "/api/v1/devices/edge-01/desired",
        content=b"{not json",
        headers={**tenant.auth("operator"), "If-Match": "0", "content-type": "application/json"},
    )
    assert not_json.status_code == 422
    desired = server.client.get("/api/v1/devices/edge-01/desired", headers=tenant.auth("viewer"))
    assert desired.json()["version"] == 0


def test_yaml_documents_are_accepted(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01",))
    text = (
        "apiVersion: trueup/v1\nkind: DeviceState\nmetadata: {device: edge-01}\n"
        "spec:\n  management: {interface: mgmt0, addresses: [198.51.100.2/24]}\n"
    )
    response = server.client.put(
        "/api/v1/devices/edge-01/desired",
        content=text.encode(),
        headers={**tenant.auth("operator"), "If-Match": "0", "content-type": "application/yaml"},
    )
    assert response.status_code == 201, response.text


def test_other_tenants_devices_are_not_found(server: Server) -> None:
    mine = server.tenant(devices=("edge-01",))
    theirs = server.tenant(devices=("edge-02",))
    assert put(server, mine, "edge-01", 0, document("edge-01")).status_code == 201
    for method, path in [
        ("GET", "/api/v1/devices/edge-01"),
        ("GET", "/api/v1/devices/edge-01/desired"),
        ("GET", "/api/v1/devices/edge-01/revisions"),
        ("GET", "/api/v1/devices/edge-01/reports"),
    ]:
        response = server.client.request(method, path, headers=theirs.auth("admin"))
        assert response.status_code == 404, (path, response.status_code)
    cross = put(server, theirs, "edge-01", 1, document("edge-01"), role="admin")
    assert cross.status_code == 404
    assert "edge-01" not in fleet(server, theirs)
    assert set(fleet(server, mine)) == {"edge-01"}


def test_long_poll_answers_at_once_when_newer_and_waits_otherwise(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01",))
    device = tenant.device_auth("edge-01")
    empty = server.client.get("/api/v1/agent/desired?after=0&wait=0", headers=device)
    assert empty.status_code == 204
    assert put(server, tenant, "edge-01", 0, document("edge-01")).status_code == 201
    # Waiting the whole 300 s would outlast the test's timeout: answering at once is the pass.
    now = server.client.get("/api/v1/agent/desired?after=0&wait=300", headers=device)
    assert now.status_code == 200
    assert now.json()["version"] == 1
    assert now.json()["document"]["metadata"] == {"device": "edge-01", "version": 1}
    started = time.monotonic()
    timed_out = server.client.get("/api/v1/agent/desired?after=1&wait=0.5", headers=device)
    assert timed_out.status_code == 204 and time.monotonic() - started >= 0.5

    results: dict[str, object] = {}

    def poll() -> None:
        t0 = time.monotonic()
        response = server.client.get("/api/v1/agent/desired?after=1&wait=300", headers=device)
        results["status"] = response.status_code
        results["version"] = response.json()["version"] if response.status_code == 200 else None
        results["elapsed"] = time.monotonic() - t0

    waiter = threading.Thread(target=poll)
    waiter.start()
    time.sleep(0.5)
    assert (
        put(
            server, tenant, "edge-01", 1, document("edge-01", address="198.51.100.5/24")
        ).status_code
        == 201
    )
    waiter.join(300)
    # Woken by the new revision (not the end of the wait, which would answer 204), after
    # the half second the waiter was left alone.
    assert results["status"] == 200 and results["version"] == 2
    assert results["elapsed"] > 0.4  # type: ignore[operator]


def test_fleet_state_in_sync_skew_drift_failed_and_filters(server: Server) -> None:
    tenant = server.tenant(devices=("a", "b", "c", "d"))
    for device in ("a", "b", "c", "d"):
        assert put(server, tenant, device, 0, document(device)).status_code == 201
    report(
        server, tenant, "a", applied_version=1, observed_digest="sha256:x", heartbeat_interval=30
    )
    report(server, tenant, "b", applied_version=0, heartbeat_interval=30, reason_codes=[])
    report(
        server,
        tenant,
        "c",
        applied_version=1,
        reason_codes=["STATE_DRIFT_DETECTED"],
        diff_summary={"paths": ["spec.interfaces[0].mtu"]},
        subsystems={"links": {"health": "degraded", "reason": "1 path(s) differ"}},
    )
    report(server, tenant, "d", applied_version=1, reason_codes=["STATE_RECONCILIATION_FAILED"])
    view = fleet(server, tenant)
    assert view["a"]["status"] == "in_sync" and view["a"]["in_sync_since"] is not None
    assert view["a"]["applied_version"] == view["a"]["desired_version"] == 1
    assert view["b"]["status"] == "version_skew"
    assert "STATE_VERSION_SKEW" in view["b"]["reason_codes"]
    assert view["c"]["status"] == "drift" and view["c"]["reason_codes"] == ["STATE_DRIFT_DETECTED"]
    assert view["d"]["status"] == "reconciliation_failed"
    assert set(fleet(server, tenant, "?status=drift")) == {"c"}
    assert set(fleet(server, tenant, "?reason=STATE_VERSION_SKEW")) == {"b"}
    assert set(fleet(server, tenant, "?status=in_sync")) == {"a"}
    report(server, tenant, "b", applied_version=1, reason_codes=["STATE_DRIFT_DETECTED"])
    assert set(fleet(server, tenant, "?status=drift")) == {"b", "c"}
    assert fleet(server, tenant, "?status=drift&reason=STATE_VERSION_SKEW") == {}
    # A new desired revision puts an in-sync device into version skew at once.
    assert put(server, tenant, "a", 1, document("a", address="198.51.100.7/24")).status_code == 201
    after = fleet(server, tenant)["a"]
    assert after["status"] == "version_skew" and after["in_sync_since"] is None
    detail = server.client.get("/api/v1/devices/c", headers=tenant.auth("viewer")).json()
    assert detail["last_report"]["subsystems"]["links"]["health"] == "degraded"


def test_stale_heartbeat_and_in_sync_since(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01",))
    assert put(server, tenant, "edge-01", 0, document("edge-01")).status_code == 201
    view = fleet(server, tenant)["edge-01"]
    assert view["status"] == "heartbeat_stale" and view["last_report_at"] is None
    report(server, tenant, "edge-01", applied_version=1, heartbeat_interval=0.2)
    first = fleet(server, tenant)["edge-01"]
    assert first["status"] == "in_sync"
    since = first["in_sync_since"]
    report(server, tenant, "edge-01", applied_version=1, heartbeat_interval=0.2)
    assert fleet(server, tenant)["edge-01"]["in_sync_since"] == since
    time.sleep(0.8)  # more than 3 intervals of 0.2 s
    stale = fleet(server, tenant)["edge-01"]
    assert stale["status"] == "heartbeat_stale" and stale["missed_heartbeats"] >= 3
    assert stale["in_sync_since"] is None
    report(server, tenant, "edge-01", applied_version=1, heartbeat_interval=0.2)
    again = fleet(server, tenant)["edge-01"]
    assert again["status"] == "in_sync" and again["in_sync_since"] > since


def test_reports_are_kept_as_evidence_and_validated(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01",))
    for version in (0, 1, 2):
        report(server, tenant, "edge-01", applied_version=version, journal={"open": None})
    history = server.client.get(
        "/api/v1/devices/edge-01/reports", headers=tenant.auth("viewer")
    ).json()["reports"]
    assert [r["applied_version"] for r in history] == [2, 1, 0]
    bad = server.client.post(
        "/api/v1/agent/report",
        json={"applied_version": -1, "reason_codes": ["NOT_A_CODE"], "subsystems": {"x": {}}},
        headers=tenant.device_auth("edge-01"),
    )
    assert bad.status_code == 422
    problems = bad.json()["problems"]
    assert any(p.startswith("body.applied_version") for p in problems), problems
    assert any(p.startswith("body.reason_codes.0") for p in problems), problems
    assert any(p.startswith("body.subsystems.x.health") for p in problems), problems
    with server.plane.db.read() as conn:
        device_id = server.plane.device_id(server.plane.tenant_id(tenant.name), "edge-01")
        count = len(
            conn.execute(
                select(device_reports.c.id).where(device_reports.c.device_id == device_id)
            ).all()
        )
    assert count == 3


def test_enrollment_is_one_time_and_reenrolling_revokes_the_old_credential(
    server: Server,
) -> None:
    tenant = server.tenant()
    tenant_id = server.plane.tenant_id(tenant.name)
    bundle = server.plane.enroll(
        tenant_id, "edge-01", "test", url="http://x", fingerprint="sha256:ab"
    )
    assert (
        bundle["control_plane"] == "http://x" and bundle["server_certificate_sha256"] == "sha256:ab"
    )
    auth = {"Authorization": f"Bearer {bundle['token']}"}
    exchanged = server.client.post("/api/v1/agent/enroll", headers=auth)
    assert exchanged.status_code == 200
    credential = exchanged.json()["credential"]
    assert exchanged.json()["device"] == "edge-01"
    assert server.client.post("/api/v1/agent/enroll", headers=auth).status_code == 401
    as_device = {"Authorization": f"Bearer {credential}"}
    assert server.client.get("/api/v1/agent/desired", headers=as_device).status_code == 204
    # The enrollment token is not a credential.
    assert server.client.get("/api/v1/agent/desired", headers=auth).status_code == 401
    # Re-enrolling through the API revokes the current credential at once.
    again = server.client.post("/api/v1/devices/edge-01/enrollment", headers=tenant.auth("admin"))
    assert again.status_code == 201 and again.json()["token"] != bundle["token"]
    assert server.client.get("/api/v1/agent/desired", headers=as_device).status_code == 401
    new = server.client.post(
        "/api/v1/agent/enroll", headers={"Authorization": f"Bearer {again.json()['token']}"}
    )
    assert new.status_code == 200
    new_auth = {"Authorization": f"Bearer {new.json()['credential']}"}
    assert server.client.get("/api/v1/agent/desired", headers=new_auth).status_code == 204


def test_tokens_are_stored_hashed_and_can_be_revoked(server: Server) -> None:
    tenant = server.tenant()
    created = server.client.post(
        "/api/v1/users/viewer-user/tokens", json={"label": "ci"}, headers=tenant.auth("admin")
    )
    assert created.status_code == 201
    token = created.json()["token"]
    assert len(token) > 40
    with server.plane.db.read() as conn:
        stored = [r.token_hash for r in conn.execute(select(tokens.c.token_hash))]
    assert token not in stored and all(len(h) == 64 for h in stored)
    auth = {"Authorization": f"Bearer {token}"}
    assert server.client.get("/api/v1/devices", headers=auth).status_code == 200
    revoked = server.client.post(
        f"/api/v1/tokens/{created.json()['id']}/revoke", headers=tenant.auth("admin")
    )
    assert revoked.status_code == 200
    assert server.client.get("/api/v1/devices", headers=auth).status_code == 401
    listed = server.client.get("/api/v1/tokens", headers=tenant.auth("admin")).json()["tokens"]
    assert all("token" not in t and "token_hash" not in t for t in listed)


def test_role_changes_take_effect_and_are_audited(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01",))
    assert put(server, tenant, "edge-01", 0, document("edge-01"), role="viewer").status_code == 403
    promoted = server.client.put(
        "/api/v1/users/viewer-user/role", json={"role": "operator"}, headers=tenant.auth("admin")
    )
    assert promoted.status_code == 200
    assert put(server, tenant, "edge-01", 0, document("edge-01"), role="viewer").status_code == 201
    bad_role = server.client.put(
        "/api/v1/users/viewer-user/role", json={"role": "root"}, headers=tenant.auth("admin")
    )
    assert bad_role.status_code == 422 and "body.role" in bad_role.text
    entries = server.client.get("/api/v1/audit", headers=tenant.auth("admin")).json()["entries"]
    actions = [e["action"] for e in entries]
    assert "user.role" in actions and "revision.create" in actions and "device.enroll" in actions
    role_entry = next(e for e in entries if e["action"] == "user.role")
    assert role_entry["detail"]["role"] == "operator"
    assert role_entry["actor"] == f"user:{tenant.name}/admin-user"


def test_acknowledgements_are_recorded(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01",))
    ack = server.client.post(
        "/api/v1/devices/edge-01/acks",
        json={"subsystem": "links", "for_seconds": 3600, "reason": "maintenance window"},
        headers=tenant.auth("operator"),
    )
    assert ack.status_code == 201
    assert fleet(server, tenant)["edge-01"]["acknowledgements"][0]["subsystem"] == "links"
    bad = server.client.post(
        "/api/v1/devices/edge-01/acks",
        json={"subsystem": "links", "for_seconds": -1, "reason": " "},
        headers=tenant.auth("operator"),
    )
    assert bad.status_code == 422
    assert bad.json()["problems"] == [
        "body.for_seconds: expected a number of seconds, more than 0 and at most 2592000 "
        "(30 days); got -1",
        "body.reason: expected a reason: text of 1-10000 characters, not blank, without "
        "control characters but tab and newline; got ' '",
    ]
    # The service holds the same rules for callers that do not pass the API's models.
    tenant_id = server.plane.tenant_id(tenant.name)
    with pytest.raises(Invalid) as refused:
        server.plane.acknowledge(tenant_id, "edge-01", "<script>", 0, "why\x00", "test")
    assert [p.split(":")[0] for p in refused.value.problems] == [
        "subsystem",
        "for_seconds",
        "reason",
    ]


def test_secrets_go_only_to_their_device(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01", "edge-02"))
    put_secret = server.client.put(
        "/api/v1/devices/edge-01/secrets/wg-key",
        json={"value": "s3cret-value"},
        headers=tenant.auth("admin"),
    )
    assert put_secret.status_code == 201
    assert "s3cret" not in put_secret.text
    names = server.client.get(
        "/api/v1/devices/edge-01/secrets", headers=tenant.auth("operator")
    ).json()["secrets"]
    assert [n["name"] for n in names] == ["wg-key"] and "value" not in names[0]
    mine = server.client.get("/api/v1/agent/secrets", headers=tenant.device_auth("edge-01"))
    assert mine.json() == {"secrets": {"wg-key": "s3cret-value"}, "refused": []}
    other = server.client.get("/api/v1/agent/secrets", headers=tenant.device_auth("edge-02"))
    assert other.json() == {"secrets": {}, "refused": []}


def test_device_and_user_creation_validate_names(server: Server) -> None:
    tenant = server.tenant()
    ok = server.client.post(
        "/api/v1/devices", json={"name": "edge-7"}, headers=tenant.auth("operator")
    )
    assert ok.status_code == 201
    dup = server.client.post(
        "/api/v1/devices", json={"name": "edge-7"}, headers=tenant.auth("operator")
    )
    assert dup.status_code == 422 and "already exists" in dup.text
    bad = server.client.post(
        "/api/v1/devices", json={"name": "bad name/.."}, headers=tenant.auth("operator")
    )
    assert bad.status_code == 422
    assert bad.json()["problems"] == [
        "body.name: expected a device name (letters, digits, '_', '.', '-', starting with a "
        "letter or digit; 1-253 characters); got 'bad name/..'"
    ]


def test_metrics_and_probes(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01",))
    report(server, tenant, "edge-01", applied_version=0)
    assert server.client.get("/healthz").status_code == 200
    assert server.client.get("/readyz").json() == {"status": "ready"}
    metrics = server.client.get("/metrics", headers=tenant.auth("admin"))
    assert metrics.status_code == 200
    assert "trueup_server_reports_ingested_total" in metrics.text
    assert 'route="/api/v1/agent/report"' in metrics.text


def test_no_route_deletes_audit_or_evidence(server: Server) -> None:
    tenant = server.tenant()
    spec = server.client.get("/openapi.json", headers=tenant.auth("viewer")).json()
    # A device backup is the one piece of evidence a route deletes (admin, audited;
    # test_backups.py). Notification rules and targets are configuration (audited); a
    # deleted target's delivery log is kept (test_notify.py). Deleting a profile stores a
    # version marked deleted: every version stays readable (test_profiles.py).
    deletable = {
        "/api/v1/devices/{device}/backups/{backup_id}",
        "/api/v1/notifications/rules/{name}",
        "/api/v1/notifications/targets/{name}",
        "/api/v1/profiles/{name}",
    }
    for path, operations in spec["paths"].items():
        assert "delete" not in operations or path in deletable, path
        if "audit" in path or "reports" in path or "revisions" in path:
            assert set(operations) == {"get"}, path


# -- revision identity: digests decide "in sync"; local overrides are shown ------------------

OTHER_DIGEST = "sha256:" + "e" * 64


def test_fleet_compares_document_digests_and_shows_local_overrides(server: Server) -> None:
    devices = ("same", "other", "local", "old-agent", "via-status")
    tenant = server.tenant(devices=devices)
    hashes = {}
    for device in devices:
        created = put(server, tenant, device, 0, document(device))
        assert created.status_code == 201, created.text
        hashes[device] = created.json()["content_hash"]
    # What the agent computes from the revision it receives is the revision's content_hash.
    served = server.client.get("/api/v1/devices/same/desired", headers=tenant.auth("viewer"))
    received = parse_document(served.json()["document"], source="test")
    assert received.metadata.version == 1
    assert document_digest(received) == hashes["same"]
    report(
        server,
        tenant,
        "same",
        applied_version=1,
        applied_digest=hashes["same"],
        applied_origin="control-plane",
    )
    # A local apply took number 1 on the router before the control plane's revision 1
    # arrived: same number, another document.
    report(
        server,
        tenant,
        "other",
        applied_version=1,
        applied_digest=OTHER_DIGEST,
        applied_origin="local-file",
    )
    override = {
        "version": 2,
        "actor": "root@edge (trueup apply)",
        "at": "2025-01-02T03:04:05Z",
        "reason": "emergency firewall change",
        "digest": OTHER_DIGEST,
    }
    report(
        server,
        tenant,
        "local",
        applied_version=2,
        applied_digest=OTHER_DIGEST,
        applied_origin="local-cli",
        override=override,
    )
    report(server, tenant, "old-agent", applied_version=1)  # no digest: numbers decide
    status = {
        "versions": {
            "applied": 1,
            "applied_digest": hashes["via-status"],
            "origin": "control-plane",
            "override": None,
        },
        "subsystems": {"links": {"health": "ok"}},
        "management": {"ready": True},
    }
    report(server, tenant, "via-status", **report_from_status(status))

    view = fleet(server, tenant)
    same = view["same"]
    assert same["status"] == "in_sync" and same["in_sync_since"] is not None
    assert same["desired_digest"] == same["applied_digest"] == hashes["same"]
    assert same["digest_match"] is True and same["applied_origin"] == "control-plane"
    assert same["override"] is None

    other = view["other"]
    assert other["applied_version"] == other["desired_version"] == 1
    assert other["status"] == "version_skew" and other["digest_match"] is False
    assert other["reason_codes"] == ["STATE_VERSION_SKEW"] and other["in_sync_since"] is None
    assert other["desired_digest"] == hashes["other"] and other["applied_digest"] == OTHER_DIGEST

    local = view["local"]
    assert local["status"] == "local_override" and local["conditions"] == ["local_override"]
    assert "STATE_VERSION_SKEW" not in local["reason_codes"]
    assert local["override"] == override and local["applied_origin"] == "local-cli"
    assert local["digest_match"] is False and local["in_sync_since"] is None

    old = view["old-agent"]
    assert old["status"] == "in_sync" and old["digest_match"] is None
    assert old["applied_digest"] is None and old["applied_origin"] is None

    assert view["via-status"]["status"] == "in_sync"
    assert view["via-status"]["digest_match"] is True

    assert set(fleet(server, tenant, "?status=local_override")) == {"local"}
    assert set(fleet(server, tenant, "?status=version_skew")) == {"other"}
    detail = server.client.get("/api/v1/devices/local", headers=tenant.auth("viewer")).json()
    assert detail["status"] == "local_override" and detail["override"] == override
    assert detail["last_report"]["override"]["reason"] == "emergency firewall change"

    # The history keeps the identity in columns too.
    device_id = server.plane.device_id(server.plane.tenant_id(tenant.name), "local")
    with server.plane.db.read() as conn:
        row = conn.execute(
            select(
                device_reports.c.applied_digest,
                device_reports.c.applied_origin,
                device_reports.c.override,
            ).where(device_reports.c.device_id == device_id)
        ).one()
    assert row.applied_digest == OTHER_DIGEST and row.applied_origin == "local-cli"
    assert json.loads(row.override) == override

    # A newer desired revision replaces the override; once applied the device is in sync.
    newer = put(server, tenant, "local", 1, document("local", address="198.51.100.9/24"))
    assert newer.status_code == 201
    report(
        server,
        tenant,
        "local",
        applied_version=2,
        applied_digest=newer.json()["content_hash"],
        applied_origin="control-plane",
        override=None,
    )
    replaced = fleet(server, tenant)["local"]
    assert replaced["status"] == "in_sync" and replaced["digest_match"] is True
    assert replaced["override"] is None and replaced["in_sync_since"] is not None
    # The router's document changes under the same number: skew again at once.
    report(server, tenant, "local", applied_version=2, applied_digest=OTHER_DIGEST)
    again = fleet(server, tenant)["local"]
    assert again["status"] == "version_skew" and again["in_sync_since"] is None


def test_bad_revision_identity_is_refused_with_422_naming_the_field(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01",))
    good_override = {"version": 2, "actor": "root", "at": "2025-01-02T03:04:05Z", "reason": "x"}
    cases = {
        "body.applied_digest": {"applied_digest": "sha256:xyz"},
        "body.applied_origin": {"applied_origin": "x" * 33},
        "body.override.digest": {"override": {**good_override, "digest": "md5:abc"}},
        "body.override.version": {"override": {**good_override, "version": -1}},
        "body.override.actor": {"override": {**good_override, "actor": "a" * 201}},
        "body.override.reason": {"override": {**good_override, "reason": "r" * 1001}},
        "body.override.at": {"override": {**good_override, "at": "t" * 65}},
        "body.override": {"override": "yes"},
        # Values the database could not store are refused up front, never a 500.
        "body.applied_version": {"applied_version": 2**31},
        "body.observed_digest": {"observed_digest": "sha256:\x00"},
    }
    for field, payload in cases.items():
        bad = server.client.post(
            "/api/v1/agent/report", json=payload, headers=tenant.device_auth("edge-01")
        )
        assert bad.status_code == 422, (field, bad.text)
        problems = bad.json()["problems"]
        assert any(p.startswith(field) for p in problems), (field, problems)
    nul_origin = server.client.post(
        "/api/v1/agent/report",
        json={"applied_origin": "local\x00"},
        headers=tenant.device_auth("edge-01"),
    )
    assert nul_origin.status_code == 422
    history = server.client.get(
        "/api/v1/devices/edge-01/reports", headers=tenant.auth("viewer")
    ).json()["reports"]
    assert history == []
    # The largest values allowed are stored.
    report(
        server,
        tenant,
        "edge-01",
        applied_version=2**31 - 1,
        applied_digest=OTHER_DIGEST,
        applied_origin="confirm-timeout",
        override={**good_override, "actor": "a" * 200, "reason": "r" * 1000, "at": "t" * 64},
    )
    stored = fleet(server, tenant)["edge-01"]
    assert stored["applied_version"] == 2**31 - 1 and stored["status"] == "local_override"


def test_subsystem_sections_are_validated_as_the_agent_validates_them(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01",))
    body = document("edge-01")
    body["spec"]["sysctl"] = {"net.ipv4.ip_forward": 1}
    accepted = put(server, tenant, "edge-01", 0, body)
    assert accepted.status_code == 201, accepted.text
    served = server.client.get("/api/v1/devices/edge-01/desired", headers=tenant.auth("viewer"))
    assert served.json()["document"]["spec"]["sysctl"] == {"net.ipv4.ip_forward": "1"}
    body["spec"]["sysctl"] = {"net/ipv4": 1}
    refused = put(server, tenant, "edge-01", 1, body)
    assert refused.status_code == 422
    assert any(p.startswith("spec.sysctl.net/ipv4:") for p in refused.json()["problems"])
