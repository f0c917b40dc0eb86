"""A rollout of the fleet plan (`POST /api/v1/rollouts` with `plan`): the stored profiles,
variables and labels rendered per device, each member carrying its provenance, the
planner's refusals listed and never sent; `targets` and `plan` are one or the other."""

from __future__ import annotations

import json
from pathlib import Path

from sqlalchemy import select
from typer.testing import CliRunner

from tests.server.conftest import Server
from tests.server.test_api import report
from tests.server.test_planner import fleet_of, plan
from tests.server.test_profiles import profile, put_profile
from trueup.cli.main import app
from trueup.server.tables import rollout_members

API = "/api/v1/rollouts"


def test_a_rollout_of_the_plan_sends_what_publishing_would_with_its_refusals(
    server: Server,
) -> None:
    tenant = fleet_of(server, "edge-01", "edge-02", "edge-old")
    report(
        server,
        tenant,
        "edge-old",
        applied_version=1,
        agent_version="0.9.0",
        supported_sections=["management"],
    )
    assert put_profile(server, tenant, "edge-mtu", profile(selector=""), "0").status_code == 201
    planned = plan(server, tenant)
    response = server.client.post(
        API,
        json={"plan": {"selector": ""}, "waves": [{"devices": ["edge-02"]}, {"percent": 100}]},
        headers=tenant.auth("operator"),
    )
    assert response.status_code == 201, response.text
    rollout = response.json()
    assert [w["members"] for w in rollout["waves"]] == [1, 1]
    assert [(r["device"], r["kind"]) for r in rollout["refused"]] == [("edge-old", "agent-version")]
    members = {m["device"]: m for m in rollout["members"]}
    assert sorted(members) == ["edge-01", "edge-02"]
    digests = {t["device"]: t["digest"] for t in planned["targets"]}
    assert {d: m["digest"] for d, m in members.items()} == digests
    with server.plane.db.read() as conn:
        stored = [json.loads(p) for (p,) in conn.execute(select(rollout_members.c.provenance))]
    assert [p["profiles"] for p in stored] == [[{"name": "edge-mtu", "version": 1}]] * 2, stored
    # Like publishing, the devices keep their previous spec as their own layer (stored
    # inputs), so the next profile change still applies to them.
    for device in ("edge-01", "edge-02"):
        own = server.client.get(
            f"/api/v1/devices/{device}/variables", headers=tenant.auth("viewer")
        ).json()
        assert own["version"] == 1 and own["own"]["management"], own


def test_a_rollout_names_targets_or_the_plan_not_both_nor_neither(server: Server) -> None:
    tenant = fleet_of(server, "edge-01")
    target = {"device": "edge-01", "document": {"apiVersion": "trueup/v1"}}
    for body in ({}, {"targets": [target], "plan": {"selector": ""}}):
        response = server.client.post(API, json=body, headers=tenant.auth("operator"))
        assert response.status_code == 422, response.text
        assert "give either targets or plan" in response.text
    bad = server.client.post(
        API, json={"plan": {"selector": "site in ("}}, headers=tenant.auth("operator")
    )
    assert bad.status_code == 422 and "selector" in bad.text, bad.text


def test_rollout_start_takes_documents_or_the_plan(tmp_path: Path) -> None:
    runner = CliRunner()
    token = tmp_path / "token"
    token.write_text("t\n")
    connect = ["--server", "http://127.0.0.1:9", "--token-file", str(token)]
    neither = runner.invoke(app, ["fleet", "rollout", "start", *connect])
    assert neither.exit_code == 1 and "(FILE…) or --plan" in neither.stderr
    document = tmp_path / "edge-01.yaml"
    document.write_text("apiVersion: trueup/v1\nmetadata: {device: edge-01}\n")
    both = runner.invoke(app, ["fleet", "rollout", "start", str(document), "--plan", *connect])
    assert both.exit_code == 1 and "one or the other" in both.stderr
    stray = runner.invoke(app, ["fleet", "rollout", "start", str(document), "-l", "a=b", *connect])
    assert stray.exit_code == 1 and "-l/--selector goes with --plan" in stray.stderr
    # With --plan, the body names the plan and its selector (the server is not there).
    down = runner.invoke(app, ["fleet", "rollout", "start", "--plan", "-l", "a=b", *connect])
    assert down.exit_code == 1 and "did not answer" in down.stderr
