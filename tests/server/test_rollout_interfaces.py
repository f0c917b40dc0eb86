"""`trueup fleet rollout …` against a running control plane, and the dashboard's rollout
pages (waves, gates, the operator's forms, CSRF and roles)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.server.conftest import Server, ServerProcess
from tests.server.rolloutsim import (
    PARAMS,
    changed,
    drive,
    fleet,
    initial,
    start,
    status,
)
from tests.server.test_dashboard import browser, csrf_of
from trueup.cli.main import app
from trueup.server.db import Database
from trueup.server.keys import load_or_create_server_key
from trueup.server.service import ControlPlane
from trueup.server.tokens import Role

__all__ = ["fleet"]  # a fixture, used by name


def test_trueup_fleet_rollout_starts_shows_pauses_and_aborts_over_the_api(tmp_path: Path) -> None:
    db, key_file = f"sqlite:///{tmp_path}/server.db", tmp_path / "server.key"
    database = Database(db)
    database.migrate()
    plane = ControlPlane(database, load_or_create_server_key(key_file))
    tenant_id = plane.create_tenant("acme", "test")
    plane.create_user(tenant_id, "ops", Role.OPERATOR, "test")
    token_file = tmp_path / "token"
    token_file.write_text(plane.create_token(tenant_id, "ops", "test")[1])
    files = []
    for name in ("edge-00", "edge-01"):
        plane.create_device(tenant_id, name, "test")
        plane.put_desired(tenant_id, name, 0, initial(name), author="test")
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(changed(name)))
        files.append(str(path))
    process = ServerProcess(db, key_file, rollout_tick_seconds=0.1).start()
    try:
        connect = ["--server", process.url, "--token-file", str(token_file)]

        def run(*args: str) -> Any:
            return CliRunner().invoke(app, ["fleet", "rollout", *args])

        started = run("start", *files, "--canary", "edge-01", "--approval", *connect, "-o", "json")
        assert started.exit_code == 0, started.output
        rollout = json.loads(started.stdout)
        assert [w["members"] for w in rollout["waves"]] == [1, 1]
        assert rollout["waves"][1]["approval"] is True
        rid = str(rollout["id"])
        shown = run("status", rid, *connect)
        assert shown.exit_code == 0, shown.output
        assert f"rollout:       {rid}   running" in shown.stdout
        assert "wave 1:" in shown.stdout and "(approval)" in shown.stdout
        listed = run("status", *connect, "-o", "json")
        assert json.loads(listed.stdout)["count"] == 1
        again = run("start", files[0], *connect)
        assert again.exit_code == 1
        assert f"edge-00 is in rollout {rid} (running)" in again.stderr
        paused = run("pause", rid, "--reason", "lunch", *connect, "-o", "json")
        assert paused.exit_code == 0 and json.loads(paused.stdout)["reason"] == "lunch"
        approve = run("approve", rid, *connect)
        assert approve.exit_code == 1 and "is paused" in approve.stderr
        aborted = run("abort", rid, *connect)
        assert aborted.exit_code == 0, aborted.output
        assert "aborted" in aborted.stdout.splitlines()[0]
        missing = run("status", "999", *connect)
        assert missing.exit_code == 1 and "rollout 999 not found" in missing.stderr
        bad = tmp_path / "bad.yaml"
        bad.write_text("kind: DeviceState\n")
        refused = run("start", str(bad), *connect)
        assert refused.exit_code == 1 and "metadata.device: required" in refused.stderr
    finally:
        process.stop()
        database.dispose()


@pytest.mark.parametrize("isolated_server", PARAMS[:1], indirect=True)
def test_the_dashboard_shows_a_rollouts_waves_and_gates_and_pauses_it(
    isolated_server: Server, fleet: Any
) -> None:
    server = isolated_server
    tenant, agents = fleet(2)
    rollout = start(server, tenant, agents, waves=[{"devices": ["edge-00"]}, {"percent": 100}])

    def held(device: str, version: int) -> dict[str, Any] | None:
        return {"management_ready": False}  # applied, management not ready: it stays sent

    def judged(view: dict[str, Any]) -> bool:
        gates = view["members"][0].get("gates") or {}
        return bool(gates.get("checks", {}).get("management") is False)

    drive(server, tenant, agents, rollout["id"], judged, held)
    viewer = browser(server, tenant, "viewer")
    listing = viewer.get("/ui/rollouts")
    assert listing.status_code == 200 and f'href="/ui/rollouts/{rollout["id"]}"' in listing.text
    page = viewer.get(f"/ui/rollouts/{rollout['id']}")
    assert page.status_code == 200, page.text
    assert 'id="rollout-members"' in page.text and "edge-00" in page.text
    assert '<span class="gate no">management</span>' in page.text
    assert "waiting for management" in page.text
    assert f'data-stream="/ui/rollouts/{rollout["id"]}/stream"' in page.text
    refused = viewer.post(
        f"/ui/rollouts/{rollout['id']}/pause",
        data={"csrf": csrf_of(page.text)},
        follow_redirects=False,
    )
    assert refused.status_code == 403  # a viewer may look, not pause
    operator = browser(server, tenant, "operator")
    page = operator.get(f"/ui/rollouts/{rollout['id']}")
    forged = operator.post(
        f"/ui/rollouts/{rollout['id']}/pause", data={"csrf": "forged"}, follow_redirects=False
    )
    assert forged.status_code == 403
    paused = operator.post(
        f"/ui/rollouts/{rollout['id']}/pause",
        data={"csrf": csrf_of(page.text), "reason": "look first"},
        follow_redirects=False,
    )
    assert paused.status_code == 303, paused.text
    assert status(server, tenant, rollout["id"])["state"] == "paused"
    page = operator.get(f"/ui/rollouts/{rollout['id']}")
    assert "look first" in page.text and ">Resume</button>" in page.text
    wrong = operator.post(
        f"/ui/rollouts/{rollout['id']}/approve",
        data={"csrf": csrf_of(page.text)},
        follow_redirects=False,
    )
    assert wrong.status_code == 409 and "is paused" in wrong.text
    assert operator.get("/ui/rollouts/999").status_code == 404
    # The device page's apply form is refused too while the rollout holds the device.
    device_page = operator.get("/ui/devices/edge-00")
    applied = operator.post(
        "/ui/devices/edge-00/apply",
        data={
            "csrf": csrf_of(device_page.text),
            "expected": "2",
            "document": json.dumps(changed("edge-00", mtu=1300)),
        },
        follow_redirects=False,
    )
    assert applied.status_code == 409, applied.text
    assert f"edge-00 is in rollout {rollout['id']} (paused)" in applied.text
