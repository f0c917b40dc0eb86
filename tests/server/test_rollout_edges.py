"""Rollouts at their edges: a publish racing a rollout over the same device, a device that
regresses during the soak in a way that is not a failed apply, and the like.

Each test runs on SQLite and PostgreSQL with the controller ticking fast; devices are the
simulated agents of rolloutsim.py. Waits have generous bounds, never fixed sleeps.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.server.conftest import Server
from tests.server.rolloutsim import API, PARAMS, changed, drive, fleet, start
from tests.server.test_profiles import profile, put_profile

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
