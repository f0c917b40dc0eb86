"""Device evidence bundles on the control plane: upload, request, list, download, audit.

Every test runs on SQLite and PostgreSQL (the conftest's backends).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from tests.routers import base_document
from tests.server.conftest import BACKENDS, Server, ServerProcess, Tenant
from trueup.agent.cpclient import ControlPlaneClient
from trueup.cli.main import app as cli_app
from trueup.journal.state import StateDir
from trueup.model.document import parse_document
from trueup.reconcile.changes import Change
from trueup.reconcile.engine import Engine
from trueup.server.db import Database
from trueup.server.keys import load_or_create_server_key
from trueup.server.limits import BACKUP_CHUNK_BYTES
from trueup.server.service import ControlPlane
from trueup.system.fake import FakeNetlink

UPLOAD = "/api/v1/agent/evidence"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def upload(server: Server, tenant: Tenant, device: str, data: bytes) -> httpx.Response:
    headers = {
        **tenant.device_auth(device),
        "Content-Type": "application/octet-stream",
        "X-Trueup-Evidence-Sha256": sha(data),
    }
    return server.client.post(UPLOAD, content=data, headers=headers)


def listed(server: Server, tenant: Tenant, device: str) -> dict[str, Any]:
    response = server.client.get(
        f"/api/v1/devices/{device}/evidence", headers=tenant.auth("viewer")
    )
    assert response.status_code == 200, response.text
    return dict(response.json())


def actions(server: Server, tenant: Tenant) -> list[str]:
    entries = server.plane.audit_entries(server.plane.tenant_id(tenant.name), 1000)
    return [e["action"] for e in entries if e["action"].startswith("evidence.")]


def test_request_upload_list_download(server: Server) -> None:
    tenant = server.tenant("ev", devices=("edge-01",))
    device = tenant.device_auth("edge-01")
    assert server.client.get("/api/v1/agent/evidence-request", headers=device).json() == {
        "pending": None
    }
    requested = server.client.post(
        "/api/v1/devices/edge-01/evidence-requests", headers=tenant.auth("operator")
    )
    assert requested.status_code == 201, requested.text
    pending = server.client.get("/api/v1/agent/evidence-request", headers=device).json()
    assert pending["pending"]["id"] == requested.json()["id"]
    assert [p["id"] for p in listed(server, tenant, "edge-01")["pending_requests"]] == [
        requested.json()["id"]
    ]

    data = os.urandom(BACKUP_CHUNK_BYTES + 321)
    stored = upload(server, tenant, "edge-01", data)
    assert stored.status_code == 201, stored.text
    assert stored.json()["answered_requests"] == [requested.json()["id"]]
    assert server.client.get("/api/v1/agent/evidence-request", headers=device).json() == {
        "pending": None
    }
    body = listed(server, tenant, "edge-01")
    assert body["pending_requests"] == []
    [row] = body["evidence"]
    assert row["size"] == len(data) and row["sha256"] == sha(data)
    got = server.client.get(
        f"/api/v1/devices/edge-01/evidence/{row['id']}", headers=tenant.auth("viewer")
    )
    assert got.status_code == 200 and got.content == data
    assert got.headers["X-Trueup-Evidence-Sha256"] == sha(data)
    assert sorted(actions(server, tenant)) == [
        "evidence.download",
        "evidence.request",
        "evidence.upload",
    ]
    assert server.plane.verify_audit() == []


def test_a_hash_mismatch_stores_nothing(server: Server) -> None:
    tenant = server.tenant("ev", devices=("edge-01",))
    headers = {**tenant.device_auth("edge-01"), "X-Trueup-Evidence-Sha256": "0" * 64}
    refused = server.client.post(UPLOAD, content=b"bundle", headers=headers)
    assert refused.status_code == 422
    assert listed(server, tenant, "edge-01")["evidence"] == []


def test_retention_keeps_the_newest_five(server: Server) -> None:
    tenant = server.tenant("ev", devices=("edge-01",))
    ids = [upload(server, tenant, "edge-01", f"bundle {i}".encode()).json()["id"] for i in range(7)]
    assert [e["id"] for e in listed(server, tenant, "edge-01")["evidence"]] == ids[::-1][:5]
    assert actions(server, tenant).count("evidence.delete") == 2


def test_tenant_isolation(server: Server) -> None:
    owner = server.tenant("ev", devices=("edge-01",))
    stranger = server.tenant("ev", devices=("edge-01",))
    theirs = upload(server, owner, "edge-01", b"owner's bundle").json()["id"]
    assert listed(server, stranger, "edge-01")["evidence"] == []
    got = server.client.get(
        f"/api/v1/devices/edge-01/evidence/{theirs}", headers=stranger.auth("admin")
    )
    assert got.status_code == 404
    server.plane.create_device(server.plane.tenant_id(owner.name), "only-theirs", "test")
    for method, path in (
        ("GET", "/api/v1/devices/only-theirs/evidence"),
        ("POST", "/api/v1/devices/only-theirs/evidence-requests"),
    ):
        response = server.client.request(method, path, headers=stranger.auth("admin"))
        assert response.status_code == 404, (method, path)


def test_roles(server: Server) -> None:
    tenant = server.tenant("ev", devices=("edge-01",))
    path = "/api/v1/devices/edge-01/evidence-requests"
    assert server.client.post(path, headers=tenant.auth("viewer")).status_code == 403
    assert server.client.post(path, headers=tenant.device_auth("edge-01")).status_code == 403
    human = server.client.post(
        UPLOAD,
        content=b"x",
        headers={**tenant.auth("admin"), "X-Trueup-Evidence-Sha256": sha(b"x")},
    )
    assert human.status_code == 403
    assert actions(server, tenant) == []


@pytest.mark.parametrize(
    "isolated_server", [(b, {"evidence_max_bytes": 4096}) for b in BACKENDS], indirect=True
)
def test_a_body_over_the_limit_is_413(isolated_server: Server) -> None:
    server = isolated_server
    tenant = server.tenant("ev", devices=("edge-01",))
    assert upload(server, tenant, "edge-01", b"x" * 8192).status_code == 413
    assert listed(server, tenant, "edge-01")["evidence"] == []
    assert upload(server, tenant, "edge-01", b"y" * 4096).status_code == 201


def test_the_dashboard_lists_requests_and_downloads_uploaded_bundles(server: Server) -> None:
    from tests.server.test_dashboard import browser, csrf_of

    tenant = server.tenant("ev", devices=("edge-01",))
    viewer = browser(server, tenant, "viewer")
    page = viewer.get("/ui/devices/edge-01")
    assert "Request fresh evidence" not in page.text and 'id="no-evidence"' in page.text
    assert "/ui/devices/edge-01/evidence" in page.text  # the control plane's bundle stays
    denied = viewer.post("/ui/devices/edge-01/evidence-requests", data={"csrf": csrf_of(page.text)})
    assert denied.status_code == 403

    operator = browser(server, tenant, "operator")
    page = operator.get("/ui/devices/edge-01")
    assert "Request fresh evidence" in page.text
    forged = operator.post("/ui/devices/edge-01/evidence-requests", data={"csrf": "forged"})
    assert forged.status_code == 403
    asked = operator.post(
        "/ui/devices/edge-01/evidence-requests",
        data={"csrf": csrf_of(page.text)},
        follow_redirects=False,
    )
    assert asked.status_code == 303
    assert 'id="evidence-pending"' in operator.get("/ui/devices/edge-01").text

    data = b"the router's bundle"
    evidence_id = upload(server, tenant, "edge-01", data).json()["id"]
    page = viewer.get("/ui/devices/edge-01")
    assert sha(data) in page.text and 'id="evidence-pending"' not in page.text
    got = viewer.get(f"/ui/devices/edge-01/evidence/{evidence_id}")
    assert got.status_code == 200 and got.content == data
    stranger = browser(server, server.tenant("ev", devices=("edge-01",)), "admin")
    assert stranger.get(f"/ui/devices/edge-01/evidence/{evidence_id}").status_code == 404


def test_trueup_evidence_upload_sends_the_bundle_to_the_agents_control_plane(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/server.db"
    key_file = tmp_path / "server.key"
    database = Database(url)
    database.migrate()
    plane = ControlPlane(database, load_or_create_server_key(key_file), auth_cache_seconds=0)
    tenant_id = plane.create_tenant("acme", "test")
    server = ServerProcess(url, key_file).start()
    try:
        bundle = plane.enroll(tenant_id, "edge-01", "test", url=server.url)
        bundle_path = tmp_path / "bundle.json"
        bundle_path.write_text(json.dumps(bundle))
        token_file = tmp_path / "device.token"
        client = ControlPlaneClient(None, token_file)
        client.exchange_enrollment(bundle_path)
        client.close()
        state = StateDir(tmp_path / "state")
        state.ensure()
        kernel = FakeNetlink({"mgmt0": 1500, "lan0": 1500})
        engine = Engine(state, netlink_factory=lambda: kernel)
        assert engine.transact(Change(parse_document(base_document()), actor="test")).ok
        out = tmp_path / "evidence.tar.gz"
        args = ["evidence", "--out", str(out), "--state-dir", str(state.root), "--upload"]
        not_enrolled = CliRunner().invoke(cli_app, [*args, "--token-file", str(token_file)])
        assert not_enrolled.exit_code == 1 and "not enrolled" in not_enrolled.output
        (state.root / "control-plane.json").write_text(json.dumps({"url": server.url}))
        result = CliRunner().invoke(cli_app, [*args, "--token-file", str(token_file)])
        assert result.exit_code == 0, result.output
        assert "uploaded evidence" in result.output
        [row] = plane.evidence_list(tenant_id, "edge-01")["evidence"]
        assert row["sha256"] == sha(out.read_bytes()) and row["size"] == out.stat().st_size
    finally:
        server.stop()
        database.dispose()
