"""The crash-point sweep: SIGKILL at every failpoint of every kind of transaction.

Apply, heal, rollback and confirm-timeout all go through one engine, so each
is killed at its failpoints (`KIND/POINT`, see `trueup.reconcile.faults`),
and at random moments after `begin`. After a restart the kernel equals the
old or the new revision exactly, the journal has no open transaction, the
audit chain verifies, and the management address answered from another
namespace the whole time.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.routers import Router, base_document

pytestmark = pytest.mark.root

FAST = {"TRUEUP_RESYNC_SECONDS": "1"}
# Every wait is for an event; the bound is generous for a loaded 2-core machine.
BOUND = 120.0
LAN = "203.0.113.1/24"

PROBE = r"""
import socket, sys, time
# TCP to the management address: connected or refused means the address answers.
log = open(sys.argv[1], "w", buffering=1)
while True:
    s = socket.socket()
    s.settimeout(0.3)
    try:
        s.connect(("198.51.100.2", 7443))
        state = "up"
    except (ConnectionRefusedError, ConnectionResetError):  # a TCP answer: the address is up
        state = "up"
    except OSError as exc:
        state = "down " + type(exc).__name__
    finally:
        s.close()
    log.write(f"{time.time():.3f} {state}\n")
    time.sleep(0.02)
"""


def _v2() -> dict[str, Any]:
    return base_document(
        interfaces=[
            {"name": "lan0", "mtu": 1300, "addresses": ["203.0.113.2/24", "2001:db8:1::2/64"]}
        ],
        routes=[
            {"to": "192.0.2.0/24", "via": "203.0.113.250"},
            {"to": "192.0.2.128/25", "via": "203.0.113.251", "table": "wan2"},
        ],
    )


class Sweep:
    def __init__(self, router: Router) -> None:
        self.router = router
        self.probe_log = router.workdir / "probe.log"

    def start(self, document: dict[str, Any]) -> dict[str, Any]:
        router = self.router
        applied = router.trueup("apply", str(router.write("v1.yaml", document)))
        assert applied.returncode == 0, applied.stderr
        # Anything the client cached about the address is learnt now.
        router.spawn_in_client(sys.executable, "-c", PROBE, str(self.probe_log))
        router.wait_for(self._probe_up, what="probe sees management", timeout=BOUND)
        return router.snapshot()

    def _probe_up(self) -> bool:
        lines = self.probe_log.read_text().splitlines() if self.probe_log.exists() else []
        return bool(lines) and lines[-1].endswith(" up")

    def agent(self, fault: str | None = None, **env: str) -> subprocess.Popen[str]:
        extra = {**FAST, **env}
        if fault:
            extra["TRUEUP_FAULT"] = fault
        return self.router.start_agent(env=extra)

    def killed(self, proc: subprocess.Popen[str]) -> None:
        self.router.wait_for(
            lambda: proc.poll() is not None, what="SIGKILL at the failpoint", timeout=BOUND
        )
        assert proc.returncode == -signal.SIGKILL, self.router.agent_log()
        self.router.agents.remove(proc)

    def restart(self) -> None:
        self.agent()
        self.router.wait_for(
            lambda: self.router.api("/v1/status").get("journal", {}).get("open", 1) is None,
            what="no open transaction",
            timeout=BOUND,
        )

    def consistent(self) -> None:
        router = self.router
        verified = router.trueup("audit", "verify")
        assert verified.returncode == 0, verified.stdout + verified.stderr
        status = router.api("/v1/status")
        assert status["journal"]["open"] is None
        assert status["management"]["ready"] is True
        downs = [line for line in self.probe_log.read_text().splitlines() if " down" in line]
        assert not downs, downs[:5]


@pytest.fixture
def sweep(router_with_client: Router) -> Sweep:
    return Sweep(router_with_client)


APPLY_POINTS = [
    "begin",
    "step:links",
    "step:addresses",
    "step:routes",
    "applied:addresses",
    "before-commit",
    "after-commit",
]


@pytest.mark.parametrize("point", APPLY_POINTS)
def test_apply_killed_at_each_point(sweep: Sweep, point: str) -> None:
    router = sweep.router
    old = sweep.start(base_document())
    proc = sweep.agent(f"apply/{point}")
    router.trueup("apply", str(router.write("v2.yaml", _v2())))
    sweep.killed(proc)
    sweep.restart()
    after = router.snapshot()
    status = router.api("/v1/status")
    committed = point == "after-commit"
    assert status["versions"]["applied"] == (2 if committed else 1)
    redo = router.trueup("apply", str(router.write("v2.yaml", _v2())))
    assert redo.returncode == 0, redo.stderr
    new = router.snapshot()
    assert after == (new if committed else old), (after, old, new)
    if committed:
        applies = [
            json.loads(line)
            for line in (router.state_dir / "audit.jsonl").read_text().splitlines()
            if '"event":"apply"' in line
        ]
        assert [a["details"]["version"] for a in applies].count(2) == 1
    sweep.consistent()


HEAL_POINTS = ["begin", "step:addresses", "step:routes", "before-commit", "after-commit"]


@pytest.mark.parametrize("point", HEAL_POINTS)
def test_heal_killed_at_each_point_recovers_forward(sweep: Sweep, point: str) -> None:
    router = sweep.router
    healthy = sweep.start(base_document())
    proc = sweep.agent(f"reconcile/{point}")
    router.ip("addr", "del", LAN, "dev", "lan0")  # also flushes the routes through it
    sweep.killed(proc)
    sweep.restart()
    # Recovery converges to the committed revision: healed, never back to the drift.
    router.wait_for(
        lambda: router.snapshot() == healthy, what="healed after restart", timeout=BOUND
    )
    assert router.trueup("drift").returncode == 0
    # The interrupted heal is reported from the journal (an interrupted one only).
    codes = [f["code"] for f in router.api("/v1/status")["reason_codes"]]
    interrupted = point != "after-commit"
    assert ("STATE_APPLY_NOT_COMPLETED" in codes) == interrupted, codes
    sweep.consistent()


def test_heal_under_notify_never_runs_so_its_failpoints_never_fire(sweep: Sweep) -> None:
    router = sweep.router
    sweep.start(base_document(convergence={"default": "notify"}))
    proc = sweep.agent("reconcile/begin")
    router.ip("addr", "del", LAN, "dev", "lan0")
    router.wait_for(
        lambda: "drift" in router.api("/v1/status")["subsystems"]["addresses"],
        what="drift reported",
        timeout=BOUND,
    )
    passes = router.api("/v1/status")["reconcile_loop"]["passes"]
    router.wait_for(
        lambda: router.api("/v1/status")["reconcile_loop"]["passes"] >= passes + 2,
        what="two more passes",
        timeout=BOUND,
    )
    assert proc.poll() is None
    assert LAN not in router.addresses("lan0")
    sweep.consistent()


@pytest.mark.parametrize("point", ["begin", "step:addresses", "before-commit", "after-commit"])
def test_rollback_killed_at_each_point(sweep: Sweep, point: str) -> None:
    router = sweep.router
    sweep.start(base_document())
    applied = router.trueup("apply", str(router.write("v2.yaml", _v2())))
    assert applied.returncode == 0, applied.stderr
    at_v2 = router.snapshot()
    proc = sweep.agent(f"rollback/{point}")
    router.trueup("rollback")
    sweep.killed(proc)
    sweep.restart()
    after = router.snapshot()
    committed = point == "after-commit"
    assert router.api("/v1/status")["versions"]["applied"] == (3 if committed else 2)
    if not committed:
        assert after == at_v2
        again = router.trueup("rollback")
        assert again.returncode == 0, again.stderr
    sweep.consistent()


@pytest.mark.parametrize("point", ["begin", "step:addresses", "before-commit", "after-commit"])
def test_confirm_timeout_killed_at_each_point(sweep: Sweep, point: str) -> None:
    router = sweep.router
    old = sweep.start(base_document())
    proc = sweep.agent(f"confirm-timeout/{point}")
    guarded = router.trueup("apply", str(router.write("v2.yaml", _v2())), "--confirm-within", "1")
    assert guarded.returncode == 0, guarded.stderr
    sweep.killed(proc)  # at the deadline the rollback transaction starts, and dies
    sweep.restart()
    # Whatever the point, the unconfirmed version does not survive the restart.
    router.wait_for(
        lambda: router.snapshot() == old, what="back to the confirmed revision", timeout=BOUND
    )
    status = router.api("/v1/status")
    assert status["versions"]["applied"] == 3
    assert status["pending_confirmation"] is None
    sweep.consistent()


# Six kills, recoveries and re-applies of 200 addresses on a loaded 2-core machine.
@pytest.mark.timeout(1800)
def test_sigkill_at_random_moments_after_begin(sweep: Sweep) -> None:
    router = sweep.router
    many = [f"203.0.113.{n}/24" for n in range(1, 200)]
    docs = {
        "a": base_document(interfaces=[{"name": "lan0", "mtu": 1400, "addresses": many}]),
        "b": base_document(interfaces=[{"name": "lan0", "mtu": 1300, "addresses": many[:40]}]),
    }
    paths = {name: router.write(f"{name}.yaml", doc) for name, doc in docs.items()}
    sweep.start(docs["a"])
    snapshots = {"a": router.snapshot()}
    assert router.trueup("apply", str(paths["b"])).returncode == 0
    snapshots["b"] = router.snapshot()
    assert router.trueup("apply", str(paths["a"])).returncode == 0
    rng = random.Random(8)
    current = "a"
    for _ in range(6):
        target = "b" if current == "a" else "a"
        begins = _begins(router)
        proc = router.spawn(*_cli(router, "apply", str(paths[target])))
        router.wait_for(lambda b=begins: _begins(router) > b, what="begin written", timeout=BOUND)
        time.sleep(rng.uniform(0.0, 0.15))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        # Any write recovers the open transaction first, to the last committed revision.
        recovered = router.trueup("reconcile")
        assert recovered.returncode == 0, recovered.stderr
        seen = router.snapshot()
        assert seen in (snapshots[current], snapshots[target]), seen
        drift = json.loads(router.trueup("drift", "-o", "json").stdout)
        assert drift["differences"] == [], _evidence(router, drift, recovered.stdout)
        finished = router.trueup("apply", str(paths[target]))
        assert finished.returncode == 0, finished.stderr
        assert router.snapshot() == snapshots[target]
        current = target
    sweep.agent()
    sweep.consistent()


def _evidence(router: Router, *extra: object) -> str:
    """What a failed recovery left: the journal's last records and the applied record."""
    journal = router.state_dir / "journal.jsonl"
    lines = journal.read_text().splitlines()[-6:] if journal.exists() else []
    applied = router.state_dir / "applied.json"
    return "\n".join(
        [
            *(line[:600] for line in lines),
            applied.read_text() if applied.exists() else "",
            *map(str, extra),
        ]
    )


def _begins(router: Router) -> int:
    path = router.state_dir / "journal.jsonl"
    return path.read_text().count('"type":"begin"') if path.exists() else 0


def _cli(router: Router, *args: str) -> list[str]:
    from tests.routers import TRUEUP

    return [*TRUEUP, *args, "--state-dir", str(router.state_dir)]


def test_interrupted_heal_of_flushed_management_keeps_every_management_address(
    sweep: Sweep,
) -> None:
    router = sweep.router
    many = [f"198.51.100.{n}/24" for n in range(2, 60)]
    management = {"interface": "mgmt0", "addresses": many, "gateway": "198.51.100.1"}
    sweep.start(base_document(management=management))
    proc = sweep.agent("reconcile/step:management")
    router.ip("addr", "flush", "dev", "mgmt0")  # out of band: management gone
    sweep.killed(proc)  # killed right after the heal's first step
    restart_at = time.time()
    sweep.restart()
    assert router.addresses("mgmt0") == sorted(many)
    passes = router.api("/v1/status")["reconcile_loop"]["passes"]
    router.wait_for(
        lambda: router.api("/v1/status")["reconcile_loop"]["passes"] >= passes + 2,
        what="two more passes",
        timeout=BOUND,
    )
    assert router.addresses("mgmt0") == sorted(many)
    recovered = [
        json.loads(line)
        for line in (router.state_dir / "audit.jsonl").read_text().splitlines()
        if '"event":"recovered"' in line
    ]
    assert recovered and recovered[-1]["details"]["kind"] == "reconcile"
    # Management answered from the client from the moment the agent restarted.
    lines = Path(sweep.probe_log).read_text().splitlines()
    first_up = next(
        float(line.split()[0])
        for line in lines
        if float(line.split()[0]) >= restart_at and line.endswith(" up")
    )
    later_downs = [line for line in lines if float(line.split()[0]) > first_up and " down" in line]
    assert not later_downs, later_downs[:5]
