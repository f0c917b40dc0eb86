"""What the agent says it is (version, supported apiVersions and sections) reaches the
control plane, its API, `trueup fleet show` and the device page; unknown fleet filter
values are refused by the API, both CLIs and the dashboard (on SQLite and PostgreSQL)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from tests.server.conftest import Server, ServerProcess, document
from tests.server.test_api import put, report
from tests.server.test_dashboard import browser
from trueup import __version__
from trueup.agent.cpclient import report_from_status
from trueup.cli.main import app
from trueup.cli.server import server_app
from trueup.model.document import SUPPORTED_API_VERSIONS
from trueup.model.reasons import ReasonCode
from trueup.server.tokens import Role

# The API's contract: what `status` and `reason` accept, in this order.
FILTER_CHOICES = {
    "status": (
        "in_sync",
        "drift",
        "version_skew",
        "heartbeat_stale",
        "reconciliation_failed",
        "local_override",
    ),
    "reason": tuple(c.value for c in ReasonCode),
}
STATUS_CHOICES = ", ".join(FILTER_CHOICES["status"])


def _agent_status(version: str = "7.8.9") -> dict[str, Any]:
    return {
        "agent": {"running": True, "version": version, "pid": 1},
        "versions": {"applied": 1},
        "subsystems": {"links": {"health": "ok"}},
        "management": {"ready": True},
    }


def test_every_report_says_which_agent_sent_it_and_what_it_supports() -> None:
    built = report_from_status(_agent_status())
    assert built["agent_version"] == "7.8.9"
    assert built["supported_api_versions"] == list(SUPPORTED_API_VERSIONS)
    sections = built["supported_sections"]
    # Core sections and the subsystems' own sections, sorted.
    assert {"management", "interfaces", "routes", "dhcp", "firewall", "wireguard"} <= set(sections)
    assert sections == sorted(sections)
    # A status without the agent section (an embedded caller) still names this package.
    assert report_from_status({"versions": {}})["agent_version"] == __version__


def test_the_control_plane_stores_and_shows_what_the_agent_reported(server: Server) -> None:
    tenant = server.tenant(devices=("edge-new", "edge-old"))
    for device in ("edge-new", "edge-old"):
        body = document(device, sysctl={"net.ipv4.ip_forward": 1})
        assert put(server, tenant, device, 0, body).status_code == 201
    new = report_from_status(_agent_status("7.8.9"))
    new["applied_version"] = 1
    # This agent knows no sysctl section: the desired revision uses one.
    new["supported_sections"] = [s for s in new["supported_sections"] if s != "sysctl"]
    report(server, tenant, "edge-new", **new)
    report(server, tenant, "edge-old", applied_version=1)  # an agent older than these fields

    shown = server.client.get("/api/v1/devices/edge-new", headers=tenant.auth("viewer")).json()
    assert shown["agent"]["version"] == "7.8.9"
    assert shown["agent"]["api_versions"] == list(SUPPORTED_API_VERSIONS)
    assert "sysctl" not in shown["agent"]["sections"] and "management" in shown["agent"]["sections"]
    assert [u["path"] for u in shown["agent"]["unsupported"]] == ["spec.sysctl"]
    assert shown["last_report"]["agent_version"] == "7.8.9"
    history = server.client.get(
        "/api/v1/devices/edge-new/reports", headers=tenant.auth("viewer")
    ).json()["reports"]
    assert history[0]["supported_sections"] == new["supported_sections"]

    old = server.client.get("/api/v1/devices/edge-old", headers=tenant.auth("viewer")).json()
    assert old["agent"] == {
        "version": None,
        "api_versions": None,
        "sections": None,
        "unsupported": [],
    }

    page = browser(server, tenant, "viewer").get("/ui/devices/edge-new").text
    assert '<span id="agent-version">7.8.9</span>' in page
    assert "trueup/v1" in page and "spec.sysctl" in page
    old_page = browser(server, tenant, "viewer").get("/ui/devices/edge-old").text
    assert '<span id="agent-version">not reported</span>' in old_page
    assert "spec.sysctl" not in old_page


def test_a_report_with_a_bad_agent_identity_is_refused_naming_the_field(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01",))
    for field, value in (
        ("agent_version", "1.0\n"),
        ("supported_sections", ["ok", "x" * 101]),
        ("supported_api_versions", "trueup/v1"),
    ):
        answer = server.client.post(
            "/api/v1/agent/report",
            json={field: value},
            headers=tenant.device_auth("edge-01"),
        )
        assert answer.status_code == 422, (field, answer.text)
        assert any(p.startswith(f"body.{field}") for p in answer.json()["problems"]), answer.text


def test_agent_support_names_an_unsupported_api_version() -> None:
    from trueup.server.fleet import agent_support

    found = agent_support(
        {"supported_api_versions": ["trueup/v1"], "supported_sections": ["management"]},
        {"apiVersion": "trueup/v2", "spec": {"management": {}, "vpn": {}}},
    )
    assert [u["path"] for u in found["unsupported"]] == ["apiVersion", "spec.vpn"]
    assert "trueup/v2" in found["unsupported"][0]["detail"]
    assert "trueup/v1" in found["unsupported"][0]["detail"]
    assert agent_support(None, {"apiVersion": "trueup/v2"})["unsupported"] == []


def test_the_api_refuses_unknown_filter_values_naming_parameter_value_and_choices(
    server: Server,
) -> None:
    tenant = server.tenant(devices=("edge-01",))
    for query, parameter, value in (
        ("status=drifting", "status", "drifting"),
        ("status=bogus", "status", "bogus"),
        ("reason=STATE_DRIFTED", "reason", "STATE_DRIFTED"),
    ):
        answer = server.client.get(f"/api/v1/devices?{query}", headers=tenant.auth("viewer"))
        assert answer.status_code == 422, answer.text
        (problem,) = answer.json()["problems"]
        assert problem.startswith(f"query.{parameter}: {value!r} is not one of "), problem
        for choice in FILTER_CHOICES[parameter]:
            assert choice in problem
    both = server.client.get(
        "/api/v1/devices?status=x&reason=y", headers=tenant.auth("viewer")
    ).json()
    assert len(both["problems"]) == 2
    # Known values still filter.
    listed = server.client.get(
        "/api/v1/devices?status=heartbeat_stale&reason=STATE_VERSION_SKEW",
        headers=tenant.auth("viewer"),
    )
    assert listed.status_code == 200 and listed.json()["count"] == 0
    listed = server.client.get(
        "/api/v1/devices?status=heartbeat_stale", headers=tenant.auth("viewer")
    )
    assert [d["device"] for d in listed.json()["devices"]] == ["edge-01"]


def test_the_dashboard_shows_an_error_for_an_unknown_filter_value(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01",))
    client = browser(server, tenant, "viewer")
    page = client.get("/?status=drifting")
    assert page.status_code == 422
    assert 'id="filter-error"' in page.text and "drifting" in page.text
    assert "heartbeat_stale" in page.text and 'id="fleet-body"' not in page.text
    page = client.get("/?reason=STATE_BOGUS")
    assert page.status_code == 422 and "STATE_BOGUS" in page.text
    assert "STATE_DRIFT_DETECTED" in page.text
    stream = client.get("/ui/fleet/stream?status=drifting")
    assert stream.status_code == 422 and "drifting" in stream.text
    fine = client.get("/?status=heartbeat_stale")
    assert fine.status_code == 200 and 'data-device="edge-01"' in fine.text


def _invoke(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args), env=env)
    return result.exit_code, result.stdout, result.stderr


def test_fleet_commands_refuse_unknown_filter_values_and_show_the_agent(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/server.db"
    key_file = tmp_path / "server.key"
    key = ["--db", db, "--key-file", str(key_file)]
    runner = CliRunner()
    assert runner.invoke(server_app, ["tenant", "create", "acme", *key]).exit_code == 0
    created = runner.invoke(
        server_app,
        ["token", "create", "--tenant", "acme", "--user", "ops", "--role", "operator", *key],
    )
    assert created.exit_code == 0, created.output
    token_file = tmp_path / "ops.token"
    token_file.write_text(created.output.strip().splitlines()[-1].split()[-1] + "\n")

    code, _, err = _invoke(
        "fleet", "list", "--status", "drifting", "--server", "http://127.0.0.1:9",
        "--token-file", str(token_file),
    )  # fmt: skip
    # Refused before any request: the server at that URL is not even running.
    assert code == 1, err
    assert "--status: 'drifting' is not one of" in err and STATUS_CHOICES in err
    listed = runner.invoke(
        server_app, ["fleet", "list", "--tenant", "acme", "--status", "bogus", *key]
    )
    assert listed.exit_code == 1 and STATUS_CHOICES in listed.stderr
    listed = runner.invoke(
        server_app, ["fleet", "list", "--tenant", "acme", "--reason", "STATE_NOPE", *key]
    )
    assert listed.exit_code == 1 and "STATE_DRIFT_DETECTED" in listed.stderr

    process = ServerProcess(db, key_file).start()
    try:
        import httpx

        url = process.url
        auth = {"Authorization": f"Bearer {token_file.read_text().strip()}"}
        assert (
            httpx.post(f"{url}/api/v1/devices", json={"name": "edge-01"}, headers=auth).status_code
            == 201
        )
        from trueup.server.db import Database
        from trueup.server.keys import load_or_create_server_key
        from trueup.server.service import ControlPlane

        plane = ControlPlane(Database(db), load_or_create_server_key(key_file))
        tenant_id = plane.tenant_id("acme")
        plane.create_user(tenant_id, "admin", Role.ADMIN, "test")
        bundle = plane.enroll(tenant_id, "edge-01", "test", url=url)
        credential = httpx.post(
            f"{url}/api/v1/agent/enroll", headers={"Authorization": f"Bearer {bundle['token']}"}
        ).json()["credential"]
        sent = report_from_status(_agent_status("7.8.9"))
        assert (
            httpx.post(
                f"{url}/api/v1/agent/report",
                json=sent,
                headers={"Authorization": f"Bearer {credential}"},
            ).status_code
            == 200
        )
        env = {"TRUEUP_SERVER": url, "TRUEUP_TOKEN_FILE": str(token_file)}
        code, out, err = _invoke("fleet", "show", "edge-01", env=env)
        assert code == 0, err
        assert "agent:         7.8.9" in out and "trueup/v1; sections " in out
        code, out, err = _invoke("fleet", "show", "edge-01", "-o", "json", env=env)
        assert code == 0 and json.loads(out)["agent"]["version"] == "7.8.9"
        shown = runner.invoke(server_app, ["fleet", "show", "edge-01", "--tenant", "acme", *key])
        assert shown.exit_code == 0 and "agent:         7.8.9" in shown.output
        code, out, err = _invoke("fleet", "list", "--status", "in_sync", "-o", "json", env=env)
        assert code == 0, err
    finally:
        process.stop()
