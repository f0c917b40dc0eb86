"""Rollouts on the control plane: waves, max_unavailable, gates from the agents' reports,
the failure budget (pause, put back, notification), approval, abort, busy devices.

Server tests run on SQLite and PostgreSQL with the controller ticking fast; devices are
simulated agents that poll and report through the real agent API (rolloutsim.py). Each
waits for what it expects with a generous bound, never a fixed sleep.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update
from typer.testing import CliRunner

from tests.server.conftest import BACKENDS, Server, ServerProcess, Tenant
from tests.server.rolloutsim import SimAgent, changed, initial, wait_for
from tests.server.test_dashboard import browser, csrf_of
from tests.server.test_notify import FAST, Receiver, receivers, route  # noqa: F401
from trueup.cli.main import app
from trueup.model.document import document_digest, parse_document
from trueup.server.db import Database
from trueup.server.keys import load_or_create_server_key
from trueup.server.service import ControlPlane
from trueup.server.service.rolloutplan import (
    Spec,
    Wave,
    assign_waves,
    evaluate,
    parse_spec,
    unavailable_limit,
)
from trueup.server.service.rolloutrows import take_lease
from trueup.server.tables import rollout_leases, rollouts
from trueup.server.tokens import Role

PARAMS = [(backend, {**FAST, "rollout_tick_seconds": 0.05}) for backend in BACKENDS]
API = "/api/v1/rollouts"
DIGEST = document_digest(parse_document(changed("edge-x")))


# -- pure: the spec, the waves, the gates ---------------------------------------------------


def test_waves_take_named_canaries_then_cumulative_percentages_of_the_rest() -> None:
    spec = parse_spec({"waves": [{"devices": ["d07"]}, {"percent": 50}, {"percent": 100}]})
    names = [f"d{i:02d}" for i in range(11)]
    waves, problems = assign_waves(spec, names)
    assert problems == []
    assert waves[0] == ["d07"]
    assert len(waves[1]) == 5 and len(waves[2]) == 5
    assert sorted(waves[0] + waves[1] + waves[2]) == names  # each device exactly once
    again, _ = assign_waves(spec, list(reversed(names)))
    assert again == waves  # deterministic, whatever the order given


def test_a_spec_that_leaves_devices_out_or_names_strangers_is_refused_by_path() -> None:
    spec = parse_spec({"waves": [{"devices": ["d1", "ghost"]}, {"percent": 50}]})
    _, problems = assign_waves(spec, ["d1", "d2", "d3", "d4"])
    assert "waves[0].devices: 'ghost' is not a target of the plan" in problems
    assert any(p.startswith("waves: 1 target(s) are in no wave") for p in problems), problems
    with pytest.raises(ValueError) as raised:
        parse_spec(
            {
                "waves": [{"percent": 0}, {"devices": []}, {"percent": 50, "selector": "a"}],
                "max_unavailable": "0%",
                "failure_budget": -1,
            }
        )
    problems = raised.value.args[0]
    assert "waves[0].percent: 0 is not an integer from 1 to 100" in problems
    assert "waves[1].devices: expected a non-empty list of device names" in problems
    assert "waves[2]: give exactly one of devices, selector, percent" in problems
    assert "max_unavailable: '0%' is not N or N% (1-100%)" in problems
    assert "failure_budget: -1 is not an integer from 0 to 1000000" in problems
    _, problems = assign_waves(parse_spec({"waves": [{"selector": "site=ams"}]}), ["d1"])
    assert problems[0].startswith("waves[0].selector: selectors need device labels")


def test_max_unavailable_as_a_number_or_a_share_of_the_wave() -> None:
    assert unavailable_limit(Spec(waves=(Wave(percent=100),), max_unavailable=3), 100) == 3
    assert unavailable_limit(Spec(waves=(Wave(percent=100),), max_unavailable="25%"), 10) == 3
    assert unavailable_limit(Spec(waves=(Wave(percent=100),), max_unavailable="25%"), 1) == 1


def _gates(report: dict[str, Any] | None, **kw: Any) -> Any:
    args: dict[str, Any] = {
        "digest": DIGEST,
        "sent_version": 2,
        "sent_at": 100.0,
        "now": 110.0,
        "report": report,
        "report_at": 105.0,
        "baseline": ["STATE_DRIFT_DETECTED"],
        "server_acked": [],
        "confirm_within": None,
        "gate_timeout": 60.0,
    }
    args.update(kw)
    return evaluate(**args)


GOOD = {"applied_digest": DIGEST, "management_ready": True, "reason_codes": []}


def test_gates_pass_only_with_the_digest_applied_management_ready_and_no_new_code() -> None:
    assert _gates(GOOD).verdict == "passed"
    assert _gates(GOOD, report_at=99.0).verdict == "waiting"  # the report predates the send
    assert _gates(GOOD, report_at=99.0, now=200.0).verdict == "failed"  # gate timeout
    assert _gates({**GOOD, "applied_digest": "sha256:" + "0" * 64}).verdict == "waiting"
    waiting = _gates({**GOOD, "management_ready": False})
    assert waiting.verdict == "waiting" and waiting.checks["management"] is False
    # A reason code that was there before the send is not new; one that is, waits...
    assert _gates({**GOOD, "reason_codes": ["STATE_DRIFT_DETECTED"]}).verdict == "passed"
    drift = {
        **GOOD,
        "reason_codes": ["STATE_VERSION_SKEW"],
        "findings": [{"code": "STATE_VERSION_SKEW", "subsystem": "dns"}],
    }
    assert "new reason codes: STATE_VERSION_SKEW" in _gates(drift, baseline=[]).reason
    # ... unless its subsystem is acknowledged, on the control plane or by the router.
    assert _gates(drift, baseline=[], server_acked=["dns"]).verdict == "passed"
    router_ack = {**drift, "acknowledgements": [{"subsystem": "dns", "state": "active"}]}
    assert _gates(router_ack, baseline=[]).verdict == "passed"
    failed = _gates({**GOOD, "reason_codes": ["STATE_PARTIAL_UPDATE"]}, baseline=[])
    assert failed.verdict == "failed" and "STATE_PARTIAL_UPDATE" in failed.reason


def test_a_confirmation_window_needs_the_agents_confirmation_and_a_rollback_fails() -> None:
    pending = {**GOOD, "confirmation": {"version": 2, "state": "pending", "deadline": "x"}}
    assert _gates(pending, confirm_within=30).verdict == "waiting"
    confirmed = {**GOOD, "confirmation": {"version": 2, "state": "confirmed"}}
    assert _gates(confirmed, confirm_within=30).verdict == "passed"
    other = {**GOOD, "confirmation": {"version": 1, "state": "confirmed"}}
    assert _gates(other, confirm_within=30).verdict == "waiting"
    back = {
        **GOOD,
        "confirmation": {"version": 2, "state": "rolled-back", "reason": "management lost"},
    }
    # The control plane's stored record (the audit log's rollback first) is the one read.
    audited = {"version": 2, "state": "rolled-back", "reason": "the audit log says so"}
    assert _gates(confirmed, confirm_within=30, confirmation=audited).verdict == "failed"
    gates = _gates(back, confirm_within=30)
    assert gates.verdict == "failed" and "rolled version 2 back by itself: management lost" in (
        gates.reason
    )


# -- on the server -----------------------------------------------------------------------------


@pytest.fixture
def fleet(isolated_server: Server) -> Iterator[Callable[[int], tuple[Tenant, list[SimAgent]]]]:
    def make(count: int) -> tuple[Tenant, list[SimAgent]]:
        names = [f"edge-{i:02d}" for i in range(count)]
        tenant = isolated_server.tenant("ro", devices=tuple(names))
        tenant_id = isolated_server.plane.tenant_id(tenant.name)
        agents = []
        for name in names:
            isolated_server.plane.put_desired(tenant_id, name, 0, initial(name), author="test")
            agent = SimAgent(isolated_server.client, name, tenant.devices[name])
            assert agent.poll()
            agents.append(agent)
        return tenant, agents

    yield make


def start(server: Server, tenant: Tenant, agents: list[SimAgent], **spec: Any) -> dict[str, Any]:
    body = {"targets": [{"device": a.device, "document": changed(a.device)} for a in agents]}
    response = server.client.post(API, json={**body, **spec}, headers=tenant.auth("operator"))
    assert response.status_code == 201, response.text
    return dict(response.json())


def status(server: Server, tenant: Tenant, rollout_id: int) -> dict[str, Any]:
    response = server.client.get(f"{API}/{rollout_id}", headers=tenant.auth("viewer"))
    assert response.status_code == 200, response.text
    return dict(response.json())


def versions(server: Server, tenant: Tenant, device: str) -> list[str]:
    """The content hash of each of the device's revisions, oldest first."""
    tenant_id = server.plane.tenant_id(tenant.name)
    return [r.content_hash for r in server.plane.revisions(tenant_id, device)]


def drive(
    server: Server,
    tenant: Tenant,
    agents: list[SimAgent],
    rollout_id: int,
    until: Callable[[dict[str, Any]], bool],
    behave: Any = None,
    watch: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Let the simulated agents take and report revisions until `until(status)`."""

    def done() -> dict[str, Any] | None:
        for agent in agents:
            agent.poll(behave)
        view = status(server, tenant, rollout_id)
        if watch is not None:
            watch(view)
        return view if until(view) else None

    return dict(wait_for(done, "the rollout's state"))


def audit_actions(server: Server, tenant: Tenant) -> list[str]:
    tenant_id = server.plane.tenant_id(tenant.name)
    return [e["action"] for e in server.plane.audit_entries(tenant_id, limit=10_000)]


@pytest.mark.parametrize("isolated_server", PARAMS, indirect=True)
def test_a_rollout_goes_wave_by_wave_never_more_than_max_unavailable_at_once(
    isolated_server: Server, fleet: Any
) -> None:
    server = isolated_server
    tenant, agents = fleet(7)
    waves = [{"devices": ["edge-03"]}, {"percent": 50}, {"percent": 100}]
    rollout = start(server, tenant, agents, waves=waves, max_unavailable=2, comment="mtu 1400")
    assert [w["members"] for w in rollout["waves"]] == [1, 3, 3]
    seen: list[tuple[int, int]] = []  # (wave, devices sent and not yet judged)

    def watch(view: dict[str, Any]) -> None:
        sent = [m for m in view["members"] if m["state"] == "sent"]
        seen.append((view["current_wave"], len(sent)))
        # nothing of a later wave is sent before the earlier one has finished
        assert all(m["wave"] == view["current_wave"] for m in sent), view

    final = drive(
        server, tenant, agents, rollout["id"], lambda v: v["state"] == "completed", watch=watch
    )
    assert max(n for _, n in seen) <= 2
    assert all(m["state"] == "passed" for m in final["members"])
    for agent in agents:
        expected = document_digest(parse_document(changed(agent.device)))
        assert versions(server, tenant, agent.device)[1:] == [expected]
    canary = next(m for m in final["members"] if m["device"] == "edge-03")
    first_of_wave_1 = min(m["sent_at"] for m in final["members"] if m["wave"] == 1)
    assert canary["finished_at"] <= first_of_wave_1
    actions = audit_actions(server, tenant)
    for action in (
        "rollout.start",
        "rollout.send",
        "rollout.gate",
        "rollout.wave",
        "rollout.complete",
    ):
        assert action in actions, (action, actions)
    assert server.plane.verify_audit() == []


@pytest.mark.parametrize("isolated_server", PARAMS, indirect=True)
def test_a_canary_that_rolls_back_pauses_the_rollout_is_put_back_and_notifies(
    isolated_server: Server,
    fleet: Any,
    receivers: Callable[[], Receiver],  # noqa: F811
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
def test_a_wave_that_needs_approval_waits_for_it(isolated_server: Server, fleet: Any) -> None:
    server = isolated_server
    tenant, agents = fleet(3)
    rollout = start(
        server,
        tenant,
        agents,
        waves=[{"devices": ["edge-01"]}, {"percent": 100}],
        approval=True,
    )
    waiting = drive(
        server, tenant, agents, rollout["id"], lambda v: v["state"] == "waiting-approval"
    )
    assert [m["state"] for m in waiting["members"] if m["wave"] == 1] == ["pending", "pending"]
    assert waiting["waves"][1]["state"] == "pending" and waiting["waves"][1]["approval"] is True
    approved = server.client.post(
        f"{API}/{rollout['id']}/approve", json={}, headers=tenant.auth("operator")
    )
    assert approved.status_code == 200, approved.text
    again = server.client.post(
        f"{API}/{rollout['id']}/approve", json={}, headers=tenant.auth("operator")
    )
    assert again.status_code == 409 and "running" in again.json()["detail"]
    final = drive(server, tenant, agents, rollout["id"], lambda v: v["state"] == "completed")
    assert all(m["state"] == "passed" for m in final["members"])
    assert "rollout.approve" in audit_actions(server, tenant)


@pytest.mark.parametrize("isolated_server", PARAMS, indirect=True)
def test_abort_puts_every_changed_device_back_and_frees_them(
    isolated_server: Server, fleet: Any
) -> None:
    server = isolated_server
    tenant, agents = fleet(3)
    rollout = start(
        server,
        tenant,
        agents,
        waves=[{"devices": ["edge-00", "edge-01"]}, {"percent": 100}],
        max_unavailable=2,
    )

    def quiet(device: str, version: int) -> dict[str, Any] | None:
        # edge-01 applies but reports without management: it stays sent, never passes
        return {"management_ready": False} if device == "edge-01" else None

    drive(
        server,
        tenant,
        agents,
        rollout["id"],
        lambda v: [m["state"] for m in v["members"]][:2] == ["passed", "sent"],
        quiet,
    )
    # Busy: a direct edit and a second rollout of the same device are refused, by name.
    busy = server.client.put(
        "/api/v1/devices/edge-02/desired",
        json=changed("edge-02", mtu=1300),
        headers={**tenant.auth("operator"), "If-Match": "1"},
    )
    assert busy.status_code == 409, busy.text
    assert busy.json()["rollout"] == rollout["id"]
    assert f"in rollout {rollout['id']} (running)" in busy.json()["detail"]
    second = server.client.post(
        API,
        json={"targets": [{"device": "edge-00", "document": changed("edge-00", mtu=1300)}]},
        headers=tenant.auth("operator"),
    )
    assert second.status_code == 409 and second.json()["devices"] == ["edge-00"]
    aborted = server.client.post(
        f"{API}/{rollout['id']}/abort",
        json={"reason": "wrong MTU"},
        headers=tenant.auth("operator"),
    )
    assert aborted.status_code == 200, aborted.text
    view = aborted.json()
    assert view["state"] == "aborted" and view["reason"] == "wrong MTU"
    states = {m["device"]: m["state"] for m in view["members"]}
    assert states == {"edge-00": "reverted", "edge-01": "reverted", "edge-02": "skipped"}
    for name in ("edge-00", "edge-01"):
        history = versions(server, tenant, name)
        assert len(history) == 3 and history[2] == history[0]
    assert len(versions(server, tenant, "edge-02")) == 1
    free = server.client.put(
        "/api/v1/devices/edge-02/desired",
        json=changed("edge-02", mtu=1300),
        headers={**tenant.auth("operator"), "If-Match": "1"},
    )
    assert free.status_code == 201, free.text
    assert "rollout.abort" in audit_actions(server, tenant)
    assert server.plane.verify_audit() == []


@pytest.mark.parametrize("isolated_server", PARAMS, indirect=True)
def test_a_device_edited_behind_the_rollout_fails_with_the_reason_and_is_not_overwritten(
    isolated_server: Server, fleet: Any
) -> None:
    server = isolated_server
    tenant, agents = fleet(2)
    tenant_id = server.plane.tenant_id(tenant.name)
    rollout = start(
        server, tenant, agents, waves=[{"devices": ["edge-00"]}, {"percent": 100}], approval=True
    )
    drive(server, tenant, agents, rollout["id"], lambda v: v["state"] == "waiting-approval")
    # A writer that does not ask the rollout (a direct insert) moves edge-01 on meanwhile.
    with server.plane.db.write() as conn:
        server.plane.desired_revisions.insert_revision(
            conn,
            tenant_id=tenant_id,
            device_id=server.plane.device_id(tenant_id, "edge-01"),
            device="edge-01",
            expected_version=1,
            document=parse_document(changed("edge-01", mtu=1280)),
            author="someone-else",
        )
    approved = server.client.post(
        f"{API}/{rollout['id']}/approve", json={}, headers=tenant.auth("operator")
    )
    assert approved.status_code == 200, approved.text
    final = drive(server, tenant, agents, rollout["id"], lambda v: v["state"] == "paused")
    edited = next(m for m in final["members"] if m["device"] == "edge-01")
    assert edited["state"] == "failed" and edited["sent_version"] is None
    assert (
        "its desired version is 2, not the version 1 the plan was made against"
        in (edited["reason"])
    )
    history = versions(server, tenant, "edge-01")
    assert len(history) == 2  # the other writer's revision stands; nothing was sent over it
    assert history[1] == document_digest(parse_document(changed("edge-01", mtu=1280)))


@pytest.mark.parametrize("isolated_server", PARAMS, indirect=True)
def test_a_device_whose_agent_lacks_a_section_the_change_uses_is_refused_never_sent(
    isolated_server: Server, fleet: Any
) -> None:
    server = isolated_server
    tenant, agents = fleet(3)
    old = agents[2]
    old.report(1, old.digest, {"agent_version": "0.0.9", "supported_sections": ["management"]})
    rollout = start(server, tenant, agents, max_unavailable=3)
    (refused,) = rollout["refused"]
    assert refused["device"] == "edge-02" and refused["kind"] == "agent-version"
    assert refused["problems"] == [
        "spec.interfaces: the desired revision uses this section; the agent does not support it"
    ]
    assert [m["device"] for m in rollout["members"]] == ["edge-00", "edge-01"]
    final = drive(server, tenant, agents[:2], rollout["id"], lambda v: v["state"] == "completed")
    assert all(m["state"] == "passed" for m in final["members"])
    assert len(versions(server, tenant, "edge-02")) == 1
    assert old.poll() is False  # nothing new was ever sent to it


@pytest.mark.parametrize("isolated_server", PARAMS, indirect=True)
def test_a_stale_plan_and_an_empty_change_are_refused_and_nothing_is_stored(
    isolated_server: Server, fleet: Any
) -> None:
    server = isolated_server
    tenant, _agents = fleet(2)
    stale = server.client.post(
        API,
        json={
            "targets": [{"device": "edge-00", "document": changed("edge-00"), "from_version": 0}]
        },
        headers=tenant.auth("operator"),
    )
    assert stale.status_code == 409, stale.text
    assert stale.json()["current_version"] == 1
    same = server.client.post(
        API,
        json={"targets": [{"device": "edge-00", "document": initial("edge-00")}]},
        headers=tenant.auth("operator"),
    )
    assert same.status_code == 422 and "nothing to roll out" in same.json()["problems"][0]
    bad = server.client.post(
        API,
        json={"targets": [{"device": "edge-00", "document": {"kind": "DeviceState"}}]},
        headers=tenant.auth("operator"),
    )
    assert bad.status_code == 422
    assert all(p.startswith("targets[0].document: ") for p in bad.json()["problems"])
    listed = server.client.get(API, headers=tenant.auth("viewer")).json()
    assert listed["count"] == 0


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


# -- the CLI ---------------------------------------------------------------------------------


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


# -- the dashboard ---------------------------------------------------------------------------


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
