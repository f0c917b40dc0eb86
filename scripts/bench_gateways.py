"""Gateway failover benchmark: from the first lost probe to the default route switched.

A router namespace with two WAN uplinks, each to an upstream namespace that
answers for the same host (the probes' target). The gateway monitor
(`trueup.agent.gateways.GatewayMonitor`, over the real engine, the kernel's
netlink and the real prober) probes both every 200 ms with `down_after: 3`.
A round: the primary's upstream starts dropping the router's echo requests
(nft); the figure is the time from the send of the first probe that got no
answer to the moment the gateways' table's default route goes through the
secondary. The detection window — three rounds, 600 ms — is the floor.
Goal: under 1 s.

The baseline, measured in the same run with the same probe routes: the same
detection by a shell loop of `busybox ping -I wan0` (under `timeout 0.2`)
every 200 ms and `ip route replace` after three failures in a row.

`python -m scripts.bench gateways`; the measurement runs inside the router
namespace (`--inner`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from scripts.benchlib import PYTHON, env, median, sh

HOST = "203.0.113.100"
INTERVAL_MS = 200
DOWN_AFTER = 3
GATEWAYS = {"isp-a": "192.0.2.1", "isp-b": "192.0.2.17"}
DROP = "add rule inet gwbench input ip saddr 192.0.2.2 icmp type echo-request drop"
FLUSH = "flush chain inet gwbench input"

SHELL_LOOP = r"""
fails=0; active=a
while :; do
  started=$(date +%s.%N)
  if timeout 0.2 busybox ping -c 1 -I wan0 {host} >/dev/null 2>&1; then fails=0
  else fails=$((fails+1)); echo "lost $started"; fi
  if [ $fails -ge {down} ] && [ $active = a ]; then
    ip route replace default via {secondary} dev wan1 table 100; active=b
    echo "switched $(date +%s.%N)"
  fi
  sleep 0.2
done
"""


def _document() -> dict[str, Any]:
    uplinks = [
        {
            "name": name,
            "interface": interface,
            "gateway": gateway,
            "priority": priority,
            "probes": {"icmp": [HOST]},
            "interval_ms": INTERVAL_MS,
            "down_after": DOWN_AFTER,
            "up_after": 3,
            "max_loss_percent": 100,
        }
        for priority, ((name, gateway), interface) in enumerate(
            zip(GATEWAYS.items(), ("wan0", "wan1"), strict=True), start=1
        )
    ]
    return {
        "apiVersion": "trueup/v1",
        "kind": "DeviceState",
        "metadata": {"device": "bench-gw"},
        "spec": {
            "management": {"interface": "mgmt0", "addresses": ["198.51.100.2/24"]},
            "interfaces": [
                {"name": "wan0", "addresses": ["192.0.2.2/28"]},
                {"name": "wan1", "addresses": ["192.0.2.18/28"]},
            ],
            "tables": {"wan": 100},
            "gateways": {"tables": ["wan"], "uplinks": uplinks},
        },
    }


def _via() -> str | None:
    shown = sh("ip", "-j", "route", "show", "table", "100", "default", check=False).stdout
    for route in json.loads(shown or "[]"):
        return str(route.get("gateway"))
    return None


def _wait(predicate: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.005)
    raise RuntimeError(f"timed out waiting for {what}")


def _inner(upstream: str, rounds: int, out: Path) -> None:
    """Inside the router namespace: the monitor's rounds, then the shell loop's."""
    from trueup.agent.gateways import GatewayMonitor
    from trueup.journal.state import StateDir
    from trueup.model.document import parse_document
    from trueup.reconcile.engine import Engine
    from trueup.subsystems.gateways.subsystem import GatewaysSubsystem
    from trueup.subsystems.registry import default_subsystems
    from trueup.system.probe import probe_round

    def nft(command: str) -> None:
        sh("ip", "netns", "exec", upstream, "nft", command)

    state = StateDir(Path(tempfile.mkdtemp(prefix="tu-gw-state-")))
    state.ensure()
    # What is measured is the monitor's switch; spec.routes' subsystem has no part in it.
    engine = Engine(state, [s for s in default_subsystems() if s.name != "routes"])
    result = engine.apply_document(parse_document(_document()))
    if not result.ok:
        raise RuntimeError(f"apply failed: {result.to_json()}")
    gateways = engine.by_name["gateways"]
    assert isinstance(gateways, GatewaysSubsystem)
    failed_rounds: list[float] = []  # wall-clock send time of each isp-a round without answer

    def prober(interface: str, targets: Any, timeout: float, seq: int) -> Any:
        sent = time.time()
        answers = probe_round(interface, targets, timeout, seq)
        if interface == "wan0" and all(a is None for a in answers):
            failed_rounds.append(sent)
        return answers

    monitor = GatewayMonitor(engine, gateways.board, prober=prober)
    switched: list[float] = []
    monitor.on_change.append(lambda: switched.append(time.time()))
    monitor.sync()  # the board knows the uplinks before the first look below

    def both_up() -> bool:
        section = gateways.board.section
        states = gateways.board.states_for(section) if section is not None else {}
        return states == {"isp-a": "up", "isp-b": "up"} and _via() == GATEWAYS["isp-a"]

    monitor.start()
    ours: list[float] = []
    try:
        for _ in range(rounds):
            _wait(both_up, "both up and the route via isp-a")
            cut = time.time()
            nft(DROP)
            _wait(lambda: _via() == GATEWAYS["isp-b"], "the switch to isp-b")
            at = time.time()
            first = min(t for t in failed_rounds if t >= cut - INTERVAL_MS / 1000.0)
            ours.append(at - first)
            nft(FLUSH)
            failed_rounds.clear()
    finally:
        monitor.stop()
    time.sleep(0.5)
    shell: list[float] = []
    script = SHELL_LOOP.format(host=HOST, down=DOWN_AFTER, secondary=GATEWAYS["isp-b"])
    for _ in range(rounds):
        sh(
            "ip",
            "route",
            "replace",
            "default",
            "via",
            GATEWAYS["isp-a"],
            "dev",
            "wan0",
            "table",
            "100",
        )
        loop = subprocess.Popen(["sh", "-c", script], stdout=subprocess.PIPE, text=True)
        try:
            time.sleep(1.0)  # its first rounds answer
            cut = time.time()
            nft(DROP)
            assert loop.stdout is not None
            lost: list[float] = []
            for line in loop.stdout:
                kind, _, stamp = line.strip().partition(" ")
                if kind == "lost" and float(stamp) >= cut - INTERVAL_MS / 1000.0:
                    lost.append(float(stamp))
                elif kind == "switched":
                    shell.append(float(stamp) - min(lost))
                    break
        finally:
            loop.kill()
            loop.wait()
            nft(FLUSH)
    out.write_text(json.dumps({"trueup": ours, "shell": shell}))


class _Rig:
    def __init__(self) -> None:
        tag = f"tu-bench-{os.getpid()}-gw"
        self.router, self.upstreams = tag, {"wan0": f"{tag}-u0", "wan1": f"{tag}-u1"}
        sh("ip", "netns", "add", self.router)
        sh("ip", "-n", self.router, "link", "set", "lo", "up")
        for link in ("mgmt0", "wan0", "wan1"):
            sh(
                "ip",
                "-n",
                self.router,
                "link",
                "add",
                link,
                "type",
                "veth",
                "peer",
                "name",
                f"{link}p",
            )
        sh("ip", "-n", self.router, "link", "set", "mgmt0p", "up")
        for (link, ns), gateway in zip(self.upstreams.items(), GATEWAYS.values(), strict=True):
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", self.router, "link", "set", f"{link}p", "netns", ns)
            for args in (
                ("link", "set", "lo", "up"),
                ("addr", "add", f"{HOST}/32", "dev", "lo"),
                ("addr", "add", f"{gateway}/28", "dev", f"{link}p"),
                ("link", "set", f"{link}p", "up"),
            ):
                sh("ip", "-n", ns, *args)
            for command in (
                "add table inet gwbench",
                "add chain inet gwbench input { type filter hook input priority 0 ; }",
            ):
                sh("ip", "netns", "exec", ns, "nft", command)

    def close(self) -> None:
        for ns in (self.router, *self.upstreams.values()):
            sh("ip", "netns", "del", ns, check=False)


def run(quick: bool) -> str:
    rounds = 3 if quick else 10
    rig = _Rig()
    out = Path(tempfile.mkdtemp(prefix="tu-gw-bench-")) / "figures.json"
    try:
        proc = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                rig.router,
                PYTHON,
                "-m",
                "scripts.bench_gateways",
                "--inner",
                rig.upstreams["wan0"],
                str(rounds),
                str(out),
            ],
            capture_output=True,
            text=True,
            env=env(),
            timeout=600,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"inner run failed: {proc.stderr[-2000:]}")
        figures: dict[str, list[float]] = json.loads(out.read_text())
    finally:
        rig.close()
    floor = DOWN_AFTER * INTERVAL_MS / 1000.0
    ours, shell = figures["trueup"], figures["shell"]
    ratio = median(ours) / median(shell) if shell else float("nan")
    met = "✅" if max(ours) < 1.0 else "❌"
    return "\n".join(
        [
            "## Gateways: failover from the first lost probe to the default route switched",
            "",
            "A router namespace with two WAN uplinks to two upstream namespaces answering for "
            f"the same host; probes every {INTERVAL_MS} ms, `down_after: {DOWN_AFTER}`. The "
            "primary's upstream starts dropping the router's echo requests; the figure is the "
            "time from the send of the first unanswered probe to the gateways' table's default "
            f"route through the secondary. {len(ours)} rounds each. Floor: the detection window "
            f"({floor * 1000:.0f} ms). Goal: under 1 s. Baseline in the same run: a shell loop "
            "of `timeout 0.2 busybox ping -I wan0` every 200 ms and `ip route replace` after "
            f"{DOWN_AFTER} failures in a row.",
            "",
            "| detection and switch | median | max | above the floor (median) | goal met |",
            "|---|---|---|---|---|",
            f"| trueup's gateway monitor | {median(ours) * 1000:.0f} ms | "
            f"{max(ours) * 1000:.0f} ms | {(median(ours) - floor) * 1000:.0f} ms | {met} |",
            f"| shell loop (ping + ip route replace) | {median(shell) * 1000:.0f} ms | "
            f"{max(shell) * 1000:.0f} ms | {(median(shell) - floor) * 1000:.0f} ms | — |",
            "",
            f"Ratio trueup / shell loop (medians): {ratio:.2f}. The monitor keeps its "
            "cadence whatever the answers (a round's wait for its answers is part of the "
            "interval) and switches inside the round that completes the count (one netlink "
            "request, `converge_gateways`, audited); a failing round of the shell loop lasts "
            "its ping's timeout plus its sleep, and it pays a `ping` and a `date` process per "
            "round and an `ip` process for the switch.",
            "",
        ]
    )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--inner":
        _inner(sys.argv[2], int(sys.argv[3]), Path(sys.argv[4]))
    else:
        print(run("--quick" in sys.argv))
