"""End to end: a profile change rolled out over real agents and a simulated fleet.

The control plane runs in an operator namespace on a bridge (198.51.100.1/24); three
routers (real agents, each in its own namespace) reach it over mgmt0; 200 simulated
devices (tests/integration/fleetsim.py, in the operator namespace) poll and report
through the agent API as agents do. Every device is labelled and has stored inputs.

1. A profile adding a firewall rule is rolled out from the fleet plan in three waves —
   a real canary, 50 %, the rest — with a confirmation window: every real kernel has
   the rule, every device passed its gates, the rollout completed, and the audit log
   has each step. A simulated device whose agent lacks the firewall section is refused
   in `trueup fleet plan` (exit 1) and by the rollout, and never sent anything.
2. A profile whose firewall cuts the agents off their API and the control plane: the
   real canary rolls it back by itself when its window passes (its API answers from
   the operator namespace again), the rollout pauses after the canary wave, no device
   of a later wave got a revision, and a loopback webhook receives `rollout_paused`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.routers import REPO, TRUEUP, Router, require_root, sh

pytestmark = pytest.mark.root

PORT = 8797
HOOK_PORT = 8798
URL = f"http://198.51.100.1:{PORT}"
SIMULATED = 200
OLD = "sim-007"  # its agent lacks the firewall section
WINDOW = 20  # each revision's confirmation window, s (room for a loaded machine)
EVENT_WAIT = 240.0  # generous: a loaded machine; each wait ends as soon as the event happens
REAL = ("edge-r0", "edge-r1", "edge-r2")
CANARY = "edge-r1"


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = EVENT_WAIT) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


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


def _profile(*, bad: bool) -> dict[str, Any]:
    return {
        "apiVersion": "trueup/v1",
        "kind": "Profile",
        "metadata": {"name": "edge-firewall", "description": "the edge routers' firewall"},
        "spec": {"selector": "role=edge", "document": {"firewall": _firewall(bad=bad)}},
    }


HOOK = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with open(sys.argv[2], "ab") as f:
            f.write(body.replace(b"\\n", b" ") + b"\\n")
        self.send_response(200); self.end_headers()
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


class Fleet:
    """The operator namespace (control plane, simulator, webhook receiver) and 3 routers."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.op = f"tu-{os.getpid()}-op"
        self.procs: list[subprocess.Popen[str]] = []
        self.routers: list[Router] = []
        sh("ip", "netns", "add", self.op)
        self.op_ip("link", "set", "lo", "up")
        self.op_ip("link", "add", "br0", "type", "bridge")
        self.op_ip("addr", "add", "198.51.100.1/24", "dev", "br0")
        self.op_ip("link", "set", "br0", "up")
        for i, _name in enumerate(REAL):
            (workdir / f"r{i}").mkdir()
            router = Router(workdir / f"r{i}")
            self.routers.append(router)
            router.ip("link", "set", "mgmt0p", "name", f"r{i}m")
            router.ip("link", "set", f"r{i}m", "netns", self.op)
            self.op_ip("link", "set", f"r{i}m", "master", "br0")
            self.op_ip("link", "set", f"r{i}m", "up")
            router.client = self.op  # from_client: requests from the operator namespace
        self.db = f"sqlite:///{workdir}/cp.db"
        self.server_cli("tenant", "create", "acme")
        self.token = self._token("ops", "operator")
        self.admin = self._token("root", "admin")
        self.token_file = workdir / "operator.token"
        self.token_file.write_text(self.token + "\n")
        self.admin_file = workdir / "admin.token"
        self.admin_file.write_text(self.admin + "\n")

    # -- plumbing -------------------------------------------------------------------------
    def op_ip(self, *args: str) -> None:
        sh("ip", "-n", self.op, *args)

    def server_cli(self, *args: str) -> str:
        done = subprocess.run(
            [*TRUEUP, "server", *args, "--db", self.db],
            capture_output=True, text=True, check=False, env=_env(), timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout

    def _token(self, user: str, role: str) -> str:
        created = self.server_cli(
            "token", "create", "--tenant", "acme", "--user", user, "--role", role
        )
        return created.strip().splitlines()[-1].split()[-1]

    def spawn(self, *argv: str, log: str) -> subprocess.Popen[str]:
        out = open(self.workdir / log, "w")  # noqa: SIM115
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.op, *argv],
            stdout=out, stderr=subprocess.STDOUT, text=True, env=_env(),
        )  # fmt: skip
        self.procs.append(proc)
        return proc

    def op_run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ip", "netns", "exec", self.op, *argv],
            capture_output=True, text=True, check=False, env=_env(), timeout=180,
        )  # fmt: skip

    def call(self, method: str, path: str, body: Any = None, token: str | None = None,
             **headers: str) -> tuple[int, Any]:  # fmt: skip
        return self.routers[0].from_client(
            f"{URL}{path}", token or self.token, timeout=60, method=method, body=body,
            headers=headers,
        )  # fmt: skip

    def ok(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        status, answer = self.call(method, path, body, **kw)
        assert 200 <= status < 300, (method, path, status, answer)
        return answer

    def close(self) -> None:
        for router in self.routers:
            router.stop_agents()
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        for router in self.routers:
            router.close()
        sh("ip", "netns", "del", self.op, check=False)

    # -- the fleet ------------------------------------------------------------------------
    def devices(self) -> dict[str, dict[str, Any]]:
        body = self.ok("GET", "/api/v1/devices")
        return {d["device"]: d for d in body["devices"]}

    def rollout(self, rollout_id: int) -> dict[str, Any]:
        return dict(self.ok("GET", f"/api/v1/rollouts/{rollout_id}"))

    def audit(self) -> list[dict[str, Any]]:
        return list(self.ok("GET", "/api/v1/audit?limit=10000", token=self.admin)["entries"])

    def start(self) -> None:
        self.spawn(
            *TRUEUP, "server", "run", "--db", self.db, "--listen", f"198.51.100.1:{PORT}",
            "--notify-retry-base", "0.2", log="server.log",
        )  # fmt: skip
        wait_for(lambda: self.call("GET", "/healthz")[0] == 200, "control plane up")
        for i, (name, router) in enumerate(zip(REAL, self.routers, strict=True)):
            self.start_router(i, name, router)
        sim = self.spawn(
            sys.executable, "-m", "tests.integration.fleetsim", URL, str(self.admin_file),
            str(self.workdir), "--devices", str(SIMULATED), "--old", OLD, log="fleetsim.log",
        )  # fmt: skip
        ready = self.workdir / "fleetsim.ready"

        def enrolled() -> bool:
            assert sim.poll() is None, (self.workdir / "fleetsim.log").read_text()
            return ready.exists()

        wait_for(enrolled, "the simulated devices enrolled")

    def start_router(self, i: int, name: str, router: Router) -> None:
        address = f"198.51.100.{2 + i}/24"
        bundle = router.workdir / "bundle.json"
        self.server_cli(
            "device", "enroll", "--tenant", "acme", "--device", name, "--url", URL,
            "--out", str(bundle),
        )  # fmt: skip
        self.ok("PUT", f"/api/v1/devices/{name}/labels", {"site": "lab", "role": "edge"})
        own = {
            "management": {"interface": "mgmt0", "addresses": [address]},
            "interfaces": [{"name": "lan0", "addresses": [f"203.0.113.{1 + i}/24"]}],
        }
        self.ok(
            "PUT", f"/api/v1/devices/{name}/variables", {"variables": {}, "own": own},
            **{"If-Match": "0"},
        )  # fmt: skip
        router.ip("link", "set", "mgmt0", "up")
        router.ip("addr", "add", address, "dev", "mgmt0")
        fallback = router.write(
            "fallback.yaml",
            {"apiVersion": "trueup/v1", "kind": "DeviceState", "metadata": {"device": name},
             "spec": {"management": own["management"]}},
        )  # fmt: skip
        token_file = router.workdir / "device.token"
        enrolled = router.trueup(
            "agent", "enroll", "--bundle", str(bundle), "--token-file", str(token_file),
            state=False,
        )  # fmt: skip
        assert enrolled.returncode == 0, enrolled.stderr
        router.start_agent(
            "--management-fallback", str(fallback), "--control-plane", URL,
            "--token-file", str(token_file), env={"TRUEUP_HEARTBEAT_SECONDS": "1"},
        )  # fmt: skip


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    require_root()
    made = Fleet(tmp_path)
    try:
        yield made
    finally:
        made.close()


def _ruleset(router: Router) -> str:
    return router.run("nft", "list", "table", "inet", "trueup").stdout


def _in_sync(fleet: Fleet, count: int) -> bool:
    entries = fleet.devices()
    return len(entries) == count and all(
        e["desired_version"] and e["applied_version"] == e["desired_version"]
        for e in entries.values()
    )


def _management_answers(address: str, fleet: Fleet) -> bool:
    status, body = fleet.routers[0].from_client(
        f"http://{address}:7443/v1/health/management", timeout=2
    )
    return status == 200 and isinstance(body, dict) and body.get("ready") is True


def _on_router(router: Router, state: str, version: int) -> bool:
    record = router.api("/v1/status").get("confirmation") or {}
    return record.get("state") == state and record.get("version") == version


def test_a_profile_rolled_out_in_waves_then_a_bad_canary_stops_it(fleet: Fleet) -> None:
    fleet.start()
    total = SIMULATED + len(REAL)
    published = fleet.ok("POST", "/api/v1/plan/publish", {"comment": "initial documents"})
    assert len(published["published"]) == total, published["refused"]
    wait_for(lambda: _in_sync(fleet, total), "every device applied its first revision")
    for i, router in enumerate(fleet.routers):
        assert router.addresses("lan0") == [f"203.0.113.{1 + i}/24"]

    # -- 1. a good change, three waves --------------------------------------------------
    stored = fleet.ok("PUT", "/api/v1/profiles/edge-firewall", _profile(bad=False),
                      **{"If-Match": "0"})  # fmt: skip
    assert stored["version"] == 1
    planned = fleet.op_run(
        *TRUEUP, "fleet", "plan", "--server", URL, "--token-file", str(fleet.token_file)
    )
    assert planned.returncode == 1, planned.stdout + planned.stderr
    assert f"{OLD}: REFUSED (agent-version)" in planned.stdout
    assert "spec.firewall: the desired revision uses this section" in planned.stdout
    assert f"Plan: {total - 1} to change, 1 refused" in planned.stdout

    spec = {
        "waves": [{"devices": [CANARY]}, {"percent": 50}, {"percent": 100}],
        "max_unavailable": "100%",
        "soak_seconds": 1,
        "confirm_within": WINDOW,
        "gate_timeout": 300,
        "comment": "drop smtp at the edge",
    }
    started = fleet.op_run(
        *TRUEUP, "fleet", "rollout", "start", "--plan", "-l", "role=edge", "--canary", CANARY,
        "--wave", "50", "--wave", "100", "--max-unavailable", "100%", "--soak", "1",
        "--confirm-within", str(WINDOW), "--gate-timeout", "300",
        "--comment", "drop smtp at the edge", "--server", URL,
        "--token-file", str(fleet.token_file), "-o", "json",
    )  # fmt: skip
    assert started.returncode == 0, started.stdout + started.stderr
    answer = json.loads(started.stdout)
    rollout = answer["rollout"]
    # 202 targets (the old agent refused): the canary, half of the rest, the other half.
    assert [w["members"] for w in rollout["waves"]] == [1, 101, 100]
    assert [(r["device"], r["kind"]) for r in answer["plan"]["refused"]] == [(OLD, "agent-version")]
    final = wait_for(
        lambda: (v := fleet.rollout(rollout["id"]))["state"] == "completed" and v,
        "the rollout completed",
    )
    assert all(m["state"] == "passed" for m in final["members"]), final["members"]
    assert len(final["members"]) == total - 1 and OLD not in {m["device"] for m in final["members"]}
    for router in fleet.routers:
        assert "tcp dport 25 drop" in _ruleset(router)
    entries = fleet.devices()
    assert entries[OLD]["desired_version"] == 1  # refused: never sent
    assert all(e["desired_version"] == 2 for d, e in entries.items() if d != OLD)
    canary = next(m for m in final["members"] if m["device"] == CANARY)
    assert canary["wave"] == 0
    assert canary["finished_at"] <= min(m["sent_at"] for m in final["members"] if m["wave"] == 1)

    trail = [e for e in fleet.audit() if e["target"] == f"rollout:{rollout['id']}"]
    details = [(e["action"], e["detail"]) for e in reversed(trail)]
    actions = [a for a, _ in details]
    assert actions[0] == "rollout.start" and actions[-1] == "rollout.complete", actions
    sent_waves = {d["wave"] for a, d in details if a == "rollout.send"}
    assert sent_waves == {0, 1, 2}
    sent = {s["device"] for a, d in details if a == "rollout.send" for s in d["sent"]}
    assert sent == {m["device"] for m in final["members"]}
    passed = {p for a, d in details if a == "rollout.gate" for p in _names(d.get("passed"))}
    assert passed == sent
    assert not [d for a, d in details if a == "rollout.gate" and d.get("failed")]
    # Each wave finished before the next began; the last one completed the rollout.
    finished = [d["finished_wave"] for a, d in details if a in ("rollout.wave", "rollout.complete")]
    assert finished == [0, 1, 2], details
    assert details[0][1]["refused"] == [OLD] and details[0][1]["waves"] == [1, 101, 100]

    # -- 2. a bad change: the canary cuts itself off and comes back -----------------------
    fleet.ok("PUT", "/api/v1/notifications/allowlist", {"entries": ["127.0.0.0/8"]},
             token=fleet.admin)  # fmt: skip
    fleet.ok(
        "POST", "/api/v1/notifications/targets",
        {"name": "hook", "url": f"http://127.0.0.1:{HOOK_PORT}/hook",
         "secret": "a-webhook-secret-of-some-length"},
        token=fleet.admin,
    )  # fmt: skip
    fleet.ok(
        "POST", "/api/v1/notifications/rules",
        {"name": "paused", "target": "hook", "match": {"kinds": ["rollout_paused"]}},
        token=fleet.admin,
    )  # fmt: skip
    events = fleet.workdir / "hook.jsonl"
    fleet.spawn(sys.executable, "-c", HOOK, str(HOOK_PORT), str(events), log="hook.log")

    fleet.ok("PUT", "/api/v1/profiles/edge-firewall", _profile(bad=True), **{"If-Match": "1"})
    before = {d: e["desired_version"] for d, e in fleet.devices().items()}
    bad = fleet.ok("POST", "/api/v1/plan/rollout", {**spec, "selector": ""})["rollout"]
    router = fleet.routers[REAL.index(CANARY)]
    address = f"198.51.100.{2 + REAL.index(CANARY)}"
    wait_for(lambda: _on_router(router, "pending", 3), "the canary applied the bad revision")
    assert f"dport {PORT} drop" in _ruleset(router)
    assert not _management_answers(address, fleet)  # the firewall cut its API off
    wait_for(lambda: _on_router(router, "rolled-back", 3), "the canary rolled back by itself")
    assert f"dport {PORT} drop" not in _ruleset(router)
    wait_for(lambda: _management_answers(address, fleet), "the canary's API answers again")
    paused = wait_for(
        lambda: (v := fleet.rollout(bad["id"]))["state"] == "paused" and v, "the rollout paused"
    )
    assert paused["current_wave"] == 0, paused
    shown = fleet.op_run(
        *TRUEUP, "fleet", "rollout", "status", str(bad["id"]), "--server", URL,
        "--token-file", str(fleet.token_file),
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert re.search(rf"^rollout:\s+{bad['id']}\s+paused", shown.stdout, re.M), shown.stdout
    assert re.search(rf"^{CANARY}\s+0\s+reverted\s", shown.stdout, re.M), shown.stdout
    by_name = {m["device"]: m for m in paused["members"]}
    assert by_name[CANARY]["state"] == "reverted", by_name[CANARY]
    assert "rolled version 3 back by itself" in by_name[CANARY]["reason"]
    later = [m for m in paused["members"] if m["wave"] > 0]
    assert len(later) == total - 2 and all(m["state"] == "pending" for m in later)
    after = {d: e["desired_version"] for d, e in fleet.devices().items()}
    assert {d: v for d, v in after.items() if d != CANARY} == {
        d: v for d, v in before.items() if d != CANARY
    }  # no device of a later wave got a revision
    assert after[CANARY] == 4  # put back on its previous document
    assert all(v == 2 for v in json.loads((fleet.workdir / "fleetsim.json").read_text())
               .get("sim-000", [])[1:])  # fmt: skip

    def paused_event() -> dict[str, Any] | None:
        with contextlib.suppress(FileNotFoundError):
            for line in events.read_text().splitlines():
                event = json.loads(line)
                if event.get("kind") == "rollout_paused":
                    return dict(event)
        return None

    event = wait_for(paused_event, "the rollout_paused webhook")
    assert event["device"] == CANARY and event["severity"] == "critical"
    assert event["rollout"]["id"] == bad["id"] and event["rollout"]["failed"] == [CANARY]
    actions = [e["action"] for e in fleet.audit() if e["target"] == f"rollout:{bad['id']}"]
    assert "rollout.pause" in actions and "rollout.complete" not in actions


def _names(value: Any) -> list[str]:
    """Device names of a gate entry's list (names, or records with a device)."""
    out = []
    for item in value or []:
        out.append(item["device"] if isinstance(item, dict) else str(item))
    return out
