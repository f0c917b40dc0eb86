"""Management from another host's point of view: readiness from facts, announced addresses."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.routers import Router, base_document, sh

pytestmark = pytest.mark.root

MGMT_URL = "http://198.51.100.2:7443"


@pytest.fixture
def parking(router_with_client: Router) -> Iterator[str]:
    """A namespace to hold the router's management link while it is 'not there yet'."""
    name = f"{router_with_client.name}-park"
    sh("ip", "netns", "add", name)
    try:
        yield name
    finally:
        sh("ip", "netns", "del", name, check=False)


def _health(router: Router) -> tuple[int, Any]:
    return router.from_client(f"{MGMT_URL}/v1/health/management", timeout=2.0)


def test_a_late_management_link_becomes_ready_and_readiness_follows_facts(
    router_with_client: Router, parking: str
) -> None:
    router = router_with_client
    applied = router.trueup("apply", str(router.write("v1.yaml", base_document())))
    assert applied.returncode == 0, applied.stderr
    router.ip("addr", "flush", "dev", "mgmt0")
    router.ip("link", "set", "mgmt0", "netns", parking)  # the NIC is not there at boot
    router.start_agent(env={"TRUEUP_RESYNC_SECONDS": "1"}, wait_ready=False, wait_started=False)
    router.wait_for(lambda: "ready" in router.api("/v1/health/management"), what="API up")
    health = router.api("/v1/health/management")
    assert health["ready"] is False and "mgmt0 is absent" in health["reason"]

    time.sleep(2)  # the link appears two seconds after the agent started
    sh("ip", "-n", parking, "link", "set", "mgmt0", "netns", router.name)
    router.wait_for(lambda: _health(router)[0] == 200, what="ready from the client")
    _, body = _health(router)
    assert body["ready"] is True  # from facts, whatever phase 1's outcome was

    # Losing an address makes it not ready with the reason; healing makes it ready.
    # Management is never acknowledged: `notify` lets the test see it lost before it heals.
    refused = router.trueup("ack", "management", "--for", "1h", "--reason", "test")
    assert refused.returncode != 0 and "always restores" in refused.stderr
    notify = base_document(convergence={"default": "auto", "subsystems": {"management": "notify"}})
    applied = router.trueup("apply", str(router.write("v2.yaml", notify)))
    assert applied.returncode == 0, applied.stderr
    router.ip("addr", "del", "198.51.100.2/24", "dev", "mgmt0")
    health = router.api("/v1/health/management")
    assert health["ready"] is False and "missing 198.51.100.2/24" in health["reason"]
    assert router.trueup("reconcile", "--subsystem", "management").returncode == 0
    router.wait_for(lambda: _health(router)[0] == 200, what="ready again")


def test_the_management_address_is_announced_to_neighbours(router_with_client: Router) -> None:
    router = router_with_client
    assert router.client is not None
    mac = router.ip_json("link", "show", "dev", "mgmt0")[0]["address"]
    # The client remembers another MAC for the address (a swapped router).
    sh(
        "ip", "-n", router.client, "neigh", "replace", "198.51.100.2",
        "lladdr", "02:00:00:00:00:99", "dev", "mgmt0p", "nud", "stale",
    )  # fmt: skip

    def client_mac() -> str | None:
        shown = sh("ip", "-n", router.client or "", "-j", "neigh", "show", "198.51.100.2")
        entries = json.loads(shown.stdout or "[]")
        return entries[0].get("lladdr") if entries else None

    assert client_mac() == "02:00:00:00:00:99"
    config = router.write("desired.yaml", base_document())
    router.start_agent("--config", str(config))
    # Nothing was sent by the client: only the router's announcement can fix its entry.
    router.wait_for(lambda: client_mac() == mac, what="the client learnt the router's MAC")


def test_an_agent_started_with_nothing_accepted_opens_its_port_with_the_first_revision(
    router_with_client: Router,
) -> None:
    router = router_with_client
    router.start_agent(wait_ready=False, wait_started=False)
    router.wait_for(lambda: "ready" in router.api("/v1/health/management"), what="socket up")
    assert router.api("/v1/health/management")["ready"] is False
    applied = router.trueup("apply", str(router.write("v1.yaml", base_document())))
    assert applied.returncode == 0, applied.stderr
    router.wait_for(lambda: _health(router)[0] == 200, what="management port from the client")
