"""The agent's control-plane client against a real server process."""

from __future__ import annotations

import json
import stat
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.conftest import ServerProcess, document
from trueup.agent.cpclient import (
    ControlPlaneClient,
    ControlPlaneRefused,
    ControlPlaneUnavailable,
    RetryLater,
    report_from_status,
)
from trueup.agent.cpsync import SyncLoop
from trueup.server.app import AgentReport
from trueup.server.db import Database
from trueup.server.keys import load_or_create_server_key
from trueup.server.service import ControlPlane
from trueup.server.tokens import Role


def wait_until(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


@pytest.fixture
def control_plane(tmp_path: Path):
    url = f"sqlite:///{tmp_path}/server.db"
    key_file = tmp_path / "server.key"
    database = Database(url)
    database.migrate()
    plane = ControlPlane(database, load_or_create_server_key(key_file), auth_cache_seconds=0)
    tenant_id = plane.create_tenant("acme", "test")
    plane.create_user(tenant_id, "ops", Role.OPERATOR, "test")
    token = plane.create_token(tenant_id, "ops", "test")[1]
    server = ServerProcess(url, key_file, revision_poll_seconds=0.1).start()
    try:
        yield plane, tenant_id, token, server
    finally:
        server.stop()
        database.dispose()


def test_enroll_pull_apply_report_and_reconnect(control_plane, tmp_path: Path) -> None:
    plane, tenant_id, _token, server = control_plane
    bundle_path = tmp_path / "bundle.json"
    bundle_path.write_text(json.dumps(plane.enroll(tenant_id, "edge-01", "test", url=server.url)))
    token_file = tmp_path / "agent" / "credential"
    client = ControlPlaneClient(None, token_file)
    credential = client.exchange_enrollment(bundle_path)
    assert token_file.read_text().strip() == credential
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    with pytest.raises(ControlPlaneRefused, match="already used"):
        ControlPlaneClient(None, tmp_path / "other").exchange_enrollment(bundle_path)

    applied: dict[str, Any] = {"version": 0, "documents": []}
    lock = threading.Lock()

    def apply(doc: dict[str, Any], version: int) -> None:
        with lock:
            applied["documents"].append(doc)
            applied["version"] = version

    def snapshot() -> dict[str, Any]:
        with lock:
            return {"applied_version": applied["version"] or None, "reason_codes": []}

    loop = SyncLoop(
        ControlPlaneClient(server.url, token_file),
        apply,
        snapshot,
        heartbeat_interval=0.3,
        long_poll_seconds=2,
        backoff_initial=0.1,
        backoff_max=0.4,
    )
    loop.start()
    try:
        plane.put_desired(tenant_id, "edge-01", 0, document("edge-01"), author="ops")
        wait_until(lambda: applied["version"] == 1)
        assert applied["documents"][0]["metadata"]["version"] == 1
        wait_until(lambda: plane.fleet(tenant_id)[0]["status"] == "in_sync")
        sent = loop.reports_sent
        wait_until(lambda: loop.reports_sent >= sent + 2)  # heartbeats

        server.stop()
        wait_until(lambda: not loop.connected and loop.last_error is not None)
        assert applied["version"] == 1  # the last accepted revision stays in force
        plane.put_desired(
            tenant_id, "edge-01", 1, document("edge-01", address="198.51.100.9/24"), author="ops"
        )
        time.sleep(0.5)
        assert applied["version"] == 1
        server.start()  # same port: the agent reconnects by itself
        wait_until(lambda: applied["version"] == 2)
        wait_until(lambda: loop.connected)
        wait_until(lambda: plane.fleet(tenant_id)[0]["applied_version"] == 2)
        assert plane.fleet(tenant_id)[0]["status"] == "in_sync"
    finally:
        loop.stop()


def test_a_revision_the_agent_refuses_is_reported_not_retried(control_plane, tmp_path) -> None:
    plane, tenant_id, _token, server = control_plane
    bundle_path = tmp_path / "bundle.json"
    bundle_path.write_text(json.dumps(plane.enroll(tenant_id, "edge-02", "test", url=server.url)))
    token_file = tmp_path / "credential"
    ControlPlaneClient(None, token_file).exchange_enrollment(bundle_path)
    attempts: list[int] = []

    def apply(_doc: dict[str, Any], version: int) -> None:
        attempts.append(version)
        raise RuntimeError("management interface missing")

    loop = SyncLoop(
        ControlPlaneClient(server.url, token_file),
        apply,
        lambda: {"applied_version": None, "reason_codes": ["STATE_RECONCILIATION_FAILED"]},
        heartbeat_interval=0.3,
        long_poll_seconds=1,
    )
    loop.start()
    try:
        plane.put_desired(tenant_id, "edge-02", 0, document("edge-02"), author="ops")
        wait_until(lambda: loop.last_apply_error is not None)
        time.sleep(1.0)
        assert attempts == [1]
        assert "management interface missing" in (loop.last_apply_error or "")
        wait_until(lambda: plane.fleet(tenant_id)[0]["status"] == "reconciliation_failed")
    finally:
        loop.stop()


def test_client_errors_are_classified(tmp_path: Path, control_plane) -> None:
    _plane, _tenant_id, _token, server = control_plane
    token_file = tmp_path / "credential"
    token_file.write_text("tu_d_not-a-real-credential\n")
    with pytest.raises(ControlPlaneRefused) as refused:
        ControlPlaneClient(server.url, token_file).wait_for_desired(0, 0)
    assert refused.value.status_code == 401
    with pytest.raises(ControlPlaneUnavailable):
        ControlPlaneClient("http://127.0.0.1:9", token_file, timeout=1).report({})
    with pytest.raises(ControlPlaneRefused, match="enroll the device first"):
        ControlPlaneClient(server.url, tmp_path / "missing").report({})
    assert httpx.get(server.url + "/healthz").status_code == 200


def test_report_from_status_carries_the_applied_revision_identity() -> None:
    digest = "sha256:" + "a" * 64
    override = {
        "version": 5,
        "actor": "root (trueup apply)",
        "at": "2025-01-02T03:04:05+00:00",
        "reason": "maintenance window",
        "digest": digest,
    }
    status: dict[str, Any] = {
        "versions": {
            "applied": 5,
            "applied_digest": digest,
            "origin": "local-cli",
            "override": override,
        },
        "subsystems": {"links": {"health": "ok"}},
        "management": {"ready": True},
    }
    report = report_from_status(status)
    assert report["applied_version"] == 5
    assert report["applied_digest"] == digest
    assert report["applied_origin"] == "local-cli"
    assert report["override"] == override
    # The server accepts it as is.
    parsed = AgentReport.model_validate(report)
    assert parsed.override is not None and parsed.override.version == 5
    assert parsed.applied_digest == digest

    # Breakers and a restore in progress travel too (notifications read them).
    busy = report_from_status(
        {
            "versions": {"applied": 3},
            "subsystems": {"dhcp": {"health": "failed", "breaker": "open"}},
            "restore": {"state": "applying", "pending": True, "problem": None, "since": "x"},
        }
    )
    assert busy["subsystems"]["dhcp"]["breaker"] == "open"
    assert busy["restore"] == {
        "state": "pending",
        "phase": "applying",
        "since": "x",
        "pending": True,  # the record's own fields stay beside the summary (the dashboard's)
        "id": None,
        "mode": None,
        "next": None,
    }
    stuck = report_from_status(
        {"subsystems": {}, "restore": {"state": "rolled_back", "pending": False}}
    )
    assert stuck["restore"]["state"] == "failed"

    # A status document from an older agent has none of them.
    older = report_from_status({"versions": {"applied": 3}, "subsystems": {}})
    assert older["applied_digest"] is None
    assert older["applied_origin"] is None
    assert older["override"] is None
    AgentReport.model_validate(older)
    # Breaker, acknowledgement expiry and a pending restore go along when the agent has them.
    full = report_from_status(
        {
            "versions": {"applied": 3},
            "subsystems": {"dhcp": {"health": "fenced", "breaker": "open", "tier": "services"}},
            "restore": {"id": "r-1", "state": "staged", "pending": True, "archive": "/x.tar"},
        }
    )
    assert full["subsystems"]["dhcp"]["breaker"] == "open"
    assert "tier" not in full["subsystems"]["dhcp"]
    assert full["restore"]["pending"] is True and "archive" not in full["restore"]
    AgentReport.model_validate(full)
    cleared = report_from_status(
        {"versions": {"applied": 3, "applied_digest": None, "origin": None, "override": None}}
    )
    assert cleared["applied_digest"] is cleared["applied_origin"] is cleared["override"] is None


def test_a_revision_deferred_by_a_busy_writer_is_applied_later(control_plane, tmp_path) -> None:
    plane, tenant_id, _token, server = control_plane
    bundle_path = tmp_path / "bundle.json"
    bundle_path.write_text(json.dumps(plane.enroll(tenant_id, "edge-03", "test", url=server.url)))
    token_file = tmp_path / "credential"
    ControlPlaneClient(None, token_file).exchange_enrollment(bundle_path)
    attempts: list[int] = []

    def apply(_doc: dict[str, Any], version: int) -> None:
        attempts.append(version)
        if len(attempts) < 3:
            raise RetryLater("another writer holds the device")

    loop = SyncLoop(
        ControlPlaneClient(server.url, token_file),
        apply,
        lambda: {"applied_version": None, "reason_codes": []},
        heartbeat_interval=0.3,
        long_poll_seconds=1,
        backoff_initial=0.05,
        backoff_max=0.1,
    )
    loop.start()
    try:
        plane.put_desired(tenant_id, "edge-03", 0, document("edge-03"), author="ops")
        wait_until(lambda: loop.seen_version == 1)
        assert attempts == [1, 1, 1]
        assert loop.last_apply_error is None
    finally:
        loop.stop()
