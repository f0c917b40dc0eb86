"""End to end: a revision with a confirmation window, a real agent, a real control plane.

The server runs in the operator namespace (198.51.100.1); the agent in the
router namespace reaches it over mgmt0. A good revision stored with a 15 s
window is confirmed by the agent itself (management ready, the control plane
reached after the apply). A bad one — a firewall that drops new connections
to the management API and every packet to the control plane — is rolled back
by the agent by itself when the window passes: the management API answers a
client in the operator namespace again, and the fleet view says rolled-back,
with what the agent was still waiting for. So is a revision that removes the
management route, with the control plane and the client beyond the gateway.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from tests.routers import REPO, TRUEUP, Router, base_document

pytestmark = pytest.mark.root

PORT = 8791
MGMT_URL = "http://198.51.100.2:7443"
BEYOND = "192.0.2.1"  # the operator's network, reached through the management gateway
WINDOW = 15
EVENT_WAIT = 180.0  # generous: a loaded machine; each wait ends as soon as the event happens


def _server_cli(router: Router, db: str, *args: str) -> str:
    assert router.client is not None
    proc = subprocess.run(
        ["ip", "netns", "exec", router.client, *TRUEUP, "server", *args, "--db", db],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _firewall(*, bad: bool) -> dict[str, Any]:
    if bad:
        # New connections to the API dropped, and nothing reaches the control plane.
        chains = [
            {"name": "input", "type": "filter", "hook": "input", "priority": 0,
             "policy": "drop", "rules": ["ct state established,related accept"]},
            {"name": "output", "type": "filter", "hook": "output", "priority": 0,
             "policy": "accept", "rules": [f"ip daddr 198.51.100.1 tcp dport {PORT} drop"]},
        ]  # fmt: skip
    else:
        chains = [
            {"name": "input", "type": "filter", "hook": "input", "priority": 0,
             "policy": "accept", "rules": ["tcp dport 25 drop"]},
        ]  # fmt: skip
    return {"chains": chains}


def _document(**spec: Any) -> dict[str, Any]:
    return base_document(routes=[], **spec)


class ControlPlane:
    """A control plane in the operator namespace at `host`, and edge-01's agent managed by it."""

    def __init__(self, router: Router, host: str) -> None:
        self.router = router
        self.url = f"http://{host}:{PORT}"
        db = f"sqlite:///{router.workdir}/cp.db"
        _server_cli(router, db, "tenant", "create", "acme")
        created = _server_cli(
            router, db, "token", "create", "--tenant", "acme", "--user", "ops", "--role",
            "operator",
        )  # fmt: skip
        self.token = created.strip().splitlines()[-1].split()[-1]
        bundle = router.workdir / "bundle.json"
        _server_cli(
            router, db, "device", "enroll", "--tenant", "acme", "--device", "edge-01",
            "--url", self.url, "--out", str(bundle),
        )  # fmt: skip
        router.spawn_in_client(
            *TRUEUP, "server", "run", "--db", db, "--listen", f"{host}:{PORT}",
            log=router.workdir / "server.log",
        )  # fmt: skip
        router.wait_for(
            lambda: router.from_client(f"{self.url}/healthz")[0] == 200, what="control plane up"
        )
        router.ip("link", "set", "mgmt0", "up")
        router.ip("addr", "add", "198.51.100.2/24", "dev", "mgmt0")
        if host != "198.51.100.1":  # beyond the management gateway, as the installer routes it
            router.ip("route", "add", "default", "via", "198.51.100.1")
        fallback = router.write("fallback.yaml", base_document(interfaces=[], routes=[]))
        token_file = router.workdir / "device.token"
        enrolled = router.trueup(
            "agent", "enroll", "--bundle", str(bundle), "--token-file", str(token_file),
            state=False,
        )  # fmt: skip
        assert enrolled.returncode == 0, enrolled.stderr
        router.start_agent(
            "--management-fallback", str(fallback), "--control-plane", self.url,
            "--token-file", str(token_file), env={"TRUEUP_HEARTBEAT_SECONDS": "0.5"},
        )  # fmt: skip

    def put(self, expected: int, document: dict[str, Any], **headers: str) -> int:
        status, body = self.router.from_client(
            f"{self.url}/api/v1/devices/edge-01/desired",
            self.token,
            method="PUT",
            body=document,
            headers={"If-Match": str(expected), **headers},
        )
        assert status == 201, body
        return int(body["version"])

    def entry(self) -> dict[str, Any]:
        status, body = self.router.from_client(f"{self.url}/api/v1/devices/edge-01", self.token)
        assert status == 200, body
        return dict(body)

    def confirmation(self) -> dict[str, Any]:
        return self.entry().get("confirmation") or {}


def _on_router(router: Router, state: str, version: int) -> bool:
    record = router.api("/v1/status").get("confirmation") or {}
    return record.get("state") == state and record.get("version") == version


def _management_answers(router: Router) -> bool:
    status, body = router.from_client(f"{MGMT_URL}/v1/health/management", timeout=2)
    return status == 200 and isinstance(body, dict) and body.get("ready") is True


def test_a_good_window_is_confirmed_and_a_bad_one_rolls_back_by_itself(
    router_with_client: Router,
) -> None:
    router = router_with_client
    cp = ControlPlane(router, "198.51.100.1")

    # Revision 1: the first one, nothing to return to; applied as it is.
    assert cp.put(0, _document()) == 1
    router.wait_for(
        lambda: cp.entry().get("applied_version") == 1,
        what="revision 1 applied",
        timeout=EVENT_WAIT,
    )

    # Revision 2, good, with a window: the agent confirms it itself.
    window = {"X-Trueup-Confirm-Within": str(WINDOW)}
    assert cp.put(1, _document(firewall=_firewall(bad=False)), **window) == 2
    router.wait_for(
        lambda: (
            cp.confirmation().get("state") == "confirmed" and cp.confirmation().get("version") == 2
        ),
        what="revision 2 confirmed by the agent",
        timeout=EVENT_WAIT,
    )
    confirmed = cp.confirmation()
    assert "management ready and the control plane reached" in confirmed["reason"]
    assert router.api("/v1/status")["versions"]["applied"] == 2
    assert _management_answers(router)

    # Revision 3, bad, with a window: it cuts the API and the control plane off.
    assert cp.put(2, _document(firewall=_firewall(bad=True)), **window) == 3
    router.wait_for(
        lambda: _on_router(router, "pending", 3),
        what="revision 3 applied, pending",
        timeout=EVENT_WAIT,
    )
    ruleset = router.run("nft", "list", "table", "inet", "trueup").stdout
    assert f"dport {PORT} drop" in ruleset, ruleset
    pending = router.api("/v1/status")["confirmation"]
    assert pending["rollback_to"] == 2
    assert not _management_answers(router)  # the bad firewall cut the API off

    router.wait_for(
        lambda: _on_router(router, "rolled-back", 3),
        what="revision 3 rolled back",
        timeout=EVENT_WAIT,
    )
    status = router.api("/v1/status")
    assert status["versions"]["applied"] == 4 and status["versions"]["origin"] == "confirm-timeout"
    record = status["confirmation"]
    # Rolled back when its own window passed, not before.
    assert record["deadline"] == pytest.approx(pending["deadline"])
    # Both what it can see (the control plane not reached) and what it cannot (the API
    # from outside: left to an operator, who never came).
    assert "still waiting for: an operator's `trueup confirm`: " in record["reason"]
    assert "the control plane reached after the apply" in record["reason"]
    assert f"dport {PORT} drop" not in router.run("nft", "list", "table", "inet", "trueup").stdout

    # Management answers a client again, and the control plane hears about it.
    router.wait_for(
        lambda: _management_answers(router), what="management reachable", timeout=EVENT_WAIT
    )
    router.wait_for(
        lambda: cp.confirmation().get("state") == "rolled-back",
        what="the control plane told of the rollback",
        timeout=EVENT_WAIT,
    )
    shown = cp.confirmation()
    assert shown["version"] == 3 and shown["rollback_to"] == 2
    assert shown["rolled_back_to_version"] == 4
    assert "the control plane reached after the apply" in shown["reason"]
    entry = cp.entry()
    assert entry["applied_version"] == 4 and entry["applied_origin"] == "confirm-timeout"
    assert router.api("/v1/status")["versions"]["control_plane_applied"] == 3  # not pulled again


def _answers_from(router: Router, source: str) -> bool:
    """Whether the management API answers a client in the operator namespace at `source`
    (an address beyond the management gateway: the answer needs the router's route)."""
    assert router.client is not None
    script = (
        "import sys, httpx\n"
        "t = httpx.HTTPTransport(local_address=sys.argv[1])\n"
        "try:\n"
        "    r = httpx.Client(transport=t, timeout=2).get(sys.argv[2])\n"
        "    print(r.status_code)\n"
        "except Exception as e:\n"
        "    print(0)\n"
    )
    done = subprocess.run(
        ["ip", "netns", "exec", router.client, sys.executable, "-c", script, source,
         f"{MGMT_URL}/v1/health/management"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    return done.stdout.strip() == "200"


def test_a_revision_that_removes_the_management_route_rolls_back_by_itself(
    router_with_client: Router,
) -> None:
    router = router_with_client
    assert router.client is not None
    # The control plane and an operator's client sit beyond the management gateway.
    subprocess.run(
        ["ip", "-n", router.client, "addr", "add", f"{BEYOND}/32", "dev", "lo"], check=True
    )
    cp = ControlPlane(router, BEYOND)
    assert cp.put(0, _document()) == 1
    router.wait_for(
        lambda: cp.entry().get("applied_version") == 1,
        what="revision 1 applied",
        timeout=EVENT_WAIT,
    )
    assert _answers_from(router, BEYOND)

    routeless = _document()
    del routeless["spec"]["management"]["gateway"]
    window = {"X-Trueup-Confirm-Within": str(WINDOW)}
    assert cp.put(1, routeless, **window) == 2
    router.wait_for(
        lambda: _on_router(router, "pending", 2),
        what="revision 2 applied, pending",
        timeout=EVENT_WAIT,
    )
    assert "default via 198.51.100.1" not in router.ip("route", "show").stdout
    assert not _answers_from(router, BEYOND)  # management is cut off from beyond the gateway

    router.wait_for(
        lambda: _on_router(router, "rolled-back", 2),
        what="revision 2 rolled back",
        timeout=EVENT_WAIT,
    )
    assert "default via 198.51.100.1" in router.ip("route", "show").stdout
    router.wait_for(
        lambda: _answers_from(router, BEYOND),
        what="management reachable from beyond the gateway",
        timeout=EVENT_WAIT,
    )
    router.wait_for(
        lambda: cp.confirmation().get("state") == "rolled-back",
        what="the control plane told of the rollback",
        timeout=EVENT_WAIT,
    )
    shown = cp.confirmation()
    assert shown["version"] == 2 and shown["rollback_to"] == 1
    assert "the control plane reached after the apply" in shown["reason"]
    assert cp.entry()["applied_origin"] == "confirm-timeout"
