"""Gateway failover on the real kernel: a router with two WAN uplinks, each to an upstream
namespace answering for the same host, a LAN client behind it, and the agent's monitor
probing both. The default route of the gateways' table follows the healthy uplink; the
management default route never moves."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.routers import REPO, Router, base_document, require_root, sh

pytestmark = pytest.mark.root

HOST = "203.0.113.100"  # the host both upstreams answer for: the probes' target
LAN_CLIENT = "203.0.113.2"
GATEWAYS = {"isp-a": "192.0.2.1", "isp-b": "192.0.2.17"}
PINGER = """
import sys, time
from trueup.system.probe import ProbeTarget, probe_round
out = open(sys.argv[1], "w", buffering=1)
seq = 0
while True:
    seq += 1
    started = time.monotonic()
    (answer,) = probe_round("lan0p", [ProbeTarget(sys.argv[2])], 0.5, seq)
    out.write(("ok" if answer is not None else "lost") + "\\n")
    time.sleep(max(0.0, 0.1 - (time.monotonic() - started)))
"""


class WanRig:
    """The router (mgmt0, lan0, wan0, wan1), two upstreams and a LAN client, by name."""

    def __init__(self, workdir: Path) -> None:
        self.router = Router(workdir, links=("mgmt0", "lan0", "wan0", "wan1"), client=True)
        base = self.router.name
        self.upstreams = {"wan0": f"{base}-u0", "wan1": f"{base}-u1"}
        self.lan = f"{base}-l"
        for (link, ns), gateway, ours in zip(
            self.upstreams.items(), GATEWAYS.values(), ("192.0.2.2", "192.0.2.18"), strict=True
        ):
            sh("ip", "netns", "add", ns)
            self.router.ip("link", "set", f"{link}p", "netns", ns)
            for args in (
                ("link", "set", "lo", "up"),
                ("addr", "add", f"{HOST}/32", "dev", "lo"),
                ("addr", "add", f"{gateway}/28", "dev", f"{link}p"),
                ("link", "set", f"{link}p", "up"),
                ("route", "add", "203.0.113.0/26", "via", ours),
            ):
                sh("ip", "-n", ns, *args)
            self.nft(link, "add table inet gwtest")
            self.nft(link, "add chain inet gwtest input { type filter hook input priority 0 ; }")
        sh("ip", "netns", "add", self.lan)
        self.router.ip("link", "set", "lan0p", "netns", self.lan)
        for args in (
            ("link", "set", "lo", "up"),
            ("addr", "add", f"{LAN_CLIENT}/26", "dev", "lan0p"),
            ("link", "set", "lan0p", "up"),
            ("route", "add", "default", "via", "203.0.113.1"),
        ):
            sh("ip", "-n", self.lan, *args)
        # The operator's policy routing: the LAN's traffic takes the gateways' table.
        self.router.ip("rule", "add", "iif", "lan0", "lookup", "100", "pref", "1000")
        self.pingers: list[subprocess.Popen[str]] = []

    def nft(self, link: str, command: str) -> None:
        sh("ip", "netns", "exec", self.upstreams[link], "nft", command)

    def document(self, **uplink: Any) -> dict[str, Any]:
        # Probes every 500 ms: a loaded machine answering late never looks like an outage.
        settings = {"interval_ms": 500, "down_after": 3, "up_after": 3, "max_loss_percent": 100}
        settings.update(uplink)
        uplinks = [
            {
                "name": name,
                "interface": interface,
                "gateway": gateway,
                "priority": priority,
                "probes": {"icmp": [HOST]},
                **settings,
            }
            for priority, ((name, gateway), interface) in enumerate(
                zip(GATEWAYS.items(), ("wan0", "wan1"), strict=True), start=1
            )
        ]
        return base_document(
            interfaces=[
                {"name": "lan0", "addresses": ["203.0.113.1/26"]},
                {"name": "wan0", "addresses": ["192.0.2.2/28"]},
                {"name": "wan1", "addresses": ["192.0.2.18/28"]},
            ],
            tables={"wan": 100},
            routes=[],
            sysctl={"net.ipv4.ip_forward": 1},
            gateways={"tables": ["wan"], "uplinks": uplinks},
        )

    def start(self, **uplink: Any) -> None:
        applied = self.router.trueup(
            "apply", str(self.router.write("gw.yaml", self.document(**uplink)))
        )
        assert applied.returncode == 0, applied.stdout + applied.stderr
        self.router.start_agent()
        self.router.wait_for(
            lambda: self.states() == {"isp-a": "up", "isp-b": "up"}, what="both gateways up"
        )

    # -- what the router shows ------------------------------------------------------
    def via(self) -> str | None:
        """The gateway of table 100's default route (None: none)."""
        for route in self.router.ip_json("route", "show", "table", "100", "default"):
            return str(route.get("gateway"))
        return None

    def management_route(self) -> list[dict[str, Any]]:
        shown = self.router.ip_json("route", "show", "table", "main", "default")
        return [r for r in shown if r.get("dev") == "mgmt0"]

    def gateways(self) -> dict[str, Any]:
        system = self.router.api("/v1/status").get("subsystems", {}).get("gateways", {})
        return dict(system.get("system") or {})

    def states(self) -> dict[str, str]:
        return {g["name"]: g["state"] for g in self.gateways().get("gateways", [])}

    def audit(self, *events: str) -> list[tuple[str, dict[str, Any]]]:
        lines = (self.router.state_dir / "audit.jsonl").read_text().splitlines()
        records = [json.loads(line) for line in lines]
        return [(r["event"], r["details"]) for r in records if r["event"] in events]

    # -- the LAN client's ping loop --------------------------------------------------
    def ping_loop(self, log: Path) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.lan, sys.executable, "-c", PINGER, str(log), HOST],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
            env={"PYTHONPATH": str(REPO), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
        )
        self.pingers.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.pingers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
        self.router.close()
        for ns in (*self.upstreams.values(), self.lan):
            sh("ip", "netns", "del", ns, check=False)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[WanRig]:
    require_root()
    wan = WanRig(tmp_path)
    try:
        yield wan
    finally:
        wan.close()


def _answers(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


def test_a_cut_uplink_fails_over_and_comes_back_after_the_hysteresis(
    rig: WanRig, tmp_path: Path
) -> None:
    router = rig.router
    rig.start()
    assert rig.via() == GATEWAYS["isp-a"]
    management = rig.management_route()
    assert management and management[0]["gateway"] == "198.51.100.1"
    log = tmp_path / "pings.log"
    pinger = rig.ping_loop(log)
    router.wait_for(lambda: _answers(log).count("ok") >= 5, what="the LAN client's pings answered")

    # The primary's link goes down upstream: the route moves to the secondary.
    before = len(_answers(log))
    sh("ip", "-n", rig.upstreams["wan0"], "link", "set", "wan0p", "down")
    router.wait_for(lambda: rig.via() == GATEWAYS["isp-b"], what="the route via isp-b")
    router.wait_for(
        lambda: _answers(log)[before:][-5:] == ["ok"] * 5, what="the LAN pings answered via isp-b"
    )
    pinger.send_signal(signal.SIGKILL)
    pinger.wait()
    during = _answers(log)[before:]
    # At most the rounds of the detection window (1.5 s here) and the switch are lost;
    # a generous bound for a loaded machine, not a measure of speed.
    assert 0 < during.count("lost") <= 30, during
    assert rig.states()["isp-a"] == "down"
    assert rig.gateways()["active"] == ["isp-b"]
    assert rig.management_route() == management
    shown = router.trueup("status").stdout
    assert "gateways (failover): active isp-b" in shown, shown

    # The agent restarts mid-failover: the route never goes back to the dead primary.
    seen: set[str | None] = set()
    watching = threading.Event()

    def watch() -> None:
        while not watching.is_set():
            seen.add(rig.via())
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        router.stop_agents()
        router.start_agent()
        router.wait_for(lambda: rig.states().get("isp-a") == "down", what="isp-a down again")
    finally:
        watching.set()
        watcher.join()
    assert seen == {GATEWAYS["isp-b"]}

    # A new revision mid-failover whose probe settings are unchanged keeps both states.
    changed = rig.document()
    changed["spec"]["gateways"]["uplinks"][1]["weight"] = 2
    applied = router.trueup("apply", str(router.write("gw2.yaml", changed)))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    router.wait_for(
        lambda: [g["weight"] for g in rig.gateways().get("gateways", [])] == [1, 2],
        what="the monitor following the new revision",
    )
    assert rig.via() == GATEWAYS["isp-b"]
    assert rig.states() == {"isp-a": "down", "isp-b": "up"}

    # Restored: back to the primary once it has answered up_after rounds in a row.
    sh("ip", "-n", rig.upstreams["wan0"], "link", "set", "wan0p", "up")
    router.wait_for(lambda: rig.via() == GATEWAYS["isp-a"], what="the route back via isp-a")
    assert rig.states() == {"isp-a": "up", "isp-b": "up"}
    assert rig.management_route() == management

    states = [(d["gateway"], d["state"]) for _, d in rig.audit("gateway_state")]
    assert states[-2:] == [("isp-a", "down"), ("isp-a", "up")]
    switches = [(d["previous"], d["active"]) for _, d in rig.audit("gateway_switched")]
    assert switches[-2:] == [
        ({"ipv4": ["isp-a"]}, {"ipv4": ["isp-b"]}),
        ({"ipv4": ["isp-b"]}, {"ipv4": ["isp-a"]}),
    ]
    entry = {g["name"]: g for g in rig.gateways()["gateways"]}["isp-a"]
    assert entry["since"] and entry["active"] is True and entry["latency_ms"] is not None

    # The monitor's switches are not drift: the loop never healed the gateways.
    def heals() -> list[dict[str, Any]]:
        return [d for _, d in rig.audit("reconcile") if d.get("subsystem") == "gateways"]

    assert heals() == []

    # Someone replaces the gateways' default route: the loop puts it back.
    router.ip("route", "replace", "default", "via", GATEWAYS["isp-b"], "table", "100")
    router.wait_for(lambda: rig.via() == GATEWAYS["isp-a"], what="the replaced route healed")
    router.wait_for(lambda: bool(heals()), what="the heal audited")
    assert heals()[0]["paths"] == ["spec.gateways.tables[100].ipv4"]
    assert rig.management_route() == management


def test_dropped_probes_fail_over_and_a_fast_flap_never_moves_the_route(
    rig: WanRig, tmp_path: Path
) -> None:
    router = rig.router
    rig.start(down_after=5)
    management = rig.management_route()
    drop = "add rule inet gwtest input ip saddr 192.0.2.2 icmp type echo-request drop"

    # Probes dropped for 0.6 s out of every 1.6 s: a round or two lost at a time, never the
    # 5 failed rounds in a row (2.5 s) that would take the uplink down.
    flap = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            rig.upstreams["wan0"],
            "sh",
            "-c",
            f"for i in 1 2 3 4 5 6; do nft {drop!r}; sleep 0.6; "
            "nft flush chain inet gwtest input; sleep 1.0; done",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    rig.pingers.append(flap)  # type: ignore[arg-type]
    losses: list[float] = []
    routes: set[str | None] = set()
    while flap.poll() is None:
        routes.add(rig.via())
        for entry in rig.gateways().get("gateways", []):
            if entry["name"] == "isp-a":
                losses.append(entry["loss_percent"])
        time.sleep(0.1)
    assert flap.returncode == 0
    assert max(losses) > 0, "the flap lost no probe at all"
    assert routes == {GATEWAYS["isp-a"]}
    assert not [d for _, d in rig.audit("gateway_state") if d["state"] == "down"]
    assert rig.states()["isp-a"] == "up"

    # Dropped for good: the route moves; the LAN's own traffic never stopped flowing.
    log = tmp_path / "pings.log"
    rig.ping_loop(log)
    router.wait_for(lambda: "ok" in _answers(log), what="the LAN client's pings answered")
    rig.nft("wan0", drop)
    router.wait_for(lambda: rig.via() == GATEWAYS["isp-b"], what="the route via isp-b")
    assert rig.states()["isp-a"] == "down"

    # Both dropped: the last route is kept rather than none, and status says so.
    rig.nft("wan1", drop.replace("192.0.2.2", "192.0.2.18"))
    router.wait_for(
        lambda: rig.states() == {"isp-a": "down", "isp-b": "down"}, what="both gateways down"
    )
    assert rig.via() == GATEWAYS["isp-b"]
    assert rig.gateways()["all_down"] is True
    health = router.api("/v1/status")["subsystems"]["gateways"]
    assert health["health"] == "degraded"
    assert "every IPv4 gateway is down: keeping the default route via isp-b" in health["reason"]

    for link in ("wan0", "wan1"):
        rig.nft(link, "flush chain inet gwtest input")
    router.wait_for(lambda: rig.via() == GATEWAYS["isp-a"], what="the route back via isp-a")
    assert _answers(log).count("lost") <= 30
    assert rig.management_route() == management
    switches = [d["active"] for _, d in rig.audit("gateway_switched")]
    assert switches[-2:] == [{"ipv4": ["isp-b"]}, {"ipv4": ["isp-a"]}]


LISTENER = """
import socket, sys
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind((sys.argv[1], int(sys.argv[2])))
server.listen(64)
while True:
    server.accept()[0].close()
"""


def test_balance_spreads_over_the_healthy_uplinks_by_weight(rig: WanRig) -> None:
    router = rig.router
    # isp-b is probed by TCP connect: it is up only while its upstream accepts.
    listener = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            rig.upstreams["wan1"],
            sys.executable,
            "-c",
            LISTENER,
            HOST,
            "7001",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    rig.pingers.append(listener)
    body = rig.document()
    body["spec"]["gateways"]["policy"] = "balance"
    body["spec"]["gateways"]["uplinks"][1]["weight"] = 3
    body["spec"]["gateways"]["uplinks"][1]["probes"] = {"tcp": [f"{HOST}:7001"]}
    applied = router.trueup("apply", str(router.write("balance.yaml", body)))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    router.start_agent()

    def nexthops() -> list[tuple[str, int]]:
        for route in router.ip_json("route", "show", "table", "100", "default"):
            hops = route.get("nexthops") or [route]
            return sorted((str(h.get("gateway")), int(h.get("weight", 1))) for h in hops)
        return []

    both = [(GATEWAYS["isp-a"], 1), (GATEWAYS["isp-b"], 3)]
    router.wait_for(lambda: nexthops() == both, what="one route over both uplinks, weighted")
    management = rig.management_route()
    sh("ip", "-n", rig.upstreams["wan1"], "link", "set", "wan1p", "down")
    router.wait_for(
        lambda: nexthops() == [(GATEWAYS["isp-a"], 1)], what="the route over isp-a alone"
    )
    assert rig.gateways()["active"] == ["isp-a"]
    sh("ip", "-n", rig.upstreams["wan1"], "link", "set", "wan1p", "up")
    router.wait_for(lambda: nexthops() == both, what="both uplinks again")
    # The port stops accepting (refused): isp-b is down although its link is up.
    listener.kill()
    listener.wait()
    router.wait_for(
        lambda: nexthops() == [(GATEWAYS["isp-a"], 1)], what="isp-b down on its TCP probe"
    )
    assert rig.management_route() == management


def test_probe_routes_carry_only_traffic_bound_to_their_uplink(rig: WanRig) -> None:
    rig.start()
    router = rig.router
    # No trueup-gw route in main: with the gateways in table 100, the router's own unbound
    # traffic still follows main (here the management route), never a probe route.
    assert router.ip_json("route", "show", "table", "main", "proto", "250") == []
    (unbound,) = router.ip_json("route", "get", HOST)
    assert unbound.get("dev") == "mgmt0", unbound
    # A socket bound to the standby uplink (the monitor's probe, `ping -I wan1`) takes
    # that uplink's gateway from the probe table.
    (bound,) = router.ip_json("route", "get", HOST, "oif", "wan1")
    assert (bound.get("gateway"), bound.get("dev")) == (GATEWAYS["isp-b"], "wan1"), bound
    # A LAN client's traffic through the probe table's uplinks: none unless its rule says so.
    (lan,) = router.ip_json("route", "get", HOST, "from", LAN_CLIENT, "iif", "lan0")
    assert (lan.get("gateway"), lan.get("dev")) == (GATEWAYS["isp-a"], "wan0"), lan
    rules = router.ip_json("rule", "show", "table", "4000250")
    assert sorted(str(r.get("oif")) for r in rules) == ["wan0", "wan1"], rules
    # Someone deletes a probe rule: the loop puts it back.
    router.ip("rule", "del", "oif", "wan1", "lookup", "4000250", "pref", "32800")
    router.wait_for(
        lambda: len(router.ip_json("rule", "show", "table", "4000250")) == 2,
        what="the probe rule put back",
    )

    # Without gateways, every probe route and rule is gone.
    body = rig.document()
    del body["spec"]["gateways"]
    applied = router.trueup("apply", str(router.write("none.yaml", body)))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    router.wait_for(
        lambda: router.ip_json("route", "show", "table", "all", "proto", "250") == [],
        what="no trueup-gw route left",
    )
    assert router.ip_json("rule", "show", "table", "4000250") == []
    router.wait_for(lambda: not rig.gateways().get("monitoring"), what="the monitor stopped")


def _threads(pid: int) -> int:
    return sum(1 for _ in Path(f"/proc/{pid}/task").iterdir())


def _sockets(pid: int) -> int:
    fds = Path(f"/proc/{pid}/fd").iterdir()
    return sum(1 for fd in fds if _link(fd).startswith("socket:"))


def _link(fd: Path) -> str:
    try:
        return str(fd.readlink())
    except FileNotFoundError:
        return ""  # closed while we looked


def test_probing_leaks_no_socket_and_its_threads_stop_with_the_gateways(rig: WanRig) -> None:
    rig.start(interval_ms=200)
    router = rig.router
    pid = router.agents[-1].pid
    probing = _threads(pid)
    settled = _sockets(pid)
    # Many rounds, one lost uplink among them: the agent's sockets do not grow.
    rig.nft("wan0", "add rule inet gwtest input icmp type echo-request drop")
    router.wait_for(lambda: rig.states()["isp-a"] == "down", what="isp-a down")
    rig.nft("wan0", "flush chain inet gwtest input")
    router.wait_for(lambda: rig.states()["isp-a"] == "up", what="isp-a up again")
    assert _sockets(pid) <= settled + 2, (settled, _sockets(pid))

    body = rig.document()
    del body["spec"]["gateways"]
    applied = router.trueup("apply", str(router.write("none.yaml", body)))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    # The two probing threads (one per uplink) end with the section.
    router.wait_for(lambda: _threads(pid) <= probing - 2, what="the monitor's threads gone")


def test_a_tcp_target_that_never_answers_delays_neither_status_nor_the_other_uplink(
    rig: WanRig,
) -> None:
    # isp-a's TCP target drops every SYN upstream: each of its rounds waits its whole timeout.
    rig.nft("wan0", "add rule inet gwtest input tcp dport 7002 drop")
    body = rig.document()
    body["spec"]["gateways"]["uplinks"][0]["probes"] = {"tcp": [f"{HOST}:7002"]}
    router = rig.router
    applied = router.trueup("apply", str(router.write("hang.yaml", body)))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    router.start_agent()
    router.wait_for(
        lambda: rig.states() == {"isp-a": "down", "isp-b": "up"},
        what="isp-a down on its silent TCP target, isp-b up",
    )
    assert rig.via() == GATEWAYS["isp-b"]
    # Status keeps answering while isp-a's probes hang, and isp-b stays up throughout.
    for _ in range(10):
        shown = rig.gateways()
        assert [g["state"] for g in shown["gateways"]] == ["down", "up"], shown
        assert shown["active"] == ["isp-b"], shown
    # The target answers again: isp-a's probes were never stuck on the dropped SYNs.
    upstream = rig.upstreams["wan0"]
    listener = subprocess.Popen(
        ["ip", "netns", "exec", upstream, sys.executable, "-c", LISTENER, HOST, "7002"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    rig.pingers.append(listener)
    rig.nft("wan0", "flush chain inet gwtest input")
    router.wait_for(lambda: rig.states()["isp-a"] == "up", what="isp-a up on its TCP target")
    router.wait_for(lambda: rig.via() == GATEWAYS["isp-a"], what="the route back on isp-a")


HOST6 = "2001:db8:ff::100"
GATEWAYS6 = {"isp-a6": ("wan0", "2001:db8:a::1"), "isp-b6": ("wan1", "2001:db8:b::1")}


def test_ipv6_uplinks_probe_through_their_rule_and_fail_over(rig: WanRig) -> None:
    router = rig.router
    for link, gateway in GATEWAYS6.values():
        ns = rig.upstreams[link]
        sh("ip", "-n", ns, "addr", "add", f"{HOST6}/128", "dev", "lo")
        sh("ip", "-n", ns, "addr", "add", f"{gateway}/64", "dev", f"{link}p", "nodad")
    body = rig.document()
    for iface, prefix in zip(body["spec"]["interfaces"][1:], ("a", "b"), strict=True):
        iface["addresses"].append(f"2001:db8:{prefix}::2/64")
    for priority, (name, (link, gateway)) in enumerate(GATEWAYS6.items(), start=1):
        body["spec"]["gateways"]["uplinks"].append(
            {
                **body["spec"]["gateways"]["uplinks"][0],
                "name": name,
                "interface": link,
                "gateway": gateway,
                "priority": priority,
                "probes": {"icmp": [HOST6]},
            }
        )
    applied = router.trueup("apply", str(router.write("dual.yaml", body)))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    router.start_agent()
    # The standby's probes find their gateway through the probe rule: all four up.
    router.wait_for(
        lambda: set(rig.states().values()) == {"up"} and len(rig.states()) == 4,
        what="every uplink up, IPv4 and IPv6",
    )

    def via6() -> str | None:
        for route in router.ip_json("-6", "route", "show", "table", "100", "default"):
            return str(route.get("gateway"))
        return None

    assert via6() == GATEWAYS6["isp-a6"][1]
    # Unbound IPv6 traffic has no default route in main: none through a probe route.
    unbound = sh("ip", "-n", router.name, "-6", "route", "get", HOST6, check=False)
    assert unbound.returncode != 0, unbound.stdout
    # isp-a6's upstream drops the echo requests: IPv6 moves to isp-b6, IPv4 stays.
    rig.nft("wan0", "add rule inet gwtest input icmpv6 type echo-request drop")
    router.wait_for(lambda: via6() == GATEWAYS6["isp-b6"][1], what="IPv6 via isp-b6")
    assert rig.via() == GATEWAYS["isp-a"]
    assert rig.gateways()["active"] == ["isp-a", "isp-b6"]


def test_a_bad_gateways_section_is_refused_at_its_paths_by_plan_and_apply(rig: WanRig) -> None:
    rig.start()
    router = rig.router
    routes = router.ip_json("route", "show", "table", "all", "proto", "250")
    rules = router.ip_json("rule", "show", "table", "4000250")
    body = rig.document()
    body["spec"]["gateways"]["uplinks"][0]["gateway"] = "192.0.2.33"
    body["spec"]["gateways"]["uplinks"][1]["probes"] = {"tcp": [HOST]}
    body["spec"]["gateways"]["tables"] = ["isp"]
    bad = router.write("bad.yaml", body)
    for command in ("plan", "apply"):
        shown = router.trueup(command, str(bad))
        out = shown.stdout + shown.stderr
        assert shown.returncode == 1, out
        assert "bad.yaml" in out, out
        assert "spec.gateways.uplinks[1].probes.tcp[0]: '203.0.113.100' is not HOST:PORT" in out
    # The cross-section problems once the section itself is well formed.
    body["spec"]["gateways"]["uplinks"][1]["probes"] = {"tcp": [f"{HOST}:443"]}
    bad = router.write("bad.yaml", body)
    shown = router.trueup("apply", str(bad))
    out = shown.stdout + shown.stderr
    assert shown.returncode == 1, out
    for line in (
        "spec.gateways.uplinks[0].gateway: 192.0.2.33 is not on a subnet of wan0",
        "spec.gateways.tables[0]: unknown table 'isp'; name it in spec.tables",
    ):
        assert line in out, out
    assert router.ip_json("route", "show", "table", "all", "proto", "250") == routes
    assert router.ip_json("rule", "show", "table", "4000250") == rules
    assert rig.states() == {"isp-a": "up", "isp-b": "up"}
