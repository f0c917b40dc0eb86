"""Two control-plane processes on PostgreSQL drive one rollout: SIGKILL the one holding its
lease mid-wave and the other takes over once the lease runs out; the rollout completes and
every device received the revision exactly once (no wave applied twice, no device skipped).

And on SQLite, a rollout survives a restart of its only process. The devices are
simulated agents polling and reporting through the real API of whichever process is alive.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from tests.server.conftest import ServerProcess, create_pg_database, drop_pg_database
from tests.server.rolloutsim import SimAgent, changed, initial, wait_for
from trueup.model.document import document_digest, parse_document
from trueup.server.db import Database
from trueup.server.keys import load_or_create_server_key
from trueup.server.service import ControlPlane
from trueup.server.tables import rollout_leases
from trueup.server.tokens import Role

LEASE_SECONDS = 3.0
DEVICES = 13


@pytest.fixture
def two_servers(tmp_path: Path) -> Iterator[tuple[ControlPlane, list[ServerProcess]]]:
    name = create_pg_database()
    url = f"postgresql://postgres@127.0.0.1:5432/{name}"
    key_file = tmp_path / "server.key"
    database = Database(url)
    database.migrate()
    plane = ControlPlane(database, load_or_create_server_key(key_file))  # no controller runs
    servers = [
        ServerProcess(
            url,
            key_file,
            revision_poll_seconds=0.2,
            auth_cache_seconds=0.0,
            rollout_tick_seconds=0.1,
            rollout_lease_seconds=LEASE_SECONDS,
            log_path=tmp_path / f"server-{i}.log",
        )
        for i in range(2)
    ]
    try:
        for server in servers:
            server.start()
        yield plane, servers
    finally:
        for server in servers:
            server.stop()
        database.dispose()
        drop_pg_database(name)


def holder_pid(plane: ControlPlane, rollout_id: int) -> int | None:
    with plane.db.read() as conn:
        holder = conn.execute(
            select(rollout_leases.c.holder).where(rollout_leases.c.rollout_id == rollout_id)
        ).scalar_one()
    parts = str(holder).split(":")
    return int(parts[-2]) if len(parts) >= 3 and parts[-2].isdigit() else None


def test_sigkill_of_the_lease_holder_mid_wave_hands_over_with_each_device_sent_once(
    two_servers: tuple[ControlPlane, list[ServerProcess]],
) -> None:
    plane, servers = two_servers
    tenant_id = plane.create_tenant("acme", "test")
    plane.create_user(tenant_id, "ops", Role.OPERATOR, "test")
    token = plane.create_token(tenant_id, "ops", "test")[1]
    ops = {"Authorization": f"Bearer {token}"}
    clients = {s.url: httpx.Client(base_url=s.url, timeout=30) for s in servers}
    names = [f"edge-{i:02d}" for i in range(DEVICES)]
    agents: list[SimAgent] = []
    try:
        for name in names:
            bundle = plane.enroll(tenant_id, name, "test", url=servers[0].url)
            answer = clients[servers[0].url].post(
                "/api/v1/agent/enroll", headers={"Authorization": f"Bearer {bundle['token']}"}
            )
            assert answer.status_code == 200, answer.text
            plane.put_desired(tenant_id, name, 0, initial(name), author="test")
            agent = SimAgent(clients[servers[1].url], name, answer.json()["credential"])
            assert agent.poll()
            agents.append(agent)
        started = clients[servers[0].url].post(
            "/api/v1/rollouts",
            json={
                "targets": [{"device": n, "document": changed(n)} for n in names],
                "waves": [{"devices": ["edge-00"]}, {"percent": 50}, {"percent": 100}],
                "max_unavailable": 2,
            },
            headers=ops,
        )
        assert started.status_code == 201, started.text
        rollout_id = int(started.json()["id"])

        def view() -> dict[str, Any]:
            return dict(plane.rollout(tenant_id, rollout_id))

        def mid_wave() -> bool:
            for agent in agents:
                current = view()
                if current["current_wave"] == 1 and any(
                    m["state"] == "sent" and m["wave"] == 1 for m in current["members"]
                ):
                    return True
                agent.poll()
            return False

        wait_for(mid_wave, "wave 1 under way")
        pid = holder_pid(plane, rollout_id)
        victim = next(s for s in servers if s.process is not None and s.process.pid == pid)
        survivor = next(s for s in servers if s is not victim)
        assert victim.process is not None
        os.kill(victim.process.pid, signal.SIGKILL)
        victim.process.wait(30)
        for agent in agents:
            agent.client = clients[survivor.url]

        def completed() -> dict[str, Any] | None:
            for agent in agents:
                agent.poll()
            current = view()
            return current if current["state"] == "completed" else None

        final = wait_for(completed, "the rollout to complete on the surviving process")
        assert survivor.process is not None
        assert holder_pid(plane, rollout_id) == survivor.process.pid
    finally:
        for client in clients.values():
            client.close()
    assert all(m["state"] == "passed" for m in final["members"]), final["members"]
    assert [w["members"] for w in final["waves"]] == [1, 6, 6]
    sent_by_audit: list[str] = []
    for entry in plane.audit_entries(tenant_id, limit=10_000):
        if entry["action"] == "rollout.send":
            detail = entry["detail"]
            detail = json.loads(detail) if isinstance(detail, str) else detail
            sent_by_audit.extend(item["device"] for item in detail["sent"])
    assert sorted(sent_by_audit) == names  # each device sent exactly once
    for agent in agents:
        revisions = plane.revisions(tenant_id, agent.device)
        assert [r.version for r in revisions] == [1, 2], agent.device
        assert revisions[1].content_hash == document_digest(parse_document(changed(agent.device)))
        assert agent.received == [1, 2]
    assert plane.verify_audit() == []


def test_a_rollout_survives_a_restart_of_its_only_control_plane_process(tmp_path: Path) -> None:
    """SQLite, one process: stopped mid-rollout and started again, it carries on where the
    database says it was (the lease handed over on stop), and completes."""
    url, key_file = f"sqlite:///{tmp_path}/server.db", tmp_path / "server.key"
    database = Database(url)
    database.migrate()
    plane = ControlPlane(database, load_or_create_server_key(key_file))
    tenant_id = plane.create_tenant("acme", "test")
    plane.create_user(tenant_id, "ops", Role.OPERATOR, "test")
    ops = {"Authorization": f"Bearer {plane.create_token(tenant_id, 'ops', 'test')[1]}"}
    server = ServerProcess(url, key_file, rollout_tick_seconds=0.1, auth_cache_seconds=0.0)
    server.start()
    client = httpx.Client(base_url=server.url, timeout=30)
    try:
        agents = []
        for name in ("edge-00", "edge-01", "edge-02"):
            bundle = plane.enroll(tenant_id, name, "test", url=server.url)
            answer = client.post(
                "/api/v1/agent/enroll", headers={"Authorization": f"Bearer {bundle['token']}"}
            )
            assert answer.status_code == 200, answer.text
            plane.put_desired(tenant_id, name, 0, initial(name), author="test")
            agents.append(SimAgent(client, name, answer.json()["credential"]))
            assert agents[-1].poll()
        started = client.post(
            "/api/v1/rollouts",
            json={
                "targets": [{"device": a.device, "document": changed(a.device)} for a in agents],
                "waves": [{"devices": ["edge-00"]}, {"percent": 100}],
            },
            headers=ops,
        )
        assert started.status_code == 201, started.text
        rollout_id = int(started.json()["id"])
        wait_for(
            lambda: plane.rollout(tenant_id, rollout_id)["members"][0]["state"] == "sent",
            "the canary sent",
        )
        server.stop()  # mid-wave: the canary sent, not yet judged
        assert holder_pid(plane, rollout_id) is not None
        server.start()
        client.close()
        client = httpx.Client(base_url=server.url, timeout=30)
        for agent in agents:
            agent.client = client

        def completed() -> bool:
            for agent in agents:
                agent.poll()
            return bool(plane.rollout(tenant_id, rollout_id)["state"] == "completed")

        wait_for(completed, "the rollout to complete after the restart")
        assert server.process is not None
        assert holder_pid(plane, rollout_id) == server.process.pid
        for agent in agents:
            assert [r.version for r in plane.revisions(tenant_id, agent.device)] == [1, 2]
    finally:
        client.close()
        server.stop()
        database.dispose()
