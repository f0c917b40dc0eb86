"""Simulated agents for the rollout tests: each polls its desired revision through the real
agent API and reports it applied (or failed, rolled back, without management) through the
real report API, the way a router's agent does."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.server.conftest import document

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
