"""`frr.conf` from `spec.routing` (pure functions, no I/O): every line with the path it comes from.

The configuration is FRR's integrated form, in the order FRR prints its
running configuration: prefix lists, interfaces (OSPF on each), `router bgp`,
`router ospf`, `router ospf6`, route maps. Each line carries the document path
that produced it, so FRR's own refusal of a line ("Config Failed on config
line 8") is reported at `spec.routing.route_maps[0].entries[0].set.community`.

Passwords never appear here: a neighbour's line reads `password secret:NAME`
and the step substitutes the stored secret when it writes the file FRR
reads (`with_secrets`), so facts, plans and the journal never hold one.

`static` redistribution is the document's own routes (`spec.routes` in the
main table): FRR sees them as kernel routes, so it compiles to `redistribute
kernel` through a route map that matches exactly those prefixes
(`trueup-static-v4`/`-v6`); an operator's `ip route add` is not announced.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from trueup.subsystems.routing.section import (
    FAMILIES,
    BgpNeighbor,
    OspfSection,
    RouteMap,
    RoutingSection,
    neighbor_families,
    prefix_list_family,
)

__all__ = [
    "HEADER",
    "Rendered",
    "bgp_part",
    "daemons_for",
    "render",
    "with_secrets",
]

HEADER = ("frr defaults traditional", "log stdout informational")
ROOT = "spec.routing"
_PASSWORD = " password secret:"


@dataclass
class Rendered:
    """The configuration's lines, and the document path each came from."""

    lines: list[str] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)

    def add(self, line: str, path: str = ROOT) -> None:
        self.lines.append(line)
        self.paths.append(path)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"

    def path_of(self, number: int) -> str:
        """The path of line `number` (1-based, as FRR counts); the section when unknown."""
        return self.paths[number - 1] if 0 < number <= len(self.paths) else ROOT


def daemons_for(section: RoutingSection) -> list[str]:
    """The FRR daemons the section needs, zebra first."""
    out = ["zebra"]
    if section.bgp is not None:
        out.append("bgpd")
    if section.ospf is not None:
        out.append("ospfd")
    if section.ospf6 is not None:
        out.append("ospf6d")
    bfd = section.bgp is not None and any(n.bfd for n in section.bgp.neighbors)
    for ospf in (section.ospf, section.ospf6):
        bfd = bfd or (ospf is not None and any(i.bfd for _, i in ospf.interfaces()))
    if bfd:
        out.append("bfdd")
    return out


def with_secrets(lines: Iterable[str], secret: Callable[[str], str]) -> list[str]:
    """`lines` with each `password secret:NAME` replaced by the secret's value."""
    out = []
    for line in lines:
        head, found, name = line.partition(_PASSWORD)
        out.append(f"{head} password {secret(name)}" if found else line)
    return out


def _static_families(static_routes: Iterable[str]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {4: [], 6: []}
    for prefix in static_routes:
        out[ipaddress.ip_network(prefix).version].append(prefix)
    return {version: sorted(set(p)) for version, p in out.items()}


def _wants_static(section: RoutingSection) -> set[int]:
    out: set[int] = set()
    if section.bgp is not None:
        for family in FAMILIES:
            af = section.bgp.family(family)
            if af is not None and "static" in af.redistribute:
                out.add(4 if family == "ipv4_unicast" else 6)
    if section.ospf is not None and "static" in section.ospf.redistribute:
        out.add(4)
    if section.ospf6 is not None and "static" in section.ospf6.redistribute:
        out.add(6)
    return out


def _prefix_lists(out: Rendered, section: RoutingSection, static: dict[int, list[str]]) -> None:
    for index, prefix_list in enumerate(section.prefix_lists):
        word = "ip" if prefix_list_family(prefix_list.entries) == 4 else "ipv6"
        for e, entry in enumerate(prefix_list.entries):
            line = f"{word} prefix-list {prefix_list.name} seq {entry.seq} {entry.action} {entry.prefix}"
            line += f" ge {entry.ge}" if entry.ge is not None else ""
            line += f" le {entry.le}" if entry.le is not None else ""
            out.add(line, f"{ROOT}.prefix_lists[{index}].entries[{e}]")
    for version in sorted(_wants_static(section)):
        word = "ip" if version == 4 else "ipv6"
        for seq, prefix in enumerate(static[version], start=1):
            out.add(
                f"{word} prefix-list trueup-static-v{version} seq {seq * 5} permit {prefix}",
                "spec.routes",
            )


def _interfaces(out: Rendered, section: RoutingSection) -> None:
    lines: dict[str, list[tuple[str, str]]] = {}
    for name, ospf, words in (
        ("ospf", section.ospf, ("ip", "ospf")),
        ("ospf6", section.ospf6, ("ipv6", "ospf6")),
    ):
        if ospf is None:
            continue
        prefix = " ".join(words)
        for a, area in enumerate(ospf.areas):
            for i, interface in enumerate(area.interfaces):
                path = f"{ROOT}.{name}.areas[{a}].interfaces[{i}]"
                mine = lines.setdefault(interface.name, [])
                mine.append((f" {prefix} area {area.id}", path))
                if interface.bfd:
                    mine.append((f" {prefix} bfd", f"{path}.bfd"))
                if interface.cost is not None:
                    mine.append((f" {prefix} cost {interface.cost}", f"{path}.cost"))
                if interface.dead is not None:
                    interval = f"dead-interval {interface.dead}"
                    mine.append((f" {prefix} {interval}", f"{path}.dead"))
                if interface.hello is not None:
                    interval = f"hello-interval {interface.hello}"
                    mine.append((f" {prefix} {interval}", f"{path}.hello"))
                if interface.network is not None:
                    mine.append((f" {prefix} network {interface.network}", f"{path}.network"))
                if interface.passive:
                    mine.append((f" {prefix} passive", f"{path}.passive"))
    for ifname in sorted(lines):
        out.add(f"interface {ifname}", ROOT)
        for line, path in lines[ifname]:
            out.add(line, path)
        out.add("exit")
        out.add("!")


def _neighbor(out: Rendered, neighbor: BgpNeighbor, path: str) -> None:
    address = neighbor.address
    out.add(f" neighbor {address} remote-as {neighbor.remote_as}", f"{path}.remote_as")
    if neighbor.description is not None:
        out.add(f" neighbor {address} description {neighbor.description}", f"{path}.description")
    if neighbor.password is not None:
        out.add(f" neighbor {address} password {neighbor.password}", f"{path}.password")
    if neighbor.timers is not None:
        timers = neighbor.timers
        out.add(f" neighbor {address} timers {timers.keepalive} {timers.hold}", f"{path}.timers")
    if neighbor.bfd:
        out.add(f" neighbor {address} bfd", f"{path}.bfd")


def _bgp(out: Rendered, section: RoutingSection) -> None:
    bgp = section.bgp
    if bgp is None:
        return
    base = f"{ROOT}.bgp"
    out.add(f"router bgp {bgp.asn}", f"{base}.asn")
    out.add(f" bgp router-id {section.router_id}", f"{ROOT}.router_id")
    if not bgp.require_policy:
        out.add(" no bgp ebgp-requires-policy", f"{base}.require_policy")
    out.add(" no bgp default ipv4-unicast", base)
    for index, neighbor in enumerate(bgp.neighbors):
        _neighbor(out, neighbor, f"{base}.neighbors[{index}]")
    for family in FAMILIES:
        af = bgp.family(family)
        members = [(i, n) for i, n in enumerate(bgp.neighbors) if family in neighbor_families(n)]
        if af is None and not members:
            continue
        version = 4 if family == "ipv4_unicast" else 6
        out.add(" !")
        out.add(f" address-family ipv{version} unicast", f"{base}.{family}")
        if af is not None:
            for n, network in enumerate(af.networks):
                out.add(f"  network {network}", f"{base}.{family}.networks[{n}]")
            for source in af.redistribute:
                out.add(_redistribute(source, version, "  "), f"{base}.{family}.redistribute")
        for index, neighbor in members:
            path = f"{base}.neighbors[{index}]"
            out.add(f"  neighbor {neighbor.address} activate", f"{path}.families")
            if neighbor.route_map_in is not None:
                out.add(
                    f"  neighbor {neighbor.address} route-map {neighbor.route_map_in} in",
                    f"{path}.route_map_in",
                )
            if neighbor.route_map_out is not None:
                out.add(
                    f"  neighbor {neighbor.address} route-map {neighbor.route_map_out} out",
                    f"{path}.route_map_out",
                )
        out.add(" exit-address-family")
    out.add("exit")
    out.add("!")


def _redistribute(source: str, version: int, indent: str) -> str:
    if source == "static":
        return f"{indent}redistribute kernel route-map trueup-static-v{version}"
    if source == "ospf" and version == 6:
        return f"{indent}redistribute ospf6"
    return f"{indent}redistribute {source}"


def _ospf(out: Rendered, name: str, ospf: OspfSection | None, router_id: str) -> None:
    if ospf is None:
        return
    base = f"{ROOT}.{name}"
    out.add(f"router {name}", base)
    out.add(f" {name} router-id {router_id}", f"{ROOT}.router_id")
    version = 4 if name == "ospf" else 6
    for source in ospf.redistribute:
        out.add(_redistribute(source, version, " "), f"{base}.redistribute")
    out.add("exit")
    out.add("!")


def _route_map(out: Rendered, index: int, route_map: RouteMap, families: dict[str, int]) -> None:
    base = f"{ROOT}.route_maps[{index}]"
    for e, entry in enumerate(route_map.entries):
        path = f"{base}.entries[{e}]"
        out.add(f"route-map {route_map.name} {entry.action} {entry.seq}", path)
        wanted = entry.match.prefix_list
        if wanted is not None:
            word = "ip" if families.get(wanted, 4) == 4 else "ipv6"
            out.add(f" match {word} address prefix-list {wanted}", f"{path}.match.prefix_list")
        values = entry.set
        if values.local_preference is not None:
            out.add(
                f" set local-preference {values.local_preference}", f"{path}.set.local_preference"
            )
        if values.metric is not None:
            out.add(f" set metric {values.metric}", f"{path}.set.metric")
        if values.community is not None:
            out.add(f" set community {values.community}", f"{path}.set.community")
        if values.as_path_prepend:
            asns = " ".join(str(a) for a in values.as_path_prepend)
            out.add(f" set as-path prepend {asns}", f"{path}.set.as_path_prepend")
        out.add("exit")
        out.add("!")


def render(section: RoutingSection, static_routes: Iterable[str] = ()) -> Rendered:
    """FRR's integrated configuration for `section`; `static_routes`: the main table's
    prefixes in `spec.routes` (what `static` redistribution announces)."""
    out = Rendered()
    for line in HEADER:
        out.add(line)
    out.add("!")
    static = _static_families(static_routes)
    _prefix_lists(out, section, static)
    if out.lines[-1] != "!":
        out.add("!")
    _interfaces(out, section)
    _bgp(out, section)
    _ospf(out, "ospf", section.ospf, section.router_id)
    _ospf(out, "ospf6", section.ospf6, section.router_id)
    families = {p.name: prefix_list_family(p.entries) for p in section.prefix_lists}
    for index, route_map in enumerate(section.route_maps):
        _route_map(out, index, route_map, families)
    for version in sorted(_wants_static(section)):
        word = "ip" if version == 4 else "ipv6"
        name = f"trueup-static-v{version}"
        if static[version]:
            out.add(f"route-map {name} permit 10", "spec.routes")
            out.add(f" match {word} address prefix-list {name}", "spec.routes")
        else:
            out.add(f"route-map {name} deny 10", "spec.routes")
        out.add("exit")
        out.add("!")
    return out


_BGP_BLOCKS = ("ip prefix-list ", "ipv6 prefix-list ", "route-map ", "router bgp ")


def bgp_part(lines: list[str], paths: list[str]) -> Rendered:
    """The blocks of a configuration bgpd reads (prefix lists, route maps, `router bgp`),
    for bgpd's own check, with their paths."""
    out = Rendered()
    keep = True
    for line, path in zip(lines, paths or [ROOT] * len(lines), strict=False):
        if line and not line[0].isspace() and line not in ("!", "exit"):
            keep = line.startswith(_BGP_BLOCKS) or line in HEADER
        if keep:
            out.add(line, path)
    return out
