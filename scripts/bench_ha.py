"""HA benchmark: how long a virtual address is unanswered when its holder goes.

Two router namespaces (A primary, B standby) and a client namespace share a
bridge. Each router runs keepalived with the configuration trueup compiles
from `spec.ha` (`trueup.subsystems.ha.compile_config`, the agent's argv from
`trueup.system.keepalived`), and a TCP responder on the VIP's port that
answers with the router's name. The client connects to the VIP every 10 ms
and records who answered.

A round: A holds the VIP and answers; then A's keepalived is lost, and the
figure is the time from the loss to the first answer from B, measured on
the client. Two kinds of loss:

* **graceful** — SIGTERM: keepalived sends a priority-0 advertisement and
  drops the VIP; B takes over after its skew time;
* **crash** — SIGKILL of keepalived's VRRP process and its parent: the VIP
  stays on A, nothing is said; B takes over after the master-down interval
  (3 x advertisement interval + skew) and its gratuitous ARP moves the
  client.

Goal: within one advertisement interval + 100 ms. The advertisement interval
is the one used in the same run.

`python -m scripts.bench ha`, or `python -m scripts.bench_ha` for this section alone.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from scripts.benchlib import PYTHON, env, median, sh

VIP = "203.0.113.254"
PORT = 7900
ADVERT = 1.0

_RESPONDER = r"""
import socket, sys
name = sys.argv[1].encode()
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", int(sys.argv[2]))); srv.listen(128)
while True:
    conn, _ = srv.accept()
    try:
        conn.sendall(name)
    finally:
        conn.close()
"""

_PROBER = r"""
import json, os, socket, sys, time
vip, port, stop, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
rows = []
next_at = time.monotonic()
while not os.path.exists(stop):
    t = time.monotonic()
    who = "-"
    try:
        with socket.create_connection((vip, port), timeout=0.05) as conn:
            conn.settimeout(0.05)
            who = conn.recv(16).decode() or "-"
    except OSError:
        pass
    rows.append((t, who))
    next_at += 0.01
    time.sleep(max(0.0, next_at - time.monotonic()))
with open(out, "w") as handle:
    json.dump(rows, handle)
"""


def _document(address: str, role: str) -> dict[str, Any]:
    return {
        "apiVersion": "trueup/v1",
        "kind": "DeviceState",
        "metadata": {"device": f"bench-{role}"},
        "spec": {
            "management": {"interface": "mgmt0", "addresses": ["198.51.100.2/24"]},
            "interfaces": [{"name": "lan0", "addresses": [f"{address}/24"]}],
            "ha": {
                "role": role,
                "advert_interval": ADVERT,
                "vips": [{"interface": "lan0", "vrid": 51, "addresses": [f"{VIP}/24"]}],
            },
        },
    }


class _Rig:
    def __init__(self, work: Path) -> None:
        from trueup.model.document import parse_document
        from trueup.subsystems.ha.subsystem import compile_config
        from trueup.system.keepalived import keepalived_paths, write_config

        tag = f"tu-bench-{os.getpid()}-ha"
        self.work = work
        self.seg, self.client = f"{tag}-seg", f"{tag}-cl"
        self.routers = {"A": f"{tag}-a", "B": f"{tag}-b"}
        self.procs: list[subprocess.Popen[bytes]] = []
        self.keepalived: dict[str, subprocess.Popen[bytes] | None] = {"A": None, "B": None}
        self.paths = {}
        for ns in (self.seg, self.client, *self.routers.values()):
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", self.seg, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.seg, "link", "set", "br0", "up")
        ports = [("A", "lan0"), ("B", "lan0"), ("C", "cl0")]
        for index, (who, link) in enumerate(ports):
            ns = self.routers.get(who, self.client)
            sh("ip", "-n", ns, "link", "add", link, "type", "veth", "peer", "name", f"p{index}")
            sh("ip", "-n", ns, "link", "set", f"p{index}", "netns", self.seg)
            sh("ip", "-n", self.seg, "link", "set", f"p{index}", "master", "br0")
            sh("ip", "-n", self.seg, "link", "set", f"p{index}", "up")
        for who, address in (("A", "203.0.113.1"), ("B", "203.0.113.2")):
            ns = self.routers[who]
            sh("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", "lan0")
            sh("ip", "-n", ns, "link", "set", "lan0", "up")
            role = "primary" if who == "A" else "standby"
            paths = keepalived_paths(work / who)
            config = compile_config(parse_document(_document(address, role)))
            assert config is not None
            write_config(paths, config)
            self.paths[who] = paths
            self._spawn(ns, PYTHON, "-c", _RESPONDER, who, str(PORT))
        sh("ip", "-n", self.client, "addr", "add", "203.0.113.50/24", "dev", "cl0")
        sh("ip", "-n", self.client, "link", "set", "cl0", "up")

    def _spawn(self, ns: str, *argv: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, *argv],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env(),
        )
        self.procs.append(proc)
        return proc

    def start(self, who: str) -> None:
        paths = self.paths[who]
        log = open(paths.log, "ab")  # noqa: SIM115
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.routers[who], *paths.argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=paths.run_dir,
        )
        log.close()
        self.keepalived[who] = proc

    def holds(self, who: str) -> bool:
        shown = sh("ip", "-n", self.routers[who], "-o", "addr", "show", "dev", "lan0").stdout
        return f"{VIP}/24" in shown

    def wait(self, predicate: Any, what: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.02)
        raise RuntimeError(f"timed out waiting for {what}")

    def answered_by(self, who: str) -> bool:
        script = (
            "import socket,sys\n"
            "try:\n"
            "    c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=0.5)\n"
            "    print(c.recv(16).decode())\n"
            "except OSError:\n"
            "    print('-')\n"
        )
        out = sh("ip", "netns", "exec", self.client, PYTHON, "-c", script, VIP, str(PORT))
        return out.stdout.strip() == who

    def lose(self, who: str, crash: bool) -> float:
        """Take `who`'s keepalived away; the monotonic time of the loss."""
        proc = self.keepalived[who]
        assert proc is not None
        child = int(self.paths[who].pid_file("vrrp").read_text().split()[0])
        if crash:
            # The parent must neither respawn its VRRP child nor die first (the child
            # would shut down cleanly): stopped, then both killed.
            os.kill(proc.pid, signal.SIGSTOP)
            at = time.monotonic()
            os.kill(child, signal.SIGKILL)
            os.kill(proc.pid, signal.SIGKILL)
        else:
            at = time.monotonic()
            os.kill(proc.pid, signal.SIGTERM)
        proc.wait(15)
        self.keepalived[who] = None
        return at

    def close(self) -> None:
        for proc in [p for p in self.keepalived.values() if p is not None] + self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for paths in self.paths.values():
            try:
                child = int(paths.pid_file("vrrp").read_text().split()[0])
                cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            except (OSError, ValueError, IndexError):
                continue
            if b"keepalived" in cmdline and str(paths.config).encode() in cmdline:
                os.kill(child, signal.SIGKILL)
        for ns in (self.client, *self.routers.values(), self.seg):
            sh("ip", "netns", "del", ns, check=False)


def _round(rig: _Rig, crash: bool) -> float:
    """Seconds from the loss of A's keepalived to B's first answer on the VIP."""
    if rig.keepalived["A"] is None:
        # A crashed keepalived left its VIP: trueup releases it before starting again.
        sh("ip", "-n", rig.routers["A"], "addr", "del", f"{VIP}/24", "dev", "lan0", check=False)
        rig.start("A")
    rig.wait(lambda: rig.holds("A") and not rig.holds("B"), "A holds the VIP alone")
    rig.wait(lambda: rig.answered_by("A"), "the client reaches A")
    stop, out = rig.work / "stop", rig.work / "probe.json"
    stop.unlink(missing_ok=True)
    prober = rig._spawn(rig.client, PYTHON, "-c", _PROBER, VIP, str(PORT), str(stop), str(out))
    time.sleep(0.3)  # the prober's first answers come from A
    at = rig.lose("A", crash)
    rig.wait(lambda: rig.holds("B"), "B takes the VIP")
    rig.wait(lambda: rig.answered_by("B"), "the client reaches B")
    time.sleep(0.1)
    stop.touch()
    prober.wait(15)
    rows = json.loads(out.read_text())
    first = next(t for t, who in rows if t >= at and who == "B")
    return float(first - at)


def run(quick: bool) -> str:
    rounds = 2 if quick else 5
    work = Path(tempfile.mkdtemp(prefix="tu-ha-"))
    figures: dict[str, list[float]] = {"graceful": [], "crash": []}
    version = sh("keepalived", "--version", check=False).stderr.splitlines()[:1]
    try:
        rig = _Rig(work)
        try:
            rig.start("A")
            rig.start("B")
            for _ in range(rounds):
                for kind in ("graceful", "crash"):
                    figures[kind].append(_round(rig, kind == "crash"))
        finally:
            rig.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    goal = ADVERT + 0.1
    lines = [
        "## HA: VIP failover (keepalived)",
        "",
        "Two router namespaces and a client on one bridge; keepalived "
        f"({version[0] if version else 'keepalived'}) runs the configuration trueup compiles "
        f"from `spec.ha` (advertisement interval {ADVERT:g} s, primary priority 200, standby "
        "100). The client connects to the VIP every 10 ms; the figure is the time from the "
        "loss of the primary's keepalived to the first answer from the standby. "
        f"{rounds} rounds each. Goal: within one advertisement interval + 100 ms "
        f"({goal * 1000:.0f} ms).",
        "",
        "| loss | median | max | goal met |",
        "|---|---|---|---|",
    ]
    for kind, values in figures.items():
        met = "✅" if max(values) <= goal else "❌"
        lines.append(
            f"| {kind} | {median(values) * 1000:.0f} ms | {max(values) * 1000:.0f} ms | {met} |"
        )
    lines += [
        "",
        "A graceful stop sends a priority-0 advertisement: the standby takes over after its "
        "skew time ((256 - priority) / 256 x interval). A crash says nothing: the standby "
        "waits for the master-down interval (3 x interval + skew), so it cannot meet a "
        "one-interval goal at any interval; a shorter `advert_interval` shortens it "
        "proportionally.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(run("--quick" in sys.argv))
