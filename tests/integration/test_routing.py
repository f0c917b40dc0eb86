"""Dynamic routing on real FRR: two routers peer eBGP over veths, each run by its own trueup agent.

Topology (every namespace named per test, removed by name at the end):

    router A  wan0 192.0.2.1/30 ─── wan0 192.0.2.2/30  router B
              wan1 192.0.2.5/30 ─── wan1 192.0.2.6/30
    lan0 203.0.113.1/25 (AS 64601)     lan0 203.0.113.129/25 (AS 64602)

Two sessions between them (one per link): one can change while the other is
watched for a reset. Below them, three routers in a triangle run OSPFv2 and
OSPFv3. Every FRR daemon is killed at the end by the verified pid of its
supervisor record.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_hostage import StatusPoller
from tests.routers import TRUEUP, Router, base_document, require_root
from trueup.system.frr import frr_paths
from trueup.system.pidrecord import verified_pid

pytestmark = pytest.mark.root

SIDES = {
    "a": {"asn": 64601, "lan": "203.0.113.1/25", "wan0": "192.0.2.1/30", "wan1": "192.0.2.5/30"},
    "b": {"asn": 64602, "lan": "203.0.113.129/25", "wan0": "192.0.2.2/30", "wan1": "192.0.2.6/30"},
}
STATIC = "192.0.2.128/25"
PEERS = {"a": ("192.0.2.2", "192.0.2.6"), "b": ("192.0.2.1", "192.0.2.5")}


def bgp_document(side: str, **neighbor: Any) -> dict[str, Any]:
    mine, other = SIDES[side], SIDES["b" if side == "a" else "a"]
    first, second = PEERS[side]
    neighbors = [
        {
            "address": first,
            "remote_as": other["asn"],
            "description": "one",
            "timers": {"keepalive": 1, "hold": 3},
        },
        {
            "address": second,
            "remote_as": other["asn"],
            "description": "two",
            "timers": {"keepalive": 1, "hold": 3},
        },
    ]
    neighbors[0].update(neighbor)
    lan = mine["lan"]
    networks = [lan.rsplit(".", 1)[0] + (".0/25" if side == "a" else ".128/25")]
    addresses = [lan]
    routes: list[dict[str, Any]] = []
    if side == "b":  # B also announces a prefix A's document routes statically
        addresses.append("192.0.2.129/25")
        networks.append(STATIC)
    else:
        routes.append({"to": STATIC, "via": "192.0.2.6"})
    return base_document(
        interfaces=[
            {"name": "lan0", "addresses": addresses},
            {"name": "wan0", "addresses": [mine["wan0"]]},
            {"name": "wan1", "addresses": [mine["wan1"]]},
        ],
        routes=routes,
        tables={},
        routing={
            "router_id": mine["wan0"].split("/")[0],
            "bgp": {
                "asn": mine["asn"],
                "neighbors": neighbors,
                "ipv4_unicast": {"networks": networks},
            },
        },
    )


class Pair:
    """Two routers, their wan links joined by veths."""

    def __init__(self, workdir: Path) -> None:
        for side in ("a", "b"):
            (workdir / side).mkdir()
        self.a = Router(workdir / "a", links=("mgmt0", "lan0", "wan0", "wan1"))
        self.b = Router(workdir / "b", links=("mgmt0", "lan0"))
        for link in ("wan0", "wan1"):
            self.a.ip("link", "set", f"{link}p", "netns", self.b.name)
            self.b.ip("link", "set", f"{link}p", "name", link)

    def routers(self) -> tuple[Router, Router]:
        return self.a, self.b

    def close(self) -> None:
        for router in (self.a, self.b):
            router.stop_agents(signal.SIGKILL)
            kill_daemons(router)
            router.close()


def kill_daemons(router: Router) -> None:
    """SIGKILL every daemon the agent started, by the verified pid of its record."""
    for record in router.state_dir.glob("run/*/*.pid"):
        try:
            pid = verified_pid(json.loads(record.read_text()))
        except (OSError, ValueError):
            continue
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 60
            while verified_pid(json.loads(record.read_text())) and time.monotonic() < deadline:
                time.sleep(0.05)


def vtysh(router: Router, *commands: str) -> str:
    paths = frr_paths(router.state_dir / "run" / "frr")
    argv = ["vtysh", "--config_dir", str(paths.run_dir), "--vty_socket", str(paths.sockets)]
    for command in commands:
        argv += ["-c", command]
    done = router.run(*argv)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def peers(router: Router) -> dict[str, Any]:
    try:
        summary = json.loads(vtysh(router, "show bgp summary json") or "{}")
    except (AssertionError, ValueError):
        return {}
    return dict(summary.get("ipv4Unicast", {}).get("peers", {}))


def established(router: Router) -> bool:
    found = peers(router)
    return len(found) == 2 and all(p.get("state") == "Established" for p in found.values())


def bgp_routes(router: Router) -> list[str]:
    shown = router.ip_json("-4", "route", "show", "proto", "bgp")
    return sorted(r["dst"] for r in shown)


def heals(router: Router) -> list[dict[str, Any]]:
    lines = (router.state_dir / "audit.jsonl").read_text().splitlines()
    return [
        r["details"]
        for r in map(json.loads, lines)
        if r["event"] == "reconcile" and r["details"].get("subsystem") == "routing"
    ]


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    require_root()
    both = Pair(tmp_path)
    try:
        yield both
    finally:
        both.close()


def apply(router: Router, name: str, document: dict[str, Any]) -> Any:
    return router.trueup("apply", str(router.write(name, document)), timeout=180)


def test_ebgp_exchanges_prefixes_changes_one_neighbor_alone_and_heals_a_vtysh_edit(
    pair: Pair,
) -> None:
    a, b = pair.routers()
    for side, router in (("a", a), ("b", b)):
        done = apply(router, "v1.yaml", bgp_document(side))
        assert done.returncode == 0, done.stdout + done.stderr
    a.wait_for(lambda: established(a) and established(b), what="both sessions established")
    a.wait_for(lambda: bgp_routes(a) == ["203.0.113.128/25"], what="B's prefix in A's kernel")
    b.wait_for(lambda: bgp_routes(b) == ["203.0.113.0/25"], what="A's prefix in B's kernel")
    # B announces STATIC too, but A's document routes it: zebra installs no competing route.
    a.wait_for(lambda: STATIC in vtysh(a, "show bgp ipv4 unicast"), what="STATIC learnt by A")
    assert f"{STATIC} via 192.0.2.6" in a.routes()
    # Routes FRR installs are the routing daemon's, never drift for the routes subsystem.
    for router in (a, b):
        drift = router.trueup("drift")
        assert drift.returncode == 0, drift.stdout
    run = a.state_dir / "run" / "frr"
    assert run.stat().st_mode & 0o777 == 0o700
    assert (run / "frr.conf").stat().st_mode & 0o777 == 0o600

    a.start_agent()
    status = a.api("/v1/status")["subsystems"]["routing"]
    assert status["tier"] == "routing" and status["health"] == "ok"
    system = status["system"]
    assert system["daemons"] == ["zebra", "bgpd"]
    assert {p: s[0]["state"] for p, s in system["bgp"].items()} == {
        "192.0.2.2": "Established",
        "192.0.2.6": "Established",
    }

    # One neighbour's description and timers change: the other session is not reset.
    other = peers(a)["192.0.2.6"]
    changed = bgp_document("a", description="one, changed", timers={"keepalive": 2, "hold": 6})
    done = apply(a, "v2.yaml", changed)
    assert done.returncode == 0, done.stdout + done.stderr
    running = vtysh(a, "show running-config")
    assert "neighbor 192.0.2.2 description one, changed" in running
    assert "neighbor 192.0.2.2 timers 2 6" in running
    after = peers(a)["192.0.2.6"]
    assert after["connectionsEstablished"] == other["connectionsEstablished"]
    assert after["peerUptimeMsec"] > other["peerUptimeMsec"]  # the same session, older
    assert after["state"] == "Established"

    # Behind trueup's back, through vtysh: a neighbour shut down. Drift, healed.
    vtysh(a, "configure terminal", "router bgp 64601", "neighbor 192.0.2.6 shutdown")
    a.wait_for(lambda: bool(heals(a)), what="the vtysh edit healed", timeout=60)
    assert heals(a)[0]["outcome"] == "healed"
    assert "spec.routing.config" in heals(a)[0]["paths"]
    assert "shutdown" not in vtysh(a, "show running-config")
    a.wait_for(lambda: established(a), what="the session back")


def test_a_configuration_frr_refuses_changes_nothing_and_names_the_path(pair: Pair) -> None:
    a = pair.a
    done = apply(a, "v1.yaml", bgp_document("a"))
    assert done.returncode == 0, done.stdout + done.stderr
    before = vtysh(a, "show running-config")
    bad = bgp_document("a", route_map_out="out")
    bad["spec"]["routing"]["route_maps"] = [
        {
            "name": "out",
            "entries": [{"seq": 10, "action": "permit", "set": {"community": "64601:70000"}}],
        }
    ]
    refused = apply(a, "bad.yaml", bad)
    said = refused.stdout + refused.stderr
    assert refused.returncode != 0, said
    assert "spec.routing.route_maps[0].entries[0].set.community" in said
    assert "Malformed communities attribute '64601:70000'" in said
    assert vtysh(a, "show running-config") == before
    assert a.trueup("drift").returncode == 0


def test_an_agent_killed_during_an_frr_apply_leaves_the_old_or_the_new_configuration(
    pair: Pair,
) -> None:
    a, _b = pair.routers()
    done = apply(a, "v1.yaml", bgp_document("a"))
    assert done.returncode == 0, done.stdout + done.stderr
    old = vtysh(a, "show running-config")
    agent = a.start_agent()
    new_document = bgp_document("a", description="renamed", timers={"keepalive": 2, "hold": 6})
    path = a.write("v2.yaml", new_document)
    # The apply goes to the agent; the agent is killed once the transaction has begun.
    applying = a.spawn(*TRUEUP, "apply", str(path), "--state-dir", str(a.state_dir))
    confdir = str(a.state_dir / "run" / "frr")

    def reloading() -> bool:
        """frr-reload.py runs for this router (its --confdir is this state directory's)."""
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                words = cmdline.read_bytes().split(b"\0")
            except OSError:
                continue
            if any(w.endswith(b"frr-reload.py") for w in words) and confdir.encode() in words:
                return True
        return False

    a.wait_for(reloading, what="FRR's reload under way", proc=agent)
    agent.send_signal(signal.SIGKILL)
    agent.wait(timeout=30)
    applying.wait(timeout=60)
    a.agents.clear()
    a.start_agent()
    a.wait_for(lambda: a.trueup("drift").returncode == 0, what="no drift after recovery")
    running = vtysh(a, "show running-config")
    has_new = "neighbor 192.0.2.2 description renamed" in running
    has_old = "neighbor 192.0.2.2 description one" in running
    assert has_new != has_old, running
    if has_new:
        assert "neighbor 192.0.2.2 timers 2 6" in running
    else:
        assert running == old


# -- OSPFv2 and OSPFv3: three routers in a triangle ------------------------------------
#
#   A wan0 192.0.2.1/30 ── B wan0 192.0.2.2/30
#   B wan1 192.0.2.5/30 ── C wan1 192.0.2.6/30
#   A wan1 192.0.2.9/30 ── C wan0 192.0.2.10/30
#   LANs: A 203.0.113.1/26, B 203.0.113.65/26, C 203.0.113.129/26 (passive)
TRIANGLE = {
    "a": {
        "lan": "203.0.113.1/26",
        "lan6": "2001:db8:a::1/64",
        "wan0": "192.0.2.1/30",
        "wan1": "192.0.2.9/30",
    },
    "b": {
        "lan": "203.0.113.65/26",
        "lan6": "2001:db8:b::1/64",
        "wan0": "192.0.2.2/30",
        "wan1": "192.0.2.5/30",
    },
    "c": {
        "lan": "203.0.113.129/26",
        "lan6": "2001:db8:c::1/64",
        "wan0": "192.0.2.10/30",
        "wan1": "192.0.2.6/30",
    },
}


def ospf_document(side: str) -> dict[str, Any]:
    mine = TRIANGLE[side]
    link = {"cost": 10, "network": "point-to-point", "hello": 1, "dead": 4}
    areas = [
        {
            "id": 0,
            "interfaces": [
                {"name": "lan0", "passive": True},
                {"name": "wan0", **link},
                {"name": "wan1", **link},
            ],
        }
    ]
    return base_document(
        interfaces=[
            {"name": "lan0", "addresses": [mine["lan"], mine["lan6"]]},
            {"name": "wan0", "addresses": [mine["wan0"]]},
            {"name": "wan1", "addresses": [mine["wan1"]]},
        ],
        routes=[],
        tables={},
        routing={
            "router_id": mine["wan0"].split("/")[0],
            "ospf": {"areas": areas},
            "ospf6": {"areas": copy.deepcopy(areas)},
        },
    )


class Triangle:
    def __init__(self, workdir: Path) -> None:
        links = ("mgmt0", "lan0", "wan0", "wan1")
        self.routers: dict[str, Router] = {}
        for side in ("a", "b", "c"):
            (workdir / side).mkdir()
            self.routers[side] = Router(workdir / side, links=links)
        # Each pair's ends meet: the far router's peer end replaces its own link.
        for near, near_link, far, far_link in (
            ("a", "wan0", "b", "wan0"),
            ("b", "wan1", "c", "wan1"),
            ("a", "wan1", "c", "wan0"),
        ):
            self.routers[far].ip("link", "del", far_link)
            self.routers[near].ip("link", "set", f"{near_link}p", "netns", self.routers[far].name)
            self.routers[far].ip("link", "set", f"{near_link}p", "name", far_link)

    def close(self) -> None:
        for router in self.routers.values():
            router.stop_agents(signal.SIGKILL)
            kill_daemons(router)
            router.close()


@pytest.fixture
def triangle(tmp_path: Path) -> Iterator[Triangle]:
    require_root()
    three = Triangle(tmp_path)
    try:
        yield three
    finally:
        three.close()


def ospf_route(router: Router, prefix: str) -> list[str]:
    """The devices of the OSPF (or OSPFv3) route to `prefix` in the kernel."""
    family = "-6" if ":" in prefix else "-4"
    shown = router.ip_json(family, "route", "show", prefix, "proto", "ospf")
    return sorted(r.get("dev", "") for r in shown)


def test_ospf_adjacencies_routes_and_a_link_down_rerouted(triangle: Triangle) -> None:
    routers = triangle.routers
    for side, router in routers.items():
        done = apply(router, "ospf.yaml", ospf_document(side))
        assert done.returncode == 0, done.stdout + done.stderr
    a = routers["a"]
    a.start_agent()

    def adjacencies(version: str = "ospf") -> list[tuple[str, str]]:
        system = a.api("/v1/status").get("subsystems", {}).get("routing", {}).get("system", {})
        return sorted((n["interface"], n["state"].split("/")[0]) for n in system.get(version, []))

    for version in ("ospf", "ospf6"):
        a.wait_for(
            lambda v=version: adjacencies(v) == [("wan0", "Full"), ("wan1", "Full")],
            what=f"A's two {version} adjacencies Full in status",
        )
    a.wait_for(lambda: ospf_route(a, "203.0.113.128/26") == ["wan1"], what="C's LAN direct")
    a.wait_for(lambda: ospf_route(a, "203.0.113.64/26") == ["wan0"], what="B's LAN direct")
    a.wait_for(lambda: ospf_route(a, "2001:db8:c::/64") == ["wan1"], what="C's LAN6 direct")
    assert a.trueup("drift").returncode == 0
    # The A-C link goes down at C's end (C runs no agent to bring it back).
    routers["c"].ip("link", "set", "wan0", "down")
    a.wait_for(lambda: ospf_route(a, "203.0.113.128/26") == ["wan0"], what="C's LAN through B")
    a.wait_for(lambda: ospf_route(a, "2001:db8:c::/64") == ["wan0"], what="C's LAN6 through B")
    a.wait_for(lambda: adjacencies() == [("wan0", "Full")], what="the lost adjacency gone")
    status = a.api("/v1/status")["subsystems"]["routing"]
    assert status["health"] == "ok"  # a neighbour lost is the network's news, not a failure


def test_a_killed_bgpd_is_restarted_and_its_configuration_put_back(pair: Pair) -> None:
    a = pair.a
    done = apply(a, "v1.yaml", bgp_document("a"))
    assert done.returncode == 0, done.stdout + done.stderr
    a.start_agent()
    record = a.state_dir / "run" / "frr-bgpd" / "frr-bgpd.pid"
    first = verified_pid(json.loads(record.read_text()))
    assert first is not None
    os.kill(first, signal.SIGKILL)

    def back() -> bool:
        pid = verified_pid(json.loads(record.read_text()))
        if pid is None or pid == first:
            return False
        try:
            configured = "router bgp 64601" in vtysh(a, "show running-config")
        except AssertionError:
            return False
        return configured and a.trueup("drift").returncode == 0

    # The supervisor starts it again (empty); the next look sees the configuration gone.
    a.wait_for(back, what="bgpd restarted with its configuration, no drift", timeout=90)
    assert a.api("/v1/health/management").get("ready") is True


def test_bfd_on_a_neighbor_runs_bfdd_and_its_session_comes_up(pair: Pair) -> None:
    a, b = pair.routers()
    for side, router in (("a", a), ("b", b)):
        done = apply(router, "bfd.yaml", bgp_document(side, bfd=True))
        assert done.returncode == 0, done.stdout + done.stderr

    def bfd_up() -> bool:
        try:
            sessions = json.loads(vtysh(a, "show bfd peers json") or "[]")
        except (AssertionError, ValueError):
            return False
        return [(s.get("peer"), s.get("status")) for s in sessions] == [("192.0.2.2", "up")]

    a.wait_for(bfd_up, what="A's BFD session with B up")
    assert (a.state_dir / "run" / "frr-bfdd" / "frr-bfdd.pid").exists()
    assert a.trueup("drift").returncode == 0


def test_a_configuration_frr_refuses_at_start_fails_routing_alone(tmp_path: Path) -> None:
    require_root()
    router = Router(tmp_path, links=("mgmt0", "lan0", "wan0", "wan1"))
    try:
        bad = bgp_document("a", route_map_out="out")
        bad["spec"]["routing"]["route_maps"] = [
            {"name": "out", "entries": [{"seq": 10, "action": "permit",
                                        "set": {"community": "64601:70000"}}]}
        ]  # fmt: skip
        router.start_agent("--config", str(router.write("bad.yaml", bad)), wait_started=False)
        assert router.api("/v1/health/management").get("ready") is True

        def routing_health() -> str:
            services = router.api("/v1/health/services").get("subsystems", {})
            return str(services.get("routing", {}).get("health", ""))

        router.wait_for(lambda: routing_health() == "failed", what="routing failed", timeout=60)
        services = router.api("/v1/health/services")["subsystems"]
        assert "Malformed communities attribute '64601:70000'" in services["routing"]["reason"]
        assert services["addresses"]["health"] == "ok"
        assert services["management"]["health"] == "ok"
        assert "192.0.2.1/30" in router.addresses("wan0")
        assert router.api("/v1/health/management").get("ready") is True
    finally:
        router.stop_agents(signal.SIGKILL)
        kill_daemons(router)
        router.close()


def test_rollback_is_exact_a_restart_keeps_sessions_and_removal_takes_frrs_routes(
    pair: Pair,
) -> None:
    a, b = pair.routers()
    for side, router in (("a", a), ("b", b)):
        done = apply(router, "v1.yaml", bgp_document(side))
        assert done.returncode == 0, done.stdout + done.stderr
    a.wait_for(lambda: established(a) and established(b), what="both sessions established")
    a.wait_for(lambda: bgp_routes(a) == ["203.0.113.128/25"], what="B's prefix in A's kernel")
    before = vtysh(a, "show running-config")

    # A change, then a rollback: FRR runs exactly the configuration it ran before.
    changed = bgp_document("a", description="one, changed", timers={"keepalive": 2, "hold": 6})
    done = apply(a, "v2.yaml", changed)
    assert done.returncode == 0, done.stdout + done.stderr
    assert vtysh(a, "show running-config") != before
    done = a.trueup("rollback", timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert vtysh(a, "show running-config") == before
    a.wait_for(lambda: established(a), what="A's sessions after the rollback")

    # The agent starts over a running FRR in its configuration: no reload, no reset.
    sessions = {p: s["connectionsEstablished"] for p, s in peers(a).items()}
    a.start_agent()
    a.wait_for(
        lambda: a.api("/v1/status")["subsystems"]["routing"]["health"] == "ok",
        what="routing ok under the agent",
    )
    assert a.trueup("drift").returncode == 0
    assert {p: s["connectionsEstablished"] for p, s in peers(a).items()} == sessions
    assert heals(a) == []

    # No spec.routing: the daemons stop and the routes zebra installed leave the kernel.
    config = base_document(
        interfaces=[
            {"name": "lan0", "addresses": [SIDES["a"]["lan"]]},
            {"name": "wan0", "addresses": [SIDES["a"]["wan0"]]},
            {"name": "wan1", "addresses": [SIDES["a"]["wan1"]]},
        ],
        routes=[{"to": STATIC, "via": "192.0.2.6"}],
        tables={},
    )
    done = apply(a, "v3.yaml", config)
    assert done.returncode == 0, done.stdout + done.stderr
    a.wait_for(lambda: bgp_routes(a) == [], what="BGP's routes gone from A's kernel")
    status = a.api("/v1/status")["subsystems"].get("routing", {})
    assert not status.get("system", {}).get("daemons"), status
    assert f"{STATIC} via 192.0.2.6" in a.routes()


def test_status_answers_while_bgpd_is_hung_and_marks_routing_stale(pair: Pair) -> None:
    a = pair.a
    done = apply(a, "v1.yaml", bgp_document("a"))
    assert done.returncode == 0, done.stdout + done.stderr
    a.start_agent()
    record = a.state_dir / "run" / "frr-bgpd" / "frr-bgpd.pid"
    pid = verified_pid(json.loads(record.read_text()))
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)  # alive, its socket accepts, it answers nothing: hung
    try:
        with StatusPoller(a) as poller:
            a.wait_for(
                lambda: (
                    bool(poller.bodies)
                    and bool(poller.bodies[-1]["subsystems"]["routing"].get("stale"))
                ),
                what="routing's look marked stale",
                timeout=90,
            )
            a.wait_for(lambda: len(poller.latencies) >= 20, what="20 answers while bgpd hangs")
        poller.check()
        assert "routing" in poller.bodies[-1]["stale"]
        assert a.api("/v1/health/management").get("ready") is True
        table = a.trueup("status")
        assert "STALE" in table.stdout, table.stdout
    finally:
        os.kill(pid, signal.SIGCONT)


def test_a_newcomers_mistakes_are_refused_by_plan_and_apply_naming_file_and_path(
    pair: Pair,
) -> None:
    a = pair.a
    done = apply(a, "v1.yaml", bgp_document("a"))
    assert done.returncode == 0, done.stdout + done.stderr
    a.start_agent()
    before = vtysh(a, "show running-config")
    bad = bgp_document("a", remote_as=4294967296)
    bad["spec"]["routing"]["bgp"]["ipv4_unicast"]["redistribute"] = ["ospf"]
    del bad["spec"]["routing"]["bgp"]["neighbors"][1]["remote_as"]
    path = a.write("bad.yaml", bad)
    for command in ("plan", "apply"):
        refused = a.trueup(command, str(path), timeout=180)
        said = refused.stdout + refused.stderr
        assert refused.returncode != 0, said
        assert str(path) in said, said
        assert "spec.routing.bgp.neighbors[0].remote_as: 4294967296 is not an AS number" in said, (
            said
        )
        assert "spec.routing.bgp.neighbors[1].remote_as: required field is missing" in said, said
    bad["spec"]["routing"]["bgp"]["neighbors"][0]["remote_as"] = 64602
    bad["spec"]["routing"]["bgp"]["neighbors"][1]["remote_as"] = 64602
    refused = a.trueup("apply", str(a.write("bad2.yaml", bad)), timeout=180)
    said = refused.stdout + refused.stderr
    assert refused.returncode != 0, said
    assert (
        "spec.routing.bgp.ipv4_unicast.redistribute: ospf in ipv4_unicast is OSPFv2, and "
        "spec.routing.ospf is not given" in said
    ), said
    assert vtysh(a, "show running-config") == before
