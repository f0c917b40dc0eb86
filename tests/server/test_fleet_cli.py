"""`trueup fleet` against a running control plane; ISO times in the fleet JSON; `/` answers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
from typer.testing import CliRunner

from tests.server.conftest import Server, ServerProcess, document
from tests.server.test_api import fleet, put, report
from trueup.cli.main import app
from trueup.cli.server import server_app

ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
ISO_IN_TEXT = re.compile(r"\b\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z\b")


def test_fleet_json_times_are_iso_8601_utc(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01",))
    assert put(server, tenant, "edge-01", 0, document("edge-01")).status_code == 201
    report(server, tenant, "edge-01", applied_version=1, heartbeat_interval=30)
    acked = server.client.post(
        "/api/v1/devices/edge-01/acks",
        json={"subsystem": "links", "for_seconds": 600, "reason": "maintenance"},
        headers=tenant.auth("operator"),
    )
    assert acked.status_code == 201, acked.text
    assert ISO.match(acked.json()["expires_at"]), acked.json()
    entry = fleet(server, tenant)["edge-01"]
    assert ISO.match(entry["last_report_at"]), entry
    assert ISO.match(entry["in_sync_since"]), entry
    assert ISO.match(entry["acknowledgements"][0]["expires_at"]), entry
    assert isinstance(entry["heartbeat_age"], float)  # a duration stays a number
    shown = server.client.get("/api/v1/devices/edge-01", headers=tenant.auth("viewer")).json()
    assert ISO.match(shown["last_report_at"])
    reports = server.client.get(
        "/api/v1/devices/edge-01/reports", headers=tenant.auth("viewer")
    ).json()["reports"]
    assert reports and all(ISO.match(r["received_at"]) for r in reports)


def test_the_control_plane_answers_its_root_with_the_dashboard_sign_in(server: Server) -> None:
    response = server.client.get("/", follow_redirects=True)
    assert response.status_code == 200
    assert "Sign in" in response.text and 'action="/ui/login"' in response.text


def _invoke(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args), env=env)
    return result.exit_code, result.stdout, result.stderr


def test_trueup_fleet_lists_filters_and_shows_over_the_api(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/server.db"
    key = ["--db", db, "--key-file", str(tmp_path / "server.key")]
    runner = CliRunner()
    for tenant in ("acme", "other"):
        assert runner.invoke(server_app, ["tenant", "create", tenant, *key]).exit_code == 0
    tokens = {}
    for tenant, role in (
        ("acme", "viewer"),
        ("acme", "operator"),
        ("acme", "admin"),
        ("other", "operator"),
    ):
        created = runner.invoke(
            server_app,
            [
                "token",
                "create",
                "--tenant",
                tenant,
                "--user",
                f"{tenant}-{role}",
                "--role",
                role,
                *key,
            ],
        )
        assert created.exit_code == 0, created.output
        tokens[(tenant, role)] = created.output.strip().splitlines()[-1].split()[-1]
    files = {}
    for (tenant, role), token in tokens.items():
        files[(tenant, role)] = tmp_path / f"{tenant}-{role}.token"
        files[(tenant, role)].write_text(token + "\n")
    process = ServerProcess(db, tmp_path / "server.key").start()
    try:
        url = process.url
        for tenant, devices in (("acme", ("edge-01", "core-02")), ("other", ("secret-9",))):
            auth = {"Authorization": f"Bearer {tokens[(tenant, 'operator')]}"}
            for device in devices:
                created = httpx.post(f"{url}/api/v1/devices", json={"name": device}, headers=auth)
                assert created.status_code == 201, created.text
        # edge-01 reports (enrolled through the API): its last report shows as an ISO time.
        admin = {"Authorization": f"Bearer {tokens[('acme', 'admin')]}"}
        bundle = httpx.post(f"{url}/api/v1/devices/edge-01/enrollment", headers=admin).json()
        credential = httpx.post(
            f"{url}/api/v1/agent/enroll", headers={"Authorization": f"Bearer {bundle['token']}"}
        ).json()["credential"]
        reported = httpx.post(
            f"{url}/api/v1/agent/report",
            json={"applied_version": None, "heartbeat_interval": 30},
            headers={"Authorization": f"Bearer {credential}"},
        )
        assert reported.status_code == 200, reported.text
        viewer = str(files[("acme", "viewer")])
        env = {"TRUEUP_SERVER": url, "TRUEUP_TOKEN_FILE": viewer}

        code, out, err = _invoke("fleet", env=env)
        assert code == 0, err
        assert out.splitlines()[0].split()[:2] == ["DEVICE", "STATUS"]
        assert "edge-01" in out and "core-02" in out and "secret-9" not in out
        assert "2 device(s)" in out
        edge = next(line for line in out.splitlines() if line.startswith("edge-01"))
        assert ISO_IN_TEXT.search(edge), edge  # LAST REPORT
        listed = runner.invoke(server_app, ["fleet", "list", "--tenant", "acme", *key])
        edge = next(line for line in listed.output.splitlines() if line.startswith("edge-01"))
        assert ISO_IN_TEXT.search(edge) and " ago" not in edge, edge

        code, out, err = _invoke("fleet", "list", "--search", "edge", "-o", "json", env=env)
        assert code == 0, err
        body = json.loads(out)
        assert [d["device"] for d in body["devices"]] == ["edge-01"]

        code, out, _ = _invoke("fleet", "list", "--status", "in_sync", "-o", "json", env=env)
        assert code == 0 and [d["device"] for d in json.loads(out)["devices"]] == ["edge-01"]
        code, out, _ = _invoke("fleet", "list", "--status", "heartbeat_stale", env=env)
        assert code == 0 and "core-02" in out and "edge-01" not in out

        code, out, err = _invoke(
            "fleet", "show", "edge-01", "--server", url, "--token-file", viewer
        )
        assert code == 0, err
        assert out.startswith("device:        edge-01")
        assert ISO_IN_TEXT.search(out.split("last report:", 1)[1].splitlines()[0]), out

        # Another tenant's device is not found; a bad token and no server are one line, exit 1.
        code, _, err = _invoke("fleet", "show", "secret-9", env=env)
        assert code == 1 and "secret-9" in err and err.count("\n") == 1
        bad = tmp_path / "bad.token"
        bad.write_text("tu_u_" + "x" * 43)
        code, _, err = _invoke("fleet", env={**env, "TRUEUP_TOKEN_FILE": str(bad)})
        assert code == 1 and "refused the token" in err and err.count("\n") == 1
    finally:
        process.stop()
    code, _, err = _invoke("fleet", env=env)
    assert code == 1 and "did not answer" in err and err.count("\n") == 1
    code, _, err = _invoke("fleet", env={"TRUEUP_SERVER": "", "TRUEUP_TOKEN_FILE": viewer})
    assert code == 1 and "--server" in err
