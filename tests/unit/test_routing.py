"""The routing subsystem on fakes: section paths, the rendered frr.conf, plans, steps, refusals, drift."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.routers import base_document
from trueup.model.document import DeviceState, DocumentError, parse_document
from trueup.subsystems.base import StepError
from trueup.subsystems.registry import scope_for
from trueup.subsystems.routes import RoutesSubsystem
from trueup.subsystems.routing.observe import bgp_peers, ospf6_neighbors, ospf_neighbors
from trueup.subsystems.routing.render import bgp_part, daemons_for, render
from trueup.subsystems.routing.section import RoutingSection
from trueup.subsystems.routing.subsystem import CONFIG, DAEMONS, RoutingSubsystem
from trueup.system.fake import FakeDaemons, FakeFiles, FakeNetlink
from trueup.system.frr import normalise
from trueup.system.netlink import RouteInfo
from trueup.system.runner import Completed
from trueup.system.secretstore import write_secret
from trueup.system.sources import Sources

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "routing" / "frr.conf"


def routing(**extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "router_id": "192.0.2.1",
        "bgp": {
            "asn": 64512,
            "neighbors": [
                {
                    "address": "198.51.100.9",
                    "remote_as": 64513,
                    "description": "upstream one",
                    "timers": {"keepalive": 3, "hold": 9},
                    "bfd": True,
                    "password": {"secret_ref": "bgp-up"},
                    "route_map_in": "from-up",
                    "route_map_out": "to-up",
                    "families": ["ipv4_unicast", "ipv6_unicast"],
                },
                {"address": "2001:db8::9", "remote_as": 64512},
            ],
            "ipv4_unicast": {
                "networks": ["203.0.113.0/24"],
                "redistribute": ["connected", "static", "ospf"],
            },
            "ipv6_unicast": {"networks": ["2001:db8:1::/48"], "redistribute": ["ospf"]},
        },
        "ospf": {
            "redistribute": ["bgp"],
            "areas": [
                {
                    "id": 0,
                    "interfaces": [
                        {
                            "name": "lan0",
                            "cost": 10,
                            "bfd": True,
                            "network": "point-to-point",
                            "hello": 1,
                            "dead": 4,
                        }
                    ],
                }
            ],
        },
        "ospf6": {"areas": [{"id": "0.0.0.1", "interfaces": [{"name": "lan0", "passive": True}]}]},
        "prefix_lists": [
            {
                "name": "ours",
                "entries": [{"seq": 5, "action": "permit", "prefix": "203.0.113.0/24", "le": 32}],
            },
            {
                "name": "long6",
                "entries": [
                    {"seq": 5, "action": "deny", "prefix": "2001:db8::/32", "ge": 49, "le": 64}
                ],
            },
        ],
        "route_maps": [
            {
                "name": "to-up",
                "entries": [
                    {
                        "seq": 10,
                        "action": "permit",
                        "match": {"prefix_list": "ours"},
                        "set": {
                            "community": "64512:100",
                            "local_preference": 200,
                            "as_path_prepend": [64512, 64512],
                        },
                    }
                ],
            },
            {
                "name": "from-up",
                "entries": [
                    {"seq": 10, "action": "deny", "match": {"prefix_list": "long6"}},
                    {"seq": 20, "action": "permit", "set": {"metric": 5}},
                ],
            },
        ],
    }
    out.update(extra)
    return out


def document(section: dict[str, Any] | None = None, **spec: Any) -> DeviceState:
    return parse_document(base_document(routing=section or routing(), **spec))


def problems(section: dict[str, Any], **spec: Any) -> list[str]:
    with pytest.raises(DocumentError) as refused:
        document(section, **spec)
    return refused.value.problems


# -- the section ------------------------------------------------------------------
def test_every_refusal_names_its_path() -> None:
    bad = routing(router_id="2001:db8::1")
    bad["bgp"]["neighbors"][1]["timers"] = {"keepalive": 10, "hold": 5}
    bad["bgp"]["neighbors"][0]["password"] = "hunter2"
    bad["prefix_lists"][0]["entries"][0]["le"] = 20
    found = problems(bad)
    assert (
        "spec.routing.router_id: '2001:db8::1' is not an IPv4 address (a router id is one)" in found
    )
    assert any(p.startswith("spec.routing.bgp.neighbors[1].timers.hold:") for p in found)
    assert any(
        p.startswith("spec.routing.bgp.neighbors[0].password: a literal password is refused")
        for p in found
    )
    assert "spec.routing.prefix_lists[0].entries[0].le: 20 is not between 25 and 32" in found


def test_a_duplicate_neighbor_is_refused_an_ibgp_one_is_not() -> None:
    section = routing()
    section["bgp"]["neighbors"].append({"address": "198.51.100.9", "remote_as": 64512})
    assert problems(section) == [
        "spec.routing.bgp.neighbors[2].address: 198.51.100.9 is already neighbors[0]"
    ]
    section["bgp"]["neighbors"][2]["address"] = "198.51.100.10"
    assert document(section).spec.section("routing", RoutingSection) is not None


def test_missing_names_are_refused_where_they_are_named() -> None:
    section = routing()
    section["route_maps"][0]["entries"][0]["match"]["prefix_list"] = "nowhere"
    section["bgp"]["neighbors"][0]["route_map_in"] = "absent"
    assert problems(section) == [
        "spec.routing.route_maps[0].entries[0].match.prefix_list: no prefix list nowhere in "
        "spec.routing.prefix_lists",
        "spec.routing.bgp.neighbors[0].route_map_in: no route map absent in spec.routing.route_maps",
    ]


def test_an_ospf_interface_must_be_the_documents() -> None:
    section = routing()
    section["ospf"]["areas"][0]["interfaces"].append({"name": "eth9"})
    assert problems(section) == [
        "spec.routing.ospf.areas[0].interfaces[1].name: eth9 is not in spec.interfaces (OSPF "
        "runs on interfaces the document manages)"
    ]


def test_families_and_duplicates_inside_the_section() -> None:
    section = routing()
    section["bgp"]["ipv4_unicast"]["networks"].append("2001:db8:5::/48")
    section["prefix_lists"][0]["entries"].append(
        {"seq": 5, "action": "deny", "prefix": "2001:db8::/32"}
    )
    section["ospf"]["areas"].append({"id": "0.0.0.0", "interfaces": [{"name": "lan0"}]})
    found = problems(section)
    assert (
        "spec.routing.bgp.ipv4_unicast.networks[1]: 2001:db8:5::/48 is not an IPv4 network" in found
    )
    assert "spec.routing.prefix_lists[0].entries[1].seq: seq 5 is already entries[0]" in found
    assert (
        "spec.routing.prefix_lists[0].entries[1].prefix: a prefix list is one family: IPv4 here"
        in found
    )
    assert "spec.routing.ospf.areas[1].id: area 0.0.0.0 is already areas[0]" in found
    assert (
        "spec.routing.ospf.areas[1].interfaces[0].name: lan0 is already areas[0].interfaces[0]"
        in found
    )


def test_networks_in_normal_form_and_their_family_however_often_validated() -> None:
    for _ in range(2):  # the second validation is the remembered one: the same answers
        section = routing()
        section["bgp"]["ipv4_unicast"]["networks"].append("203.0.113.1/24")
        assert problems(section) == [
            "spec.routing.bgp.ipv4_unicast.networks[1]: '203.0.113.1/24' is not an IPv4/IPv6 "
            "network: 203.0.113.1/24 has host bits set"
        ]
        section = routing()
        section["bgp"]["ipv6_unicast"]["networks"] = [" 2001:DB8:0001::/48", "203.0.113.0/24"]
        assert (
            "spec.routing.bgp.ipv6_unicast.networks[1]: 203.0.113.0/24 is not an IPv6 network"
            in problems(section)
        )
        section["bgp"]["ipv6_unicast"]["networks"].pop()
        parsed = document(section).spec.routing
        assert parsed is not None and parsed.bgp is not None and parsed.bgp.ipv6_unicast
        assert parsed.bgp.ipv6_unicast.networks == ["2001:db8:1::/48"]


def test_a_section_asking_nothing_is_refused() -> None:
    assert problems({"router_id": "192.0.2.1"}) == [
        "spec.routing: routing asks for nothing: give bgp, ospf or ospf6"
    ]


# -- the renderer ------------------------------------------------------------------
def test_the_rendered_configuration_is_the_golden_one() -> None:
    section = document().spec.section("routing", RoutingSection)
    assert section is not None
    rendered = render(section, ["192.0.2.0/24"])
    assert rendered.text() == GOLDEN.read_text()
    assert len(rendered.lines) == len(rendered.paths)
    community = rendered.lines.index(" set community 64512:100")
    assert rendered.paths[community] == "spec.routing.route_maps[0].entries[0].set.community"
    assert daemons_for(section) == ["zebra", "bgpd", "ospfd", "ospf6d", "bfdd"]


def test_bgpd_reads_only_its_part_with_the_paths_it_came_from() -> None:
    section = document().spec.section("routing", RoutingSection)
    assert section is not None
    rendered = render(section)
    part = bgp_part(rendered.lines, rendered.paths)
    assert not any(line.startswith(("interface", "router ospf")) for line in part.lines)
    assert part.lines[0] == "frr defaults traditional" and "router bgp 64512" in part.lines
    number = part.lines.index(" set community 64512:100") + 1
    assert part.path_of(number) == "spec.routing.route_maps[0].entries[0].set.community"


def test_static_redistribution_is_the_documents_routes_only() -> None:
    section = routing(ospf=None, ospf6=None)
    section["bgp"]["ipv4_unicast"]["redistribute"] = ["connected", "static"]
    section["bgp"]["ipv6_unicast"] = {"redistribute": ["static"]}
    parsed = document(section)
    facts = RoutingSubsystem().desired(parsed, scope_for(parsed))
    lines = facts[CONFIG]
    # The main table's route of base_document, not the one in table wan2.
    assert "ip prefix-list trueup-static-v4 seq 5 permit 192.0.2.0/24" in lines
    assert not any("192.0.2.0/25" in line for line in lines)
    # No IPv6 route in the document: the IPv6 route map matches nothing.
    assert "route-map trueup-static-v6 deny 10" in lines
    assert "  redistribute kernel route-map trueup-static-v6" in lines


# -- the subsystem, on a fake FRR -----------------------------------------------------
class FakeFrr:
    """vtysh, frr-reload.py and bgpd -C as a runner: the running configuration is a list."""

    def __init__(self) -> None:
        self.running: list[str] = []
        self.calls: list[list[str]] = []
        self.timeouts: list[float] = []
        self.check_output = ""
        self.bgpd_output = ""
        self.reload_output = ""
        self.forwarding = ["no ip forwarding"]

    def run(self, argv: list[str], *, input: str | None = None, timeout: float = 30.0) -> Completed:
        del input
        self.calls.append(argv)
        self.timeouts.append(timeout)
        key = tuple(argv)
        if argv[0] == "vtysh" and "-C" in argv:
            return Completed(key, 0 if not self.check_output else 2, self.check_output, "")
        if argv[0].endswith("bgpd"):
            return Completed(key, 0, "", self.bgpd_output)
        if argv[0] == "vtysh" and argv[-1] == "show running-config":
            body = ["frr version 8.4.4", *self.forwarding, *self.running, "end"]
            return Completed(key, 0, "Building configuration...\n" + "\n".join(body), "")
        if argv[0] == "python3" and "--reload" in argv:
            text = Path(argv[-1]).read_text()
            if self.reload_output:
                return Completed(key, 1, self.reload_output, "")
            self.running = [line for line in text.splitlines() if "forwarding" not in line]
            return Completed(key, 0, "", "")
        return Completed(key, 127, "", f"{argv[0]}: not faked")


class Rig:
    def __init__(self, tmp_path: Path) -> None:
        self.frr = FakeFrr()
        self.daemons = FakeDaemons(tmp_path / "run")
        self.sources = Sources(
            FakeNetlink(),
            FakeFiles(
                {
                    "/proc/sys/net/ipv4/ip_forward": "0\n",
                    "/proc/sys/net/ipv6/conf/all/forwarding": "1\n",
                }
            ),
            self.frr,
            state_dir=tmp_path,
            daemons=self.daemons,
        )
        self.sub = RoutingSubsystem()
        write_secret(tmp_path, "bgp-up", "s3cret-value")

    def plan(self, parsed: DeviceState) -> list[str]:
        scope = scope_for(parsed)
        desired = self.sub.desired(parsed, scope)
        return [
            s.action
            for s in self.sub.plan(desired, self.sub.observe(self.sources, scope), scope).steps
        ]

    def converge(self, parsed: DeviceState) -> list[str]:
        scope = scope_for(parsed)
        desired = self.sub.desired(parsed, scope)
        plan = self.sub.plan(desired, self.sub.observe(self.sources, scope), scope)
        for step in plan.steps:
            self.sub.execute(self.sources, step)
        return [s.action for s in plan.steps]

    def diffs(self, parsed: DeviceState) -> list[str]:
        scope = scope_for(parsed)
        observed = self.sub.observe(self.sources, scope)
        return [d.path for d in self.sub.diff(self.sub.desired(parsed, scope), observed)]


def test_start_reload_then_in_sync_and_no_secret_in_any_fact(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    parsed = document()
    assert rig.converge(parsed) == ["start", "reload"]
    assert rig.diffs(parsed) == []
    assert rig.plan(parsed) == []
    applied = (tmp_path / "run" / "frr" / "frr.conf").read_text()
    assert " neighbor 198.51.100.9 password s3cret-value" in applied
    # The forwarding switches are the system's: every reload keeps them as they are.
    assert "no ip forwarding" in applied
    observed = rig.sub.observe(rig.sources, scope_for(parsed))
    assert " neighbor 198.51.100.9 password secret:bgp-up" in observed[CONFIG]
    assert "s3cret-value" not in repr(observed)
    assert observed[DAEMONS] == ["zebra", "bgpd", "ospfd", "ospf6d", "bfdd"]


def test_a_vtysh_edit_is_drift_and_is_healed_by_a_reload(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    parsed = document()
    rig.converge(parsed)
    rig.frr.running.insert(5, " neighbor 198.51.100.9 shutdown")
    assert rig.diffs(parsed) == [CONFIG]
    observed = rig.sub.observe(rig.sources, scope_for(parsed))
    assert " neighbor 198.51.100.9 shutdown" in observed[CONFIG]
    assert rig.converge(parsed) == ["reload"]
    assert rig.diffs(parsed) == []


def test_frr_refusal_names_the_path_and_quotes_frr_changing_nothing(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.converge(document())
    before = list(rig.frr.running)
    section = routing()
    section["route_maps"][0]["entries"][0]["set"]["community"] = "64512:70000"
    parsed = document(section)
    part = bgp_part(*_rendered(parsed))
    number = part.lines.index(" set community 64512:70000") + 1
    rig.frr.bgpd_output = (
        "% Malformed communities attribute '64512:70000'\n"
        f"BGP: [SHWNK-NWT5S][EC 100663304] Command returned Warning Config Failed on config "
        f"line {number}:  set community 64512:70000\n"
    )
    with pytest.raises(StepError) as refused:
        rig.converge(parsed)
    message = str(refused.value)
    assert "spec.routing.route_maps[0].entries[0].set.community" in message
    assert "% Malformed communities attribute '64512:70000'" in message
    assert "nothing was changed" in message
    # The step is described by its size, never by the configuration it carries.
    assert message.startswith("routing: reload lines=") and "router bgp" not in message
    assert rig.frr.running == before
    assert not any("--reload" in call for call in rig.frr.calls[-3:])
    assert not (tmp_path / "run" / "frr" / "frr.conf.new").exists()


def test_a_vtysh_check_refusal_is_at_the_line_it_names(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    parsed = document()
    lines, _paths = _rendered(parsed)
    number = lines.index(" neighbor 198.51.100.9 timers 3 9") + 1
    rig.frr.check_output = (
        f"line {number}: % Unknown command[25]:  neighbor 198.51.100.9 timers 3 9"
    )
    with pytest.raises(StepError) as refused:
        rig.converge(parsed)
    assert (
        "spec.routing.bgp.neighbors[0].timers (`neighbor 198.51.100.9 timers 3 9`): % Unknown"
        in str(refused.value)
    )


def test_a_missing_secret_fails_the_reload_naming_it(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    section = routing()
    section["bgp"]["neighbors"][0]["password"] = "secret:not-stored"
    with pytest.raises(StepError) as refused:
        rig.converge(document(section))
    said = "spec.routing.bgp.neighbors[0].password: secret 'not-stored' is not on this device"
    assert said in str(refused.value)
    assert refused.value.step.action == "start"
    assert not any(rig.daemons.running(f"frr-{d}") for d in ("zebra", "bgpd", "bfdd"))


def test_rollback_to_no_routing_stops_every_daemon(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.converge(document())
    parsed = parse_document(base_document())
    assert rig.converge(parsed) == ["stop"]
    assert not any(rig.daemons.running(f"frr-{d}") for d in ("zebra", "bgpd", "bfdd"))
    assert rig.diffs(parsed) == []


def test_a_neighbor_change_is_one_reload_and_no_restart(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.converge(document())
    section = routing()
    section["bgp"]["neighbors"][0]["description"] = "upstream two"
    assert rig.converge(document(section)) == ["reload"]
    assert " neighbor 198.51.100.9 description upstream two" in rig.frr.running


def _rendered(parsed: DeviceState) -> tuple[list[str], list[str]]:
    section = parsed.spec.section("routing", RoutingSection)
    assert section is not None
    rendered = render(section, ["192.0.2.0/24"])
    return rendered.lines, rendered.paths


# -- observation ------------------------------------------------------------------
def test_normalise_drops_what_is_not_configuration_and_hides_passwords() -> None:
    text = "\n".join(
        [
            "Building configuration...",
            "frr version 8.4.4",
            "hostname vm",
            "no ip forwarding",
            "router bgp 64512",
            " neighbor 192.0.2.2 password plain",
            "exit",
            "!",
            "end",
        ]
    )
    lines = normalise(text)
    assert lines[0] == "router bgp 64512"
    assert lines[1].startswith(" neighbor 192.0.2.2 password <sha256:")
    assert "plain" not in repr(lines)


def test_status_reads_sessions_and_adjacencies() -> None:
    summary = {
        "ipv4Unicast": {
            "peers": {
                "198.51.100.2": {
                    "remoteAs": 64513,
                    "state": "Established",
                    "peerUptimeMsec": 3000,
                    "connectionsEstablished": 1,
                    "pfxRcd": 2,
                    "pfxSnt": 1,
                    "desc": "peer",
                }
            }
        }
    }
    peers = bgp_peers(summary)
    assert peers["198.51.100.2"][0]["state"] == "Established"
    assert peers["198.51.100.2"][0]["prefixes_received"] == 2
    ospf = {"neighbors": {"192.0.2.2": [{"nbrState": "Full/DR", "ifaceName": "lan0:203.0.113.1"}]}}
    assert ospf_neighbors(ospf) == [
        {"neighbor_id": "192.0.2.2", "state": "Full/DR", "interface": "lan0"}
    ]
    ospf6 = {"neighbors": [{"neighborId": "192.0.2.3", "state": "Full", "interfaceName": "lan0"}]}
    assert ospf6_neighbors(ospf6)[0]["state"] == "Full"


def test_routes_a_routing_daemon_installs_are_never_routes_drift() -> None:
    parsed = parse_document(base_document())
    scope = scope_for(parsed)
    netlink = FakeNetlink()
    for proto in (186, 188, 11, 250):
        netlink.route_table.append(
            RouteInfo(
                254, f"198.51.100.{proto % 200}/32", "203.0.113.9", "lan0", 20, 4, proto=proto
            )
        )
    netlink.route_table.append(
        RouteInfo(254, "198.51.100.128/25", "203.0.113.9", "lan0", 0, 4, proto=3)
    )
    observed = RoutesSubsystem().observe(Sources(netlink), scope)
    assert list(observed) == ["spec.routes[table=main,to=198.51.100.128/25,metric=0]"]


def test_a_before_image_is_put_back_whole(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    first = document()
    rig.converge(first)
    scope = scope_for(first)
    before = rig.sub.observe(rig.sources, scope)
    section = routing()
    section["bgp"]["neighbors"][1]["remote_as"] = 64999
    rig.converge(document(section))
    assert " neighbor 2001:db8::9 remote-as 64999" in rig.frr.running
    # A rollback plans from the before-image: the configuration FRR ran is reloaded.
    plan = rig.sub.plan(before, rig.sub.observe(rig.sources, scope), scope)
    assert [s.action for s in plan.steps] == ["reload"]
    for step in plan.steps:
        rig.sub.execute(rig.sources, step)
    assert " neighbor 2001:db8::9 remote-as 64512" in rig.frr.running
    assert rig.diffs(first) == []


def test_zebra_that_cannot_start_fails_routing_alone_in_its_own_words(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.daemons.fail_start.add("frr-zebra")
    parsed = document()
    with pytest.raises(
        StepError, match=r"routing: start daemons=.* \(spec.routing.daemons\): frr-zebra"
    ):
        rig.converge(parsed)
    assert not rig.frr.running


def test_a_route_map_of_the_other_family_is_refused_at_the_neighbor() -> None:
    section = routing()
    section["bgp"]["neighbors"][0]["families"] = ["ipv4_unicast"]
    assert problems(section) == [
        "spec.routing.bgp.neighbors[0].route_map_in: route map from-up matches IPv6 prefix list "
        "long6 (route_maps[1].entries[0]) but neighbour 198.51.100.9 is in ipv4_unicast only: "
        "give a prefix list of its family, or add ipv6_unicast to its families"
    ]


def test_what_is_redistributed_must_run_here() -> None:
    assert problems(routing(ospf=None)) == [
        "spec.routing.bgp.ipv4_unicast.redistribute: ospf in ipv4_unicast is OSPFv2, and "
        "spec.routing.ospf is not given: configure ospf or remove ospf"
    ]
    assert problems(routing(ospf6=None)) == [
        "spec.routing.bgp.ipv6_unicast.redistribute: ospf in ipv6_unicast is OSPFv3, and "
        "spec.routing.ospf6 is not given: configure ospf6 or remove ospf"
    ]
    section = routing(bgp=None, route_maps=[])
    assert problems(section) == [
        "spec.routing.ospf.redistribute: bgp is redistributed, and spec.routing.bgp is not "
        "given: configure bgp or remove bgp"
    ]


def test_a_reload_failure_echoing_a_password_names_the_secret_not_its_value(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path)
    rig.frr.reload_output = (
        "2026-12-07 WARNING: frr-reload.py failed due to\n"
        "% Unknown command: neighbor 198.51.100.9 password s3cret-value"
    )
    with pytest.raises(StepError) as refused:
        rig.converge(document())
    assert "s3cret-value" not in str(refused.value)
    assert "neighbor 198.51.100.9 password secret:bgp-up" in str(refused.value)


def test_a_change_reads_the_running_configuration_once_after_its_reload(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    parsed = document()
    rig.converge(parsed)
    section = routing()
    section["bgp"]["neighbors"][0]["description"] = "upstream two"
    changed = document(section)
    scope = scope_for(changed)
    plan = rig.sub.plan(rig.sub.desired(changed, scope), rig.sub.observe(rig.sources, scope), scope)
    rig.frr.calls.clear()
    for step in plan.steps:
        rig.sub.execute(rig.sources, step)
    shows = [c for c in rig.frr.calls if c[-1] == "show running-config"]
    assert len(shows) == 1
    applied = (tmp_path / "run" / "frr" / "frr.conf").read_text().splitlines()
    # As zebra prints them: IPv4 forwarding is off in this namespace, IPv6 forwarding on.
    assert applied[2] == "no ip forwarding"
    assert "no ipv6 forwarding" not in applied


def test_a_look_at_frr_waits_seconds_not_a_minute(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    parsed = document()
    rig.converge(parsed)
    rig.frr.timeouts.clear()
    rig.sub.observe(rig.sources, scope_for(parsed))
    assert rig.frr.timeouts and max(rig.frr.timeouts) <= 10.0


def test_an_as_number_out_of_range_says_what_an_as_number_is() -> None:
    section = routing()
    section["bgp"]["asn"] = 0
    section["bgp"]["neighbors"][1]["remote_as"] = 4294967296
    expected = "1 to 4294967295 (private: 64512-65534, 4200000000-4294967294)"
    assert problems(section) == [
        f"spec.routing.bgp.asn: 0 is not an AS number: {expected}",
        f"spec.routing.bgp.neighbors[1].remote_as: 4294967296 is not an AS number: {expected}",
    ]


@pytest.mark.parametrize("name", ["frr.conf", "frr.conf.new", "frr-bgpd.conf.new", "vtysh.conf"])
def test_no_frr_file_is_written_through_a_planted_symlink(tmp_path: Path, name: str) -> None:
    rig = Rig(tmp_path)
    host = tmp_path / "host-file"
    host.write_text("the host's\n")
    run = tmp_path / "run" / "frr"
    run.mkdir(parents=True, mode=0o700)
    (run / name).symlink_to(host)
    with pytest.raises(StepError) as refused:
        rig.converge(document())
    assert str(run / name) in str(refused.value)
    assert host.read_text() == "the host's\n"


@pytest.mark.parametrize("value", ["s3cret\nrouter bgp 64999", "two words", "x" * 81, "tab\there"])
def test_a_password_that_is_not_one_frr_line_is_refused_and_never_written(
    tmp_path: Path, value: str
) -> None:
    rig = Rig(tmp_path)
    write_secret(tmp_path, "bgp-up", value)
    with pytest.raises(StepError) as refused:
        rig.converge(document())
    said = str(refused.value)
    assert "spec.routing.bgp.neighbors[0].password: secret 'bgp-up' is not a BGP password" in said
    assert value not in said
    assert not (tmp_path / "run" / "frr" / "frr.conf").exists()
    assert not any("router bgp 64999" in p.read_text() for p in (tmp_path / "run").rglob("*.conf*"))
