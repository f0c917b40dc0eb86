"""Rollouts on the control plane: waves and max_unavailable, approval, abort, busy devices,
edits behind a rollout, refused and stale targets.

Each test runs on SQLite and PostgreSQL with the controller ticking fast; devices are
simulated agents that poll and report through the real agent API (rolloutsim.py). Each
waits for what it expects with a generous bound, never a fixed sleep.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.server.conftest import Server
from tests.server.rolloutsim import (
    API,
    PARAMS,
    audit_actions,
    changed,
    drive,
    fleet,
    initial,
    start,
    versions,
)
from trueup.model.document import document_digest, parse_document

__all__ = ["fleet"]  # a fixture, used by name


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
def test_of_concurrent_rollouts_over_one_device_exactly_one_starts(
    isolated_server: Server, fleet: Any
) -> None:
    server = isolated_server
    tenant, _agents = fleet(3)
    writers = 6
    barrier = threading.Barrier(writers)

    def attempt(i: int) -> int:
        other = "edge-00" if i % 2 else "edge-02"  # each overlaps every other on edge-01
        body = {
            "targets": [
                {"device": "edge-01", "document": changed("edge-01", mtu=1300 + i)},
                {"device": other, "document": changed(other, mtu=1300 + i)},
            ]
        }
        barrier.wait()
        response = server.client.post(API, json=body, headers=tenant.auth("operator"))
        return response.status_code

    with ThreadPoolExecutor(writers) as pool:
        statuses = sorted(pool.map(attempt, range(writers)))
    assert statuses == [201] + [409] * (writers - 1), statuses
    assert server.client.get(API, headers=tenant.auth("viewer")).json()["count"] == 1


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
