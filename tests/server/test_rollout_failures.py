"""Rollouts that go wrong: a canary that rolls back by itself (pause, put back, webhook),
failures within the budget, a regression during the soak, the controller's lease, a
stored spec that cannot be read. SQLite and PostgreSQL, simulated agents (rolloutsim.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import update

from tests.server.conftest import Server
from tests.server.rolloutsim import (
    API,
    PARAMS,
    audit_actions,
    drive,
    fleet,
    start,
    status,
    versions,
    wait_for,
)
from tests.server.test_notify import Receiver, receivers, route
from trueup.server.service.rolloutrows import take_lease
from trueup.server.tables import rollout_leases, rollouts

__all__ = ["fleet", "receivers"]  # fixtures used by name


@pytest.mark.parametrize("isolated_server", PARAMS, indirect=True)
def test_a_canary_that_rolls_back_pauses_the_rollout_is_put_back_and_notifies(
    isolated_server: Server,
    fleet: Any,
    receivers: Callable[[], Receiver],
) -> None:
    server = isolated_server
    tenant, agents = fleet(4)
    hook = receivers()
    route(server, tenant, hook, match={"kinds": ["rollout_paused"]})

    def canary_loses_management(device: str, version: int) -> dict[str, Any] | None:
        if device == "edge-00" and version == 2:
            return {
                "management_ready": False,
                "confirmation": {"version": 2, "state": "rolled-back", "reason": "management lost"},
            }
        if version == 2:  # the other canary confirms
            return {"confirmation": {"version": 2, "state": "confirmed"}}
        return None

    rollout = start(
        server,
        tenant,
        agents,
        waves=[{"devices": ["edge-00", "edge-01"]}, {"percent": 100}],
        max_unavailable=2,
        confirm_within=30,
        failure_budget=0,
    )
    final = drive(
        server,
        tenant,
        agents,
        rollout["id"],
        lambda v: v["state"] == "paused",
        canary_loses_management,
    )
    assert "more than the failure budget (0)" in final["reason"]
    by_name = {m["device"]: m for m in final["members"]}
    assert by_name["edge-00"]["state"] == "reverted"
    assert "rolled version 2 back by itself: management lost" in by_name["edge-00"]["reason"]
    assert by_name["edge-00"]["reverted_version"] == 3
    first = versions(server, tenant, "edge-00")
    assert first[2] == first[0]  # version 3 is version 1's document again
    for name in ("edge-02", "edge-03"):  # the second wave never received it
        assert by_name[name]["state"] == "pending"
        assert len(versions(server, tenant, name)) == 1
    (event,) = wait_for(lambda: hook.events("rollout_paused"), "the rollout_paused webhook")
    assert event["device"] == "edge-00" and event["severity"] == "critical"
    assert event["rollout"]["id"] == rollout["id"] and event["rollout"]["failed"] == ["edge-00"]
    assert "rollout.pause" in audit_actions(server, tenant)
    # Resuming accepts the wave's failure: the budget counts new ones, and it goes on.
    resumed = server.client.post(
        f"{API}/{rollout['id']}/resume", json={}, headers=tenant.auth("operator")
    )
    assert resumed.status_code == 200, resumed.text
    final = drive(
        server,
        tenant,
        agents,
        rollout["id"],
        lambda v: v["state"] == "completed",
        canary_loses_management,
    )
    states = {m["device"]: m["state"] for m in final["members"]}
    assert states == {
        "edge-00": "reverted",
        "edge-01": "passed",
        "edge-02": "passed",
        "edge-03": "passed",
    }
    assert server.plane.verify_audit() == []


@pytest.mark.parametrize("isolated_server", PARAMS, indirect=True)
def test_a_failure_within_budget_is_put_back_and_the_rollout_goes_on_until_one_more(
    isolated_server: Server, fleet: Any
) -> None:
    server = isolated_server
    tenant, agents = fleet(4)
    failing = {"edge-00"}

    def apply_fails(device: str, version: int) -> dict[str, Any] | None:
        if device in failing and version == 2:
            return {"reason_codes": ["STATE_PARTIAL_UPDATE"]}
        return None

    rollout = start(
        server,
        tenant,
        agents,
        waves=[{"devices": ["edge-00", "edge-01", "edge-02"]}, {"percent": 100}],
        max_unavailable=1,
        failure_budget=1,
    )
    final = drive(
        server,
        tenant,
        agents[:3],
        rollout["id"],
        lambda v: v["current_wave"] == 1 or v["state"] != "running",
        apply_fails,
    )
    by_name = {m["device"]: m for m in final["members"]}
    assert by_name["edge-00"]["state"] == "reverted"  # put back although within budget
    assert by_name["edge-00"]["reverted_version"] == 3
    assert by_name["edge-01"]["state"] == by_name["edge-02"]["state"] == "passed"
    assert final["state"] == "running"  # one failure: within the budget of one
    failing.add("edge-03")
    paused = drive(
        server, tenant, agents, rollout["id"], lambda v: v["state"] != "running", apply_fails
    )
    assert paused["state"] == "completed"  # wave 1 has its own budget: one failure is fine
    assert {m["device"]: m["state"] for m in paused["members"]}["edge-03"] == "reverted"


@pytest.mark.parametrize("isolated_server", PARAMS, indirect=True)
def test_a_device_that_regresses_during_the_soak_pauses_before_the_next_wave(
    isolated_server: Server, fleet: Any
) -> None:
    server = isolated_server
    tenant, agents = fleet(3)
    rollout = start(
        server,
        tenant,
        agents,
        waves=[{"devices": ["edge-00"]}, {"percent": 100}],
        soak_seconds=600,
    )
    soaking = drive(
        server, tenant, agents, rollout["id"], lambda v: v["waves"][0]["state"] == "soaking"
    )
    assert soaking["members"][0]["state"] == "passed"
    canary = agents[0]
    canary.report(canary.applied, canary.digest, {"reason_codes": ["STATE_RECONCILIATION_FAILED"]})
    final = drive(server, tenant, agents, rollout["id"], lambda v: v["state"] == "paused")
    first = final["members"][0]
    assert first["device"] == "edge-00" and first["state"] == "reverted"
    assert "the apply failed: STATE_RECONCILIATION_FAILED" in first["reason"]
    assert all(m["state"] == "pending" for m in final["members"][1:])


@pytest.mark.parametrize("isolated_server", PARAMS, indirect=True)
def test_the_lease_goes_to_one_holder_until_it_runs_out(
    isolated_server: Server, fleet: Any
) -> None:
    server = isolated_server
    tenant, agents = fleet(1)
    rollout = start(server, tenant, agents)
    with server.plane.db.write() as conn:  # the server's own controller lets go first
        conn.execute(update(rollout_leases).values(holder="", expires_at=0.0))
        assert take_lease(conn, rollout["id"], "a", 1000.0, 10.0)
        assert not take_lease(conn, rollout["id"], "b", 1005.0, 10.0)
        assert take_lease(conn, rollout["id"], "a", 1005.0, 10.0)  # renewed: until 1015
        assert not take_lease(conn, rollout["id"], "b", 1014.0, 10.0)
        assert take_lease(conn, rollout["id"], "b", 1016.0, 10.0)
        assert not take_lease(conn, rollout["id"], "a", 1017.0, 10.0)
        conn.execute(update(rollout_leases).values(expires_at=0.0))


@pytest.mark.parametrize("isolated_server", PARAMS, indirect=True)
def test_a_rollout_whose_stored_spec_cannot_be_read_fails_with_the_reason(
    isolated_server: Server, fleet: Any
) -> None:
    server = isolated_server
    tenant, agents = fleet(1)
    rollout = start(server, tenant, agents, approval=False)
    server.client.post(f"{API}/{rollout['id']}/pause", json={}, headers=tenant.auth("operator"))
    with server.plane.db.write() as conn:
        conn.execute(
            update(rollouts)
            .where(rollouts.c.id == rollout["id"])
            .values(spec=json.dumps({"waves": [{"percent": 0}]}))
        )
    server.client.post(f"{API}/{rollout['id']}/resume", json={}, headers=tenant.auth("operator"))
    failed = wait_for(
        lambda: (v := status(server, tenant, rollout["id"]))["state"] == "failed" and v,
        "the rollout to fail",
    )
    assert "its stored spec cannot be read" in failed["reason"]
    assert "waves[0].percent: 0 is not an integer from 1 to 100" in failed["reason"]
    assert "rollout.fail" in audit_actions(server, tenant)
