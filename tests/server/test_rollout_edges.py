"""Rollouts at their edges: a publish racing a rollout over the same device, a device that
regresses during the soak in a way that is not a failed apply, and the like.

Each test runs on SQLite and PostgreSQL with the controller ticking fast; devices are the
simulated agents of rolloutsim.py. Waits have generous bounds, never fixed sleeps.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from tests.server.conftest import Server
from tests.server.rolloutsim import (
    API,
    PARAMS,
    SimAgent,
    changed,
    drive,
    fleet,
    start,
    status,
    versions,
    wait_for,
)
from tests.server.test_notify import FAST
from tests.server.test_profiles import profile, put_profile
from trueup.server.service import rolloutcontrol
from trueup.server.service.rolloutcontrol import RolloutController

__all__ = ["fleet"]  # a fixture, used by name


@pytest.mark.parametrize("isolated_server", PARAMS, indirect=True)
def test_a_plan_published_after_a_rollout_took_its_device_is_refused_naming_the_rollout(
    isolated_server: Server, fleet: Any
) -> None:
    server = isolated_server
    tenant, _agents = fleet(3)
    tenant_id = server.plane.tenant_id(tenant.name)
    assert put_profile(server, tenant, "edge-mtu", profile(selector=""), "0").status_code == 201
    planned = server.plane.plan(tenant_id)  # every device a target, none busy yet
    assert sorted(t.device for t in planned.targets) == ["edge-00", "edge-01", "edge-02"]
    # Meanwhile a rollout takes edge-00 (in a wave that waits for an approval: not sent).
    response = server.client.post(
        API,
        json={
            "targets": [
                {"device": "edge-01", "document": changed("edge-01")},
                {"device": "edge-00", "document": changed("edge-00")},
            ],
            "waves": [{"devices": ["edge-01"]}, {"devices": ["edge-00"]}],
            "approval": True,
        },
        headers=tenant.auth("operator"),
    )
    assert response.status_code == 201, response.text
    rollout_id = response.json()["id"]
    published = server.plane.publish_plan(tenant_id, planned, actor="test")
    assert "edge-00" not in [device for device, _ in published.stored]
    busy = [r for r in published.refused if r.device == "edge-00"]
    assert busy and busy[0].kind == "busy", published
    assert f"rollout {rollout_id}" in " ".join(busy[0].problems)
    assert server.plane.desired(tenant_id, "edge-00") is not None
    assert server.plane.desired(tenant_id, "edge-00").version == 1  # type: ignore[union-attr]
    assert ("edge-02", 2) in published.stored  # a device no rollout holds is stored
    # A plan made now names the rollout too.
    again = server.plane.plan(tenant_id)
    held = {r.device: r for r in again.refused}
    assert held["edge-00"].kind == "busy", again
    assert f"rollout {rollout_id}" in " ".join(held["edge-00"].problems), held


@pytest.mark.parametrize("isolated_server", PARAMS, indirect=True)
def test_a_device_that_loses_management_during_the_soak_fails_and_pauses_the_rollout(
    isolated_server: Server, fleet: Any
) -> None:
    server = isolated_server
    tenant, agents = fleet(3)
    rollout = start(
        server,
        tenant,
        agents,
        waves=[{"devices": ["edge-00"]}, {"percent": 100}],
        soak_seconds=2,
    )
    soaking = drive(
        server, tenant, agents, rollout["id"], lambda v: v["waves"][0]["state"] == "soaking"
    )
    assert soaking["members"][0]["state"] == "passed"
    canary = agents[0]
    canary.report(canary.applied, canary.digest, {"management_ready": False})

    def lost(device: str, version: int) -> dict[str, Any] | None:
        return {"management_ready": False} if device == "edge-00" else None

    final = drive(
        server,
        tenant,
        agents,
        rollout["id"],
        lambda v: v["state"] in ("paused", "completed"),
        lost,
    )
    assert final["state"] == "paused", final
    first = final["members"][0]
    assert first["device"] == "edge-00" and first["state"] == "reverted", first
    assert "management" in first["reason"], first
    assert all(m["state"] == "pending" for m in final["members"][1:])


# A server whose own controller never ticks: the test drives a controller of its own.
STILL = [("postgres", {**FAST, "rollout_tick_seconds": 3600})]


@pytest.mark.parametrize("isolated_server", STILL, indirect=True)
def test_an_abort_while_the_controller_sends_leaves_no_device_on_the_change(
    isolated_server: Server, fleet: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = isolated_server
    tenant, agents = fleet(2)
    tenant_id = server.plane.tenant_id(tenant.name)
    rollout = start(server, tenant, agents, max_unavailable=2)
    own = server.plane.rollout_controller
    controller = RolloutController(own.store, own.insert_revision, holder="test-controller")
    real_send = rolloutcontrol.send_members
    aborted: list[Any] = []

    def abort() -> None:
        aborted.append(server.plane.abort_rollout(tenant_id, rollout["id"], actor="op"))

    def blocked() -> bool:
        with own.store.db.read() as conn:
            waiting = conn.exec_driver_sql(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database()"
            ).scalar_one()
        return bool(aborted) or int(waiting) > 0

    def send_during_abort(*args: Any, **kwargs: Any) -> Any:
        # The controller has sent, not yet committed; an operator aborts the rollout now.
        answer = real_send(*args, **kwargs)
        thread = threading.Thread(target=abort)
        thread.start()
        sending.append(thread)
        wait_for(blocked, "the abort to finish or to wait for the controller")
        return answer

    sending: list[threading.Thread] = []
    monkeypatch.setattr(rolloutcontrol, "send_members", send_during_abort)
    controller.step()
    for thread in sending:
        thread.join(timeout=120)
    assert aborted, "the abort did not finish"
    final = status(server, tenant, rollout["id"])
    assert final["state"] == "aborted", final
    for m in final["members"]:
        # Nothing sent stays on the change: each sent device is put back, or never sent.
        assert m["state"] in ("reverted", "skipped"), m
        current = server.plane.desired(tenant_id, m["device"])
        assert current is not None
        assert current.content_hash == versions(server, tenant, m["device"])[0], m


@pytest.mark.parametrize("isolated_server", PARAMS[:1], indirect=True)
def test_an_approval_on_the_first_wave_is_refused_not_ignored(
    isolated_server: Server, fleet: Any
) -> None:
    server = isolated_server
    tenant, agents = fleet(2)
    response = server.client.post(
        API,
        json={
            "targets": [{"device": a.device, "document": changed(a.device)} for a in agents],
            "waves": [{"devices": ["edge-00"], "approval": True}, {"percent": 100}],
        },
        headers=tenant.auth("operator"),
    )
    assert response.status_code == 422, response.text
    assert any(p.startswith("waves[0].approval:") for p in response.json()["problems"])
    assert server.client.get(API, headers=tenant.auth("viewer")).json()["count"] == 0
    assert [a.poll() for a in agents] == [False, False]  # nothing was sent


@pytest.mark.parametrize("isolated_server", PARAMS[:1], indirect=True)
def test_a_canary_the_plan_refuses_is_named_with_the_refusal(
    isolated_server: Server, fleet: Any
) -> None:
    server = isolated_server
    tenant, _agents = fleet(2)
    assert put_profile(server, tenant, "edge-mtu", profile(selector=""), "0").status_code == 201
    bad = server.client.put(
        "/api/v1/devices/edge-00/variables",
        json={"variables": {"mtu": 100}},
        headers={**tenant.auth("operator"), "If-Match": "0"},
    )
    assert bad.status_code == 200, bad.text
    response = server.client.post(
        "/api/v1/plan/rollout",
        json={"waves": [{"devices": ["edge-00"]}, {"percent": 100}]},
        headers=tenant.auth("operator"),
    )
    assert response.status_code == 422, response.text
    (problem,) = response.json()["problems"]
    assert problem.startswith(
        "waves[0].devices: 'edge-00' is not a target of the plan: the plan refuses it (render: "
    ), problem
    assert "variables.mtu" in problem, problem


@pytest.mark.parametrize("isolated_server", PARAMS[:1], indirect=True)
def test_a_devices_first_revision_passes_without_a_confirmation_the_agent_never_gives(
    isolated_server: Server,
) -> None:
    # The agent applies the first revision it receives without a window (it has nothing to
    # return to): waiting for its confirmation would time every new device out.
    server = isolated_server
    tenant = server.tenant("ro", devices=("edge-00",))
    agent = SimAgent(server.client, "edge-00", tenant.devices["edge-00"])
    rollout = server.client.post(
        API,
        json={
            "targets": [{"device": "edge-00", "document": changed("edge-00")}],
            "confirm_within": 60,
            "gate_timeout": 3,
        },
        headers=tenant.auth("operator"),
    )
    assert rollout.status_code == 201, rollout.text
    final = drive(server, tenant, [agent], rollout.json()["id"], lambda v: v["state"] != "running")
    assert final["state"] == "completed", final
    assert final["members"][0]["state"] == "passed", final["members"][0]


@pytest.mark.parametrize("isolated_server", PARAMS[:1], indirect=True)
def test_an_abort_after_a_wave_puts_back_only_the_changed_devices_and_audits_it(
    isolated_server: Server, fleet: Any
) -> None:
    server = isolated_server
    tenant, agents = fleet(3)
    tenant_id = server.plane.tenant_id(tenant.name)
    rollout = start(
        server, tenant, agents, waves=[{"devices": ["edge-00"]}, {"percent": 100}], approval=True
    )
    drive(server, tenant, agents, rollout["id"], lambda v: v["state"] == "waiting-approval")
    before = {a.device: versions(server, tenant, a.device) for a in agents}
    assert [len(before[d]) for d in ("edge-00", "edge-01", "edge-02")] == [2, 1, 1]
    aborted = server.client.post(
        f"{API}/{rollout['id']}/abort",
        json={"reason": "wrong mtu"},
        headers=tenant.auth("operator"),
    )
    assert aborted.status_code == 200, aborted.text
    states = {m["device"]: m["state"] for m in aborted.json()["members"]}
    assert states == {"edge-00": "reverted", "edge-01": "skipped", "edge-02": "skipped"}
    after = {a.device: versions(server, tenant, a.device) for a in agents}
    assert after["edge-00"] == [*before["edge-00"], before["edge-00"][0]]  # back on version 1
    assert after["edge-01"] == before["edge-01"] and after["edge-02"] == before["edge-02"]
    entry = next(
        e
        for e in server.plane.audit_entries(tenant_id, limit=1000)
        if e["action"] == "rollout.abort"
    )
    assert entry["detail"]["reason"] == "wrong mtu"
    assert [p["device"] for p in entry["detail"]["put_back"]] == ["edge-00"]
