"""End to end: a revision with a confirmation window, a real agent, a real control plane.

The server runs in the operator namespace (198.51.100.1); the agent in the
router namespace reaches it over mgmt0. A good revision stored with a 15 s
window is confirmed by the agent itself (management ready, the control plane
reached after the apply). A bad one — a firewall that drops new connections
to the management API and every packet to the control plane — is rolled back
by the agent by itself when the window passes: the management API answers a
client in the operator namespace again, and the fleet view says rolled-back,
with what the agent was still waiting for.
"""

from __future__ import annotations

import os
import subprocess
from typing import Any

import pytest

from tests.routers import REPO, TRUEUP, Router, base_document

pytestmark = pytest.mark.root

PORT = 8791
URL = f"http://198.51.100.1:{PORT}"
MGMT_URL = "http://198.51.100.2:7443"
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


def _put(
    router: Router, token: str, expected: int, document: dict[str, Any], **headers: str
) -> int:
    status, body = router.from_client(
        f"{URL}/api/v1/devices/edge-01/desired",
        token,
        method="PUT",
        body=document,
        headers={"If-Match": str(expected), **headers},
    )
    assert status == 201, body
    return int(body["version"])


def _entry(router: Router, token: str) -> dict[str, Any]:
    status, body = router.from_client(f"{URL}/api/v1/devices/edge-01", token)
    assert status == 200, body
    return dict(body)


def _confirmation(router: Router, token: str) -> dict[str, Any]:
    return _entry(router, token).get("confirmation") or {}


def _management_answers(router: Router) -> bool:
    status, body = router.from_client(f"{MGMT_URL}/v1/health/management", timeout=2)
    return status == 200 and isinstance(body, dict) and body.get("ready") is True


def test_a_good_window_is_confirmed_and_a_bad_one_rolls_back_by_itself(
    router_with_client: Router,
) -> None:
    router = router_with_client
    db = f"sqlite:///{router.workdir}/cp.db"
    _server_cli(router, db, "tenant", "create", "acme")
    created = _server_cli(
        router, db, "token", "create", "--tenant", "acme", "--user", "ops", "--role", "operator"
    )
    token = created.strip().splitlines()[-1].split()[-1]
    bundle = router.workdir / "bundle.json"
    _server_cli(
        router, db, "device", "enroll", "--tenant", "acme", "--device", "edge-01",
        "--url", URL, "--out", str(bundle),
    )  # fmt: skip
    router.spawn_in_client(
        *TRUEUP, "server", "run", "--db", db, "--listen", f"198.51.100.1:{PORT}",
        log=router.workdir / "server.log",
    )  # fmt: skip
    router.wait_for(lambda: router.from_client(f"{URL}/healthz")[0] == 200, what="control plane up")

    router.ip("link", "set", "mgmt0", "up")
    router.ip("addr", "add", "198.51.100.2/24", "dev", "mgmt0")
    fallback = router.write("fallback.yaml", base_document(interfaces=[], routes=[]))
    token_file = router.workdir / "device.token"
    enrolled = router.trueup(
        "agent", "enroll", "--bundle", str(bundle), "--token-file", str(token_file), state=False
    )
    assert enrolled.returncode == 0, enrolled.stderr
    router.start_agent(
        "--management-fallback", str(fallback), "--control-plane", URL,
        "--token-file", str(token_file), env={"TRUEUP_HEARTBEAT_SECONDS": "0.5"},
    )  # fmt: skip

    # Revision 1: the first one, nothing to return to; applied as it is.
    assert _put(router, token, 0, _document()) == 1
    router.wait_for(
        lambda: _entry(router, token).get("applied_version") == 1,
        what="revision 1 applied",
        timeout=EVENT_WAIT,
    )

    # Revision 2, good, with a window: the agent confirms it itself.
    window = {"X-Trueup-Confirm-Within": str(WINDOW)}
    assert _put(router, token, 1, _document(firewall=_firewall(bad=False)), **window) == 2
    router.wait_for(
        lambda: (
            _confirmation(router, token).get("state") == "confirmed"
            and _confirmation(router, token).get("version") == 2
        ),
        what="revision 2 confirmed by the agent",
        timeout=EVENT_WAIT,
    )
    confirmed = _confirmation(router, token)
    assert "management ready and the control plane reached" in confirmed["reason"]
    assert router.api("/v1/status")["versions"]["applied"] == 2
    assert _management_answers(router)

    # Revision 3, bad, with a window: it cuts the API and the control plane off.
    assert _put(router, token, 2, _document(firewall=_firewall(bad=True)), **window) == 3

    def pending_on_the_router() -> bool:
        record = router.api("/v1/status").get("confirmation") or {}
        return record.get("state") == "pending" and record.get("version") == 3

    router.wait_for(pending_on_the_router, what="revision 3 applied, pending", timeout=EVENT_WAIT)
    ruleset = router.run("nft", "list", "table", "inet", "trueup").stdout
    assert f"dport {PORT} drop" in ruleset, ruleset
    pending = router.api("/v1/status")["confirmation"]
    assert pending["rollback_to"] == 2
    assert not _management_answers(router)  # the bad firewall cut the API off

    def rolled_back_on_the_router() -> bool:
        record = router.api("/v1/status").get("confirmation") or {}
        return record.get("state") == "rolled-back" and record.get("version") == 3

    router.wait_for(rolled_back_on_the_router, what="revision 3 rolled back", timeout=EVENT_WAIT)
    status = router.api("/v1/status")
    assert status["versions"]["applied"] == 4 and status["versions"]["origin"] == "confirm-timeout"
    record = status["confirmation"]
    # Rolled back when its own window passed, not before.
    assert record["deadline"] == pytest.approx(pending["deadline"])
    assert "still waiting for: the control plane reached after the apply" in record["reason"]
    assert f"dport {PORT} drop" not in router.run("nft", "list", "table", "inet", "trueup").stdout

    # Management answers a client again, and the control plane hears about it.
    router.wait_for(
        lambda: _management_answers(router), what="management reachable", timeout=EVENT_WAIT
    )
    router.wait_for(
        lambda: _confirmation(router, token).get("state") == "rolled-back",
        what="the control plane told of the rollback",
        timeout=EVENT_WAIT,
    )
    shown = _confirmation(router, token)
    assert shown["version"] == 3 and shown["rollback_to"] == 2
    assert shown["rolled_back_to_version"] == 4
    assert "the control plane reached after the apply" in shown["reason"]
    entry = _entry(router, token)
    assert entry["applied_version"] == 4 and entry["applied_origin"] == "confirm-timeout"
    assert router.api("/v1/status")["versions"]["control_plane_applied"] == 3  # not pulled again
