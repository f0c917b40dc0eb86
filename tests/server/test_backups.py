"""Device backups on the control plane: upload, list, download, delete, retention, audit.

Every test runs on SQLite and PostgreSQL. Archives are opaque bytes here; what
matters is that they come back byte for byte, that nothing half-stored or
unaudited remains, and that another tenant sees nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import delete, select
from typer.testing import CliRunner

from tests.server.conftest import BACKENDS, Server, ServerProcess, Tenant
from trueup.agent.cpclient import ControlPlaneClient, ControlPlaneRefused, ControlPlaneUnavailable
from trueup.cli.main import app as cli_app
from trueup.server.db import Database
from trueup.server.keys import load_or_create_server_key
from trueup.server.limits import BACKUP_CHUNK_BYTES
from trueup.server.service import ControlPlane
from trueup.server.tables import backup_chunks, backups
from trueup.server.tokens import Role

UPLOAD = "/api/v1/agent/backups"
META = {
    "format_version": 1,
    "created_at": 1_700_000_000.5,
    "agent_version": "0.9.0",
    "applied_revision": 4,
    "with_leases": True,
}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def upload(
    server: Server,
    tenant: Tenant,
    device: str,
    data: bytes,
    *,
    digest: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> httpx.Response:
    headers = {
        **tenant.device_auth(device),
        "Content-Type": "application/octet-stream",
        "X-Trueup-Backup-Sha256": digest or sha(data),
    }
    if metadata is not None:
        headers["X-Trueup-Backup-Metadata"] = json.dumps(metadata)
    return server.client.post(UPLOAD, content=data, headers=headers)


def listed(server: Server, tenant: Tenant, device: str) -> list[dict[str, Any]]:
    response = server.client.get(f"/api/v1/devices/{device}/backups", headers=tenant.auth("viewer"))
    assert response.status_code == 200, response.text
    return list(response.json()["backups"])


def actions(server: Server, tenant: Tenant) -> list[str]:
    entries = server.plane.audit_entries(server.plane.tenant_id(tenant.name), 1000)
    return [e["action"] for e in entries if e["action"].startswith("backup.")]


def test_upload_list_download_round_trip_is_byte_identical(server: Server) -> None:
    tenant = server.tenant("bk", devices=("edge-01",))
    # More than two chunks, and not a multiple of the chunk size.
    data = os.urandom(2 * BACKUP_CHUNK_BYTES + 12_345)
    stored = upload(server, tenant, "edge-01", data, metadata=META)
    assert stored.status_code == 201, stored.text
    body = stored.json()
    assert body["size"] == len(data) and body["sha256"] == sha(data)
    assert body["device"] == "edge-01" and body["pruned"] == []
    assert body["metadata"] == META and body["created_at"] == META["created_at"]

    [row] = listed(server, tenant, "edge-01")
    assert row["id"] == body["id"] and row["metadata"] == META and row["size"] == len(data)

    download = server.client.get(
        f"/api/v1/devices/edge-01/backups/{body['id']}", headers=tenant.auth("operator")
    )
    assert download.status_code == 200
    assert download.content == data
    assert download.headers["X-Trueup-Backup-Sha256"] == sha(data)
    assert download.headers["Content-Length"] == str(len(data))
    assert download.headers["Content-Type"] == "application/octet-stream"
    assert actions(server, tenant) == ["backup.upload"]

    empty = upload(server, tenant, "edge-01", b"")
    assert empty.status_code == 201, empty.text
    got = server.client.get(
        f"/api/v1/devices/edge-01/backups/{empty.json()['id']}", headers=tenant.auth("operator")
    )
    assert got.status_code == 200 and got.content == b""
    assert [b["id"] for b in listed(server, tenant, "edge-01")] == [empty.json()["id"], body["id"]]


def test_a_hash_mismatch_is_422_and_nothing_is_stored(server: Server) -> None:
    tenant = server.tenant("bk", devices=("edge-01",))
    data = os.urandom(50_000)
    wrong = upload(server, tenant, "edge-01", data, digest=sha(b"something else"))
    assert wrong.status_code == 422
    assert "X-Trueup-Backup-Sha256" in wrong.json()["problems"][0]
    bad_header = upload(server, tenant, "edge-01", data, digest="not-a-digest")
    assert bad_header.status_code == 422
    bad_meta = upload(server, tenant, "edge-01", data, metadata={"format_version": 0, "x": 1})
    assert bad_meta.status_code == 422
    assert any("X-Trueup-Backup-Metadata" in p for p in bad_meta.json()["problems"])
    assert listed(server, tenant, "edge-01") == []
    assert actions(server, tenant) == []


def test_the_service_checks_the_hash_again_and_rolls_back(server: Server, tmp_path: Path) -> None:
    tenant = server.tenant("bk", devices=("edge-01",))
    tenant_id = server.plane.tenant_id(tenant.name)
    device_id = server.plane.device_id(tenant_id, "edge-01")
    archive = tmp_path / "a"
    archive.write_bytes(os.urandom(BACKUP_CHUNK_BYTES + 1))
    with archive.open("rb") as f, pytest.raises(Exception, match="nothing was stored"):
        server.plane.store_backup(
            tenant_id, device_id, f, sha256=sha(b"other"), metadata={}, actor="test"
        )
    assert server.plane.backups(tenant_id, "edge-01") == []
    assert actions(server, tenant) == []


@pytest.mark.parametrize(
    "isolated_server", [(b, {"backup_keep": 3}) for b in BACKENDS], indirect=True
)
def test_retention_keeps_the_newest_n_per_device(isolated_server: Server) -> None:
    server = isolated_server
    tenant = server.tenant("bk", devices=("edge-01", "edge-02"))
    ids = []
    for i in range(5):
        response = upload(server, tenant, "edge-01", f"archive {i}".encode())
        assert response.status_code == 201, response.text
        ids.append(response.json()["id"])
    other = upload(server, tenant, "edge-02", b"other device")
    assert other.status_code == 201
    assert response.json()["pruned"] == [ids[1]]
    assert [b["id"] for b in listed(server, tenant, "edge-01")] == ids[:1:-1]
    assert [b["id"] for b in listed(server, tenant, "edge-02")] == [other.json()["id"]]
    gone = server.client.get(
        f"/api/v1/devices/edge-01/backups/{ids[0]}", headers=tenant.auth("operator")
    )
    assert gone.status_code == 404
    entries = server.plane.audit_entries(server.plane.tenant_id(tenant.name), 1000)
    deletes = [e for e in entries if e["action"] == "backup.delete"]
    assert sorted(e["detail"]["backup_id"] for e in deletes) == ids[:2]
    assert {e["detail"]["reason"] for e in deletes} == {"retention"}
    with server.plane.db.read() as conn:
        left = {r.backup_id for r in conn.execute(select(backup_chunks.c.backup_id))}
    assert left == {*ids[2:], other.json()["id"]}
    assert server.plane.verify_audit() == []


def test_another_tenants_device_or_backup_is_404(server: Server) -> None:
    owner = server.tenant("bk", devices=("edge-01",))
    stranger = server.tenant("bk", devices=("edge-01",))  # the same device name, elsewhere
    backup_id = upload(server, owner, "edge-01", b"owner's archive").json()["id"]
    mine = upload(server, stranger, "edge-01", b"stranger's archive").json()["id"]
    base = "/api/v1/devices/edge-01/backups"
    assert [b["id"] for b in listed(server, stranger, "edge-01")] == [mine]
    for method, path, role in (
        ("GET", f"{base}/{backup_id}", "operator"),
        ("DELETE", f"{base}/{backup_id}", "admin"),
        ("GET", f"/api/v1/devices/only-theirs/backups/{backup_id}", "admin"),
    ):
        response = server.client.request(method, path, headers=stranger.auth(role))
        assert response.status_code == 404, (method, path, response.text)
    server.plane.create_device(server.plane.tenant_id(owner.name), "only-theirs", "test")
    for role in ("viewer", "admin"):
        response = server.client.get(
            "/api/v1/devices/only-theirs/backups", headers=stranger.auth(role)
        )
        assert response.status_code == 404
    assert [b["id"] for b in listed(server, owner, "edge-01")] == [backup_id]


def test_roles(server: Server) -> None:
    tenant = server.tenant("bk", devices=("edge-01",))
    backup_id = upload(server, tenant, "edge-01", b"archive").json()["id"]
    base = "/api/v1/devices/edge-01/backups"
    client = server.client
    assert client.get(base).status_code == 401
    assert client.get(base, headers={"Authorization": "Bearer nope"}).status_code == 401
    assert client.get(base, headers=tenant.device_auth("edge-01")).status_code == 403
    assert client.get(f"{base}/{backup_id}", headers=tenant.auth("viewer")).status_code == 403
    assert client.delete(f"{base}/{backup_id}", headers=tenant.auth("operator")).status_code == 403
    data = b"from a human"
    headers = {"X-Trueup-Backup-Sha256": sha(data)}
    assert client.post(UPLOAD, content=data, headers=headers).status_code == 401
    human = client.post(UPLOAD, content=data, headers={**headers, **tenant.auth("admin")})
    assert human.status_code == 403
    deleted = client.delete(f"{base}/{backup_id}", headers=tenant.auth("admin"))
    assert deleted.status_code == 204
    assert listed(server, tenant, "edge-01") == []
    assert client.delete(f"{base}/{backup_id}", headers=tenant.auth("admin")).status_code == 404
    assert actions(server, tenant) == ["backup.delete", "backup.upload"]


@pytest.mark.parametrize(
    "isolated_server", [(b, {"backup_max_bytes": 4096}) for b in BACKENDS], indirect=True
)
def test_a_body_over_the_limit_is_413_without_being_read(isolated_server: Server) -> None:
    server = isolated_server
    tenant = server.tenant("bk", devices=("edge-01",))
    spec = server.client.get("/openapi.json", headers=tenant.auth("viewer")).json()
    assert spec["paths"][UPLOAD]["post"]["x-trueup-max-body"] == 4096
    read: list[int] = []

    def body(size: int) -> Iterator[bytes]:
        for _ in range(size // 1024):
            read.append(1024)
            yield b"x" * 1024

    data = b"x" * 8192
    headers = {
        **tenant.device_auth("edge-01"),
        "X-Trueup-Backup-Sha256": sha(data),
        "Content-Length": str(len(data)),
    }
    refused = server.client.post(UPLOAD, content=body(8192), headers=headers)
    assert refused.status_code == 413
    assert read == []  # not a byte of the body was asked for
    # Without Content-Length (chunked), the body is cut off once it passes the limit.
    del headers["Content-Length"]
    chunked = server.client.post(UPLOAD, content=body(8192), headers=headers)
    assert chunked.status_code == 413
    assert listed(server, tenant, "edge-01") == []
    fits = upload(server, tenant, "edge-01", b"y" * 4096)
    assert fits.status_code == 201, fits.text


@pytest.mark.parametrize("isolated_server", BACKENDS, indirect=True)
def test_audit_verify_covers_backups(isolated_server: Server) -> None:
    server = isolated_server
    tenant = server.tenant("bk", devices=("edge-01",))
    first = upload(server, tenant, "edge-01", os.urandom(BACKUP_CHUNK_BYTES + 7)).json()["id"]
    second = upload(server, tenant, "edge-01", b"second").json()["id"]
    third = upload(server, tenant, "edge-01", b"third").json()["id"]
    deleted = server.client.delete(
        f"/api/v1/devices/edge-01/backups/{first}", headers=tenant.auth("admin")
    )
    assert deleted.status_code == 204
    assert server.plane.verify_audit() == []

    with server.plane.db.write() as conn:  # behind the server's back
        conn.execute(delete(backup_chunks).where(backup_chunks.c.backup_id == second))
        conn.execute(delete(backups).where(backups.c.id == second))
        conn.execute(
            backup_chunks.update().where(backup_chunks.c.backup_id == third).values(data=b"3")
        )
    problems = [str(p) for p in server.plane.verify_audit()]
    assert any(f"backups id={second}" in p and "missing" in p for p in problems), problems
    assert any(f"backups id={third}" in p and "chunks hold 1 bytes" in p for p in problems)
    assert not any(f"id={first}" in p for p in problems)


def test_the_agent_uploads_through_its_client_and_the_cli(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/server.db"
    key_file = tmp_path / "server.key"
    database = Database(url)
    database.migrate()
    plane = ControlPlane(database, load_or_create_server_key(key_file), auth_cache_seconds=0)
    tenant_id = plane.create_tenant("acme", "test")
    plane.create_user(tenant_id, "ops", Role.OPERATOR, "test")
    token = plane.create_token(tenant_id, "ops", "test")[1]
    server = ServerProcess(url, key_file).start()
    try:
        bundle = plane.enroll(tenant_id, "edge-01", "test", url=server.url)
        bundle_path = tmp_path / "bundle.json"
        bundle_path.write_text(json.dumps(bundle))
        token_file = tmp_path / "device.token"
        client = ControlPlaneClient(None, token_file)
        client.exchange_enrollment(bundle_path)
        archive = tmp_path / "edge-01.trueup-backup"
        archive.write_bytes(os.urandom(3 * BACKUP_CHUNK_BYTES + 1))
        stored = client.upload_backup(archive, {"format_version": 1, "with_leases": False})
        assert stored["sha256"] == sha(archive.read_bytes())
        assert stored["metadata"] == {"format_version": 1, "with_leases": False}
        with pytest.raises(ControlPlaneRefused) as refused:
            client.upload_backup(archive, {"format_version": "one"})
        assert refused.value.status_code == 422
        client.close()

        result = CliRunner().invoke(
            cli_app,
            [
                "backup",
                "upload",
                str(archive),
                "--control-plane",
                server.url,
                "--token-file",
                str(token_file),
                "--metadata",
                '{"agent_version": "1.2.3"}',
                "-o",
                "json",
            ],
        )
        assert result.exit_code == 0, result.output
        assert json.loads(result.output)["metadata"] == {"agent_version": "1.2.3"}

        with httpx.Client(base_url=server.url) as http:
            auth = {"Authorization": f"Bearer {token}"}
            rows = http.get("/api/v1/devices/edge-01/backups", headers=auth).json()["backups"]
            assert len(rows) == 2
            with http.stream(
                "GET", f"/api/v1/devices/edge-01/backups/{rows[0]['id']}", headers=auth
            ) as r:
                digest = hashlib.sha256()
                for chunk in r.iter_bytes():
                    digest.update(chunk)
            assert digest.hexdigest() == r.headers["X-Trueup-Backup-Sha256"] == stored["sha256"]
    finally:
        server.stop()
        database.dispose()


def test_the_client_retries_an_unavailable_control_plane(tmp_path: Path) -> None:
    archive = tmp_path / "a"
    archive.write_bytes(b"archive bytes")
    token_file = tmp_path / "token"
    token_file.write_text("tu_d_x\n")
    seen: list[bytes] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.read())
        assert request.headers["X-Trueup-Backup-Sha256"] == sha(b"archive bytes")
        assert request.headers["Content-Length"] == str(len(b"archive bytes"))
        if len(seen) < 3:
            return httpx.Response(503, json={"detail": "database unavailable; retry"})
        return httpx.Response(201, json={"id": 1})

    client = ControlPlaneClient("http://cp.invalid", token_file)
    client._local.client = httpx.Client(transport=httpx.MockTransport(handler))
    delays: list[float] = []
    assert client.upload_backup(archive, sleep=delays.append) == {"id": 1}
    assert seen == [b"archive bytes"] * 3 and len(delays) == 2

    seen.clear()
    with pytest.raises(ControlPlaneUnavailable):
        client.upload_backup(archive, attempts=2, sleep=delays.append)
    assert len(seen) == 2
