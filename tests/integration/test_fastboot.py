"""The fast path, from the client namespace: management answers before the full API, then the
full API takes the same listening socket over without a refused connection.

`TRUEUP_TEST_DELAY_FULL_API` (honoured only by `trueup.agent.fastboot`, for
tests) holds the full agent's imports back, so the early listener can be seen
on its own. No timing is asserted: only what answered, in which order.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.routers import TRUEUP, Router, base_document, sh

pytestmark = pytest.mark.root

MGMT_URL = "http://198.51.100.2:7443"
HEALTH = f"{MGMT_URL}/v1/health/management"
DELAY = {"TRUEUP_TEST_DELAY_FULL_API": "3"}

# Polls the management address from the client until the stop file exists:
# one JSON line per attempt (a fresh connection each time).
POLLER = r"""
import json, os, socket, sys, time
stop, out = sys.argv[1], open(sys.argv[2], "w", buffering=1)
request = b"GET /v1/health/management HTTP/1.1\r\nhost: r\r\nconnection: close\r\n\r\n"
while not os.path.exists(stop):
    line = {"t": time.monotonic()}
    try:
        with socket.create_connection(("198.51.100.2", 7443), timeout=1) as conn:
            conn.sendall(request)
            data = b""
            while chunk := conn.recv(65536):
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        line["status"] = int(head.split()[1])
        line["phase"] = json.loads(body).get("phase")
    except (OSError, ValueError, IndexError) as exc:
        line["error"] = type(exc).__name__
    out.write(json.dumps(line) + "\n")
    time.sleep(0.005)
"""


def _cold(router: Router) -> None:
    """The router as after a reboot: management link down, no address; the client forgets it."""
    assert router.client is not None
    applied = router.trueup("apply", str(router.write("v1.yaml", base_document())))
    assert applied.returncode == 0, applied.stderr
    router.ip("addr", "flush", "dev", "mgmt0")
    router.ip("link", "set", "mgmt0", "down")
    sh("ip", "-n", router.client, "neigh", "flush", "dev", "mgmt0p")


def _listening_inodes(router: Router) -> list[str]:
    """Inodes of the sockets listening on the management port (one socket, one inode)."""
    shown = sh("ip", "netns", "exec", router.name, "ss", "-Hltne", "sport", "=", ":7443")
    return re.findall(r"ino:(\d+)", shown.stdout)


def _audit(router: Router, event: str) -> list[dict[str, Any]]:
    lines = (router.state_dir / "audit.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["event"] == event]


def _health(router: Router) -> tuple[int, Any]:
    return router.from_client(HEALTH, timeout=2.0)


def test_early_listener_answers_then_the_full_api_takes_its_socket(
    router_with_client: Router, tmp_path: Path
) -> None:
    router = router_with_client
    _cold(router)
    stop, log = tmp_path / "stop-poller", tmp_path / "poller.jsonl"
    router.spawn_in_client(sys.executable, "-c", POLLER, str(stop), str(log))
    router.start_agent(env=DELAY, wait_ready=False, wait_started=False)

    # Management answers from the early listener while the full agent is held back.
    router.wait_for(lambda: _health(router)[0] == 200, what="200 from the client")
    status, body = _health(router)
    assert status == 200 and body["phase"] == "early" and body["ready"] is True
    assert body["addresses"] == ["198.51.100.2/24"] and body["missing"] == []
    assert router.addresses("mgmt0") == ["198.51.100.2/24"]
    assert "default via 198.51.100.1" in router.routes("main")
    # Everything else asks to retry (no token needed to be told so).
    status, answer = router.from_client(f"{MGMT_URL}/v1/status")
    assert (status, answer) == (503, {"message": "agent starting; retry"})
    early = _listening_inodes(router)
    assert len(early) == 1

    # The full API takes over the same listening socket.
    router.wait_for(
        lambda: _health(router)[1].get("phase") not in (None, "early"),
        what="the full API answering",
    )
    status, body = _health(router)
    assert status == 200 and body["ready"] is True and body["phase"] == "done"
    assert _listening_inodes(router) == early
    router.wait_for(router.started, what="startup phases done")
    stop.touch()
    time.sleep(0.2)

    lines = [json.loads(line) for line in log.read_text().splitlines()]
    answered = [i for i, line in enumerate(lines) if line.get("status") == 200]
    assert answered, lines[-5:]
    after = lines[answered[0] :]
    # From the first 200 on: every attempt answered, never refused, never dropped.
    assert [line for line in after if "error" in line] == []
    assert {line["status"] for line in after} == {200}
    phases = [line["phase"] for line in after]
    assert phases[0] == "early" and phases[-1] == "done"
    # Handed over once: early answers, then only the full API's.
    switch = phases.index("done")
    assert set(phases[:switch]) == {"early"} and set(phases[switch:]) == {"done"}

    # Phase 1 ran and found management done; the audit says who restored it.
    restored = _audit(router, "management_restored")
    assert restored and restored[-1]["details"]["fast_path"] == "management.json"
    assert any("add-address" in step for step in restored[-1]["details"]["steps"])
    startup = router.api("/v1/status")["agent"]["startup"]
    assert next(p for p in startup if p["name"] == "management")["state"] == "done"


def test_a_damaged_management_file_falls_back_to_the_applied_revision(
    router_with_client: Router,
) -> None:
    router = router_with_client
    _cold(router)
    (router.state_dir / "management.json").write_bytes(b'{"interface": "mgm\xff')
    router.start_agent(env=DELAY, wait_ready=False, wait_started=False)
    router.wait_for(lambda: _health(router)[0] == 200, what="200 from the client")
    router.wait_for(router.started, what="startup phases done")
    restored = _audit(router, "management_restored")
    assert restored[-1]["details"]["fast_path"] == "revision 1"


def test_a_second_agent_does_not_take_the_listeners(router_with_client: Router) -> None:
    router = router_with_client
    _cold(router)
    first = router.start_agent()
    before = _listening_inodes(router)
    second = router.run(*TRUEUP, "agent", "run", "--state-dir", str(router.state_dir))
    assert second.returncode == 1 and "another agent" in second.stderr
    assert _listening_inodes(router) == before and first.poll() is None
    assert _health(router)[0] == 200
