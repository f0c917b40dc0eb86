"""Simulated agents for the rollout tests: each polls its desired revision through the real
agent API and reports it applied (or failed, rolled back, without management) through the
real report API, the way a router's agent does. Also what the rollout tests share: the
`fleet` fixture (enrolled devices on revision 1) and start, status, drive, versions."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.server.conftest import BACKENDS, Server, Tenant, document
from tests.server.test_notify import FAST

# The rollout tests' servers, on both databases, with the controller ticking fast.
PARAMS = [(backend, {**FAST, "rollout_tick_seconds": 0.05}) for backend in BACKENDS]
API = "/api/v1/rollouts"

# What a device does with a revision: None applies it cleanly; a dict is merged into the
# report (reason codes, management_ready False, a confirmation record, ...).
Behaviour = Callable[[str, int], dict[str, Any] | None]


def initial(device: str) -> dict[str, Any]:
    return document(device, address="198.51.100.2/24")


def changed(device: str, mtu: int = 1400) -> dict[str, Any]:
    """The change the tests roll out: an interface MTU."""
    return document(
        device,
        address="198.51.100.2/24",
        interfaces=[{"name": "lan0", "state": "up", "mtu": mtu, "addresses": ["203.0.113.1/24"]}],
    )


@dataclass
class SimAgent:
    client: Any  # a TestClient or an httpx.Client with base_url
    device: str
    credential: str
    applied: int = 0
    digest: str | None = None
    received: list[int] = field(default_factory=list)

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.credential}"}

    def report(self, version: int, digest: str | None, extra: dict[str, Any] | None) -> None:
        body: dict[str, Any] = {
            "applied_version": version or None,
            "applied_digest": digest,
            "applied_origin": "control-plane" if version else None,
            "management_ready": True,
            "reason_codes": [],
            "heartbeat_interval": 30.0,
            "journal": {"last": {"version": version, "state": "commit", "outcome": "committed"}},
            **(extra or {}),
        }
        response = self.client.post("/api/v1/agent/report", json=body, headers=self.headers())
        assert response.status_code == 200, response.text

    def poll(self, behave: Behaviour | None = None) -> bool:
        """Take a newer revision if there is one and report; True when one came."""
        response = self.client.get(
            "/api/v1/agent/desired",
            params={"after": self.applied, "wait": 0},
            headers=self.headers(),
        )
        if response.status_code == 204:
            return False
        assert response.status_code == 200, response.text
        revision = response.json()
        version, digest = int(revision["version"]), str(revision["content_hash"])
        self.received.append(version)
        extra = behave(self.device, version) if behave is not None else None
        self.applied, self.digest = version, digest
        self.report(version, digest, extra)
        return True


def wait_for(condition: Callable[[], Any], what: str, timeout: float = 180.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


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
