"""`spec.routing`: what the document asks of dynamic routing (pure data, validated; errors name the path).

```yaml
spec:
  routing:
    router_id: 192.0.2.1                 # IPv4, for BGP, OSPFv2 and OSPFv3
    bgp:
      asn: 64512                         # the local AS
      neighbors:
        - address: 198.51.100.2
          remote_as: 64513               # equal to asn: an iBGP session
          description: upstream
          timers: {keepalive: 3, hold: 9}
          password: {secret_ref: bgp-upstream}   # or "secret:NAME"; never a literal
          bfd: true
          route_map_in: from-upstream
          route_map_out: to-upstream
          families: [ipv4_unicast]       # default: the family of its address
      ipv4_unicast:
        networks: [203.0.113.0/24]
        redistribute: [connected, static, ospf]
      ipv6_unicast:
        networks: ["2001:db8:1::/48"]
    ospf:                                # OSPFv2; ospf6 has the same form (OSPFv3)
      redistribute: [connected]
      areas:
        - id: 0.0.0.0                    # or a number
          interfaces:
            - {name: lan0, passive: true}
            - {name: wan0, cost: 10, network: point-to-point, hello: 1, dead: 4, bfd: false}
    prefix_lists:
      - name: ours
        entries: [{seq: 5, action: permit, prefix: 203.0.113.0/24, le: 32}]
    route_maps:
      - name: to-upstream
        entries:
          - seq: 10
            action: permit
            match: {prefix_list: ours}
            set: {local_preference: 200, metric: 10, community: "64512:100",
                  as_path_prepend: [64512]}
```

Why this module is over 400 lines: the section is one document model with
checks across its parts (a route map naming a prefix list, a neighbour
naming a route map); section modules stay single and light (the document
model loads them and nothing else), so the policy models live beside the
protocols that use them.

`static` in `redistribute` is the document's own routes (`spec.routes`, which
FRR sees as kernel routes), not FRR's: trueup runs no `staticd`. The values
FRR alone can judge (a community's numbers) are left to FRR's own check,
which quotes its words at the path that produced the line.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field

from trueup.model.limits import quoted
from trueup.model.problems import Checked, check
from trueup.model.sections import CrossCheck, OtherSections, Problem, Section

if TYPE_CHECKING:
    from trueup.model.document import DeviceSpec

__all__ = [
    "FAMILIES",
    "SECTION",
    "BgpFamily",
    "BgpNeighbor",
    "BgpSection",
    "OspfArea",
    "OspfInterface",
    "OspfSection",
    "PrefixList",
    "PrefixListEntry",
    "RouteMap",
    "RouteMapEntry",
    "RoutingSection",
    "Timers",
    "neighbor_families",
    "prefix_list_family",
    "secret_ref",
]

FAMILIES = ("ipv4_unicast", "ipv6_unicast")
Family = Literal["ipv4_unicast", "ipv6_unicast"]
Redistribute = Literal["connected", "static", "ospf", "bgp"]

_SECRET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
_TEXT = re.compile(r"^[ -~]{1,80}\Z")


_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}\Z")
_COMMUNITY = re.compile(r"^[A-Za-z0-9:-]+( [A-Za-z0-9:-]+)*\Z")


def _asn(value: int) -> int:
    if not 1 <= value <= 4_294_967_295:
        private = "64512-65534, 4200000000-4294967294"
        raise ValueError(f"{value} is not an AS number: 1 to 4294967295 (private: {private})")
    return value


Asn = Annotated[int, AfterValidator(_asn)]


@functools.lru_cache(maxsize=8192)  # a document is validated more than once; BGP has thousands
def _network(value: str) -> str:
    try:
        return str(ipaddress.ip_network(value.strip(), strict=True))
    except ValueError as exc:
        raise ValueError(f"{quoted(value)} is not an IPv4/IPv6 network: {exc}") from exc


def _name(value: str) -> str:
    if not _NAME.match(value):
        raise ValueError(f"{quoted(value)} is not a name (1-63 of A-Z a-z 0-9 _ . -)")
    return value


def _community(value: str) -> str:
    if not _COMMUNITY.match(value):
        raise ValueError(f"{quoted(value)} is not a list of communities (AA:NN or a keyword)")
    return value


Name = Annotated[str, AfterValidator(_name)]
Network = Annotated[str, AfterValidator(_network)]


def prefix_list_family(entries: list[PrefixListEntry]) -> int:
    """4 or 6: the family of a prefix list's entries (checked to be one)."""
    return ipaddress.ip_network(entries[0].prefix).version if entries else 4


class PrefixListEntry(Checked):
    model_config = ConfigDict(extra="forbid")

    seq: int = Field(ge=1, le=4_294_967_295)
    action: Literal["permit", "deny"]
    prefix: Network
    ge: int | None = Field(default=None, ge=0, le=128)
    le: int | None = Field(default=None, ge=0, le=128)

    @check
    def _lengths(self) -> list[tuple[str, str]]:
        network = ipaddress.ip_network(self.prefix)
        problems: list[tuple[str, str]] = []
        floor = network.prefixlen
        for name, length in (("ge", self.ge), ("le", self.le)):
            if length is not None and not floor < length <= network.max_prefixlen:
                problems.append(
                    (name, f"{length} is not between {floor + 1} and {network.max_prefixlen}")
                )
        if self.ge is not None and self.le is not None and self.ge > self.le:
            problems.append(("le", f"le {self.le} is below ge {self.ge}"))
        return problems


class PrefixList(Checked):
    model_config = ConfigDict(extra="forbid")

    name: Name
    entries: list[PrefixListEntry] = Field(min_length=1)

    @check
    def _entries(self) -> list[tuple[str, str]]:
        problems: list[tuple[str, str]] = []
        seqs: dict[int, int] = {}
        family = prefix_list_family(self.entries)
        for index, entry in enumerate(self.entries):
            if entry.seq in seqs:
                problems.append(
                    (
                        f"entries[{index}].seq",
                        f"seq {entry.seq} is already entries[{seqs[entry.seq]}]",
                    )
                )
            seqs.setdefault(entry.seq, index)
            if ipaddress.ip_network(entry.prefix).version != family:
                problems.append(
                    (f"entries[{index}].prefix", f"a prefix list is one family: IPv{family} here")
                )
        return problems


class RouteMapMatch(Checked):
    model_config = ConfigDict(extra="forbid")

    prefix_list: Name | None = None


class RouteMapSet(Checked):
    model_config = ConfigDict(extra="forbid")

    local_preference: int | None = Field(default=None, ge=0, le=4_294_967_295)
    metric: int | None = Field(default=None, ge=0, le=4_294_967_295)
    community: Annotated[str, AfterValidator(_community)] | None = None
    as_path_prepend: list[Asn] = Field(default_factory=list, max_length=10)


class RouteMapEntry(Checked):
    model_config = ConfigDict(extra="forbid")

    seq: int = Field(ge=1, le=65535)
    action: Literal["permit", "deny"]
    match: RouteMapMatch = Field(default_factory=RouteMapMatch)
    set: RouteMapSet = Field(default_factory=RouteMapSet)


class RouteMap(Checked):
    model_config = ConfigDict(extra="forbid")

    name: Name
    entries: list[RouteMapEntry] = Field(min_length=1)

    @check
    def _seqs(self) -> list[tuple[str, str]]:
        seqs: dict[int, int] = {}
        problems: list[tuple[str, str]] = []
        for index, entry in enumerate(self.entries):
            if entry.seq in seqs:
                problems.append(
                    (
                        f"entries[{index}].seq",
                        f"seq {entry.seq} is already entries[{seqs[entry.seq]}]",
                    )
                )
            seqs.setdefault(entry.seq, index)
        return problems


def secret_ref(value: object) -> str:
    """`{secret_ref: NAME}` or `"secret:NAME"` → `"secret:NAME"`; a literal password is refused."""
    name: object = None
    if isinstance(value, dict) and set(value) == {"secret_ref"}:
        name = value["secret_ref"]
    elif isinstance(value, str) and value.startswith("secret:"):
        name = value.removeprefix("secret:")
    elif isinstance(value, str):
        raise ValueError(
            "a literal password is refused: give a secret reference ({secret_ref: NAME} or "
            '"secret:NAME") and store it with `trueup secret set NAME`'
        )
    if not isinstance(name, str) or not _SECRET_NAME.match(name):
        raise ValueError(
            'expected a secret reference: {secret_ref: NAME} or "secret:NAME", NAME of '
            "A-Z a-z 0-9 . _ -"
        )
    return f"secret:{name}"


def _ipv4(value: str) -> str:
    try:
        return str(ipaddress.IPv4Address(value.strip()))
    except ValueError as exc:
        raise ValueError(f"{quoted(value)} is not an IPv4 address (a router id is one)") from exc


def _address(value: str) -> str:
    try:
        return str(ipaddress.ip_address(value.strip()))
    except ValueError as exc:
        raise ValueError(f"{quoted(value)} is not an IPv4/IPv6 address") from exc


def _area(value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**32:
        return str(ipaddress.IPv4Address(value))
    try:
        return str(ipaddress.IPv4Address(str(value).strip()))
    except ValueError as exc:
        raise ValueError(f"{quoted(value)} is not an area id (a number or A.B.C.D)") from exc


def _text(value: str) -> str:
    if not _TEXT.match(value):
        raise ValueError("a description is 1-80 printable ASCII characters")
    return value


SecretRef = Annotated[str, BeforeValidator(secret_ref)]


def neighbor_families(neighbor: BgpNeighbor) -> list[str]:
    """The address families a neighbour is activated in (default: that of its address)."""
    if neighbor.families is not None:
        return list(neighbor.families)
    return [
        "ipv4_unicast" if ipaddress.ip_address(neighbor.address).version == 4 else "ipv6_unicast"
    ]


class Timers(Checked):
    """A neighbour's keepalive and hold time, in seconds (hold 0: no hold timer)."""

    model_config = ConfigDict(extra="forbid")

    keepalive: int = Field(ge=1, le=65535)
    hold: int = Field(ge=0, le=65535)

    @check
    def _hold(self) -> list[tuple[str, str]]:
        if self.hold and (self.hold < 3 or self.hold < self.keepalive):
            return [("hold", "the hold time is 0 or at least 3 and at least the keepalive")]
        return []


class BgpNeighbor(Checked):
    model_config = ConfigDict(extra="forbid")

    address: Annotated[str, AfterValidator(_address)]
    remote_as: Asn
    description: Annotated[str, AfterValidator(_text)] | None = None
    timers: Timers | None = None
    password: SecretRef | None = None
    bfd: bool = False
    route_map_in: Name | None = None
    route_map_out: Name | None = None
    families: list[Family] | None = Field(default=None, min_length=1)


class BgpFamily(Checked):
    """What BGP announces in one address family."""

    model_config = ConfigDict(extra="forbid")

    networks: list[Network] = Field(default_factory=list)
    redistribute: list[Redistribute] = Field(default_factory=list)


class BgpSection(Checked):
    model_config = ConfigDict(extra="forbid")

    asn: Asn
    neighbors: list[BgpNeighbor] = Field(default_factory=list)
    ipv4_unicast: BgpFamily | None = None
    ipv6_unicast: BgpFamily | None = None
    # RFC 8212: eBGP sessions exchange nothing without a route map. Off unless asked.
    require_policy: bool = False

    def family(self, name: str) -> BgpFamily | None:
        return self.ipv4_unicast if name == "ipv4_unicast" else self.ipv6_unicast

    @check
    def _neighbors(self) -> list[tuple[str, str]]:
        problems: list[tuple[str, str]] = []
        seen: dict[str, int] = {}
        for index, neighbor in enumerate(self.neighbors):
            if neighbor.address in seen:
                problems.append(
                    (
                        f"neighbors[{index}].address",
                        f"{neighbor.address} is already neighbors[{seen[neighbor.address]}]",
                    )
                )
            seen.setdefault(neighbor.address, index)
        for family in FAMILIES:
            section = self.family(family)
            if section is None:
                continue
            version = 4 if family == "ipv4_unicast" else 6
            for index, network in enumerate(section.networks):
                if (6 if ":" in network else 4) != version:  # normal form (_network)
                    problems.append(
                        (f"{family}.networks[{index}]", f"{network} is not an IPv{version} network")
                    )
            if "bgp" in section.redistribute:
                problems.append((f"{family}.redistribute", "BGP does not redistribute itself"))
        return problems


class OspfInterface(Checked):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=15)
    cost: int | None = Field(default=None, ge=1, le=65535)
    passive: bool = False
    bfd: bool = False
    # point-to-point: no DR election (an adjacency in seconds on a /30 or /31 link).
    network: Literal["broadcast", "point-to-point"] | None = None
    hello: int | None = Field(default=None, ge=1, le=65535)
    dead: int | None = Field(default=None, ge=1, le=65535)

    @check
    def _intervals(self) -> list[tuple[str, str]]:
        if self.hello is not None and self.dead is not None and self.dead <= self.hello:
            return [("dead", f"the dead interval must exceed the hello interval ({self.hello})")]
        return []


class OspfArea(Checked):
    model_config = ConfigDict(extra="forbid")

    id: Annotated[str, BeforeValidator(_area)]
    interfaces: list[OspfInterface] = Field(default_factory=list)


class OspfSection(Checked):
    """OSPFv2 (`ospf`) or OSPFv3 (`ospf6`): areas of interfaces, what it redistributes."""

    model_config = ConfigDict(extra="forbid")

    areas: list[OspfArea] = Field(min_length=1)
    redistribute: list[Redistribute] = Field(default_factory=list)

    @check
    def _interfaces_once(self) -> list[tuple[str, str]]:
        problems: list[tuple[str, str]] = []
        seen: dict[str, str] = {}
        ids: dict[str, int] = {}
        for a, area in enumerate(self.areas):
            if area.id in ids:
                problems.append(
                    (f"areas[{a}].id", f"area {area.id} is already areas[{ids[area.id]}]")
                )
            ids.setdefault(area.id, a)
            for i, interface in enumerate(area.interfaces):
                where = f"areas[{a}].interfaces[{i}]"
                if interface.name in seen:
                    problems.append(
                        (f"{where}.name", f"{interface.name} is already {seen[interface.name]}")
                    )
                seen.setdefault(interface.name, where)
        if "ospf" in self.redistribute:
            problems.append(("redistribute", "OSPF does not redistribute itself"))
        return problems

    def interfaces(self) -> list[tuple[str, OspfInterface]]:
        """(area id, interface) for every interface, in document order."""
        return [(area.id, i) for area in self.areas for i in area.interfaces]


class RoutingSection(Checked):
    """`spec.routing`: BGP, OSPFv2, OSPFv3 and their policy, run by FRR."""

    model_config = ConfigDict(extra="forbid")

    router_id: Annotated[str, AfterValidator(_ipv4)]
    bgp: BgpSection | None = None
    ospf: OspfSection | None = None
    ospf6: OspfSection | None = None
    prefix_lists: list[PrefixList] = Field(default_factory=list)
    route_maps: list[RouteMap] = Field(default_factory=list)

    @check
    def _names(self) -> list[tuple[str, str]]:
        problems: list[tuple[str, str]] = []
        lists: dict[str, int] = {}
        for index, prefix_list in enumerate(self.prefix_lists):
            if prefix_list.name.startswith("trueup-"):
                problems.append(
                    (f"prefix_lists[{index}].name", "names starting trueup- are trueup's")
                )
            if prefix_list.name in lists:
                problems.append(
                    (
                        f"prefix_lists[{index}].name",
                        f"{prefix_list.name} is already prefix_lists[{lists[prefix_list.name]}]",
                    )
                )
            lists.setdefault(prefix_list.name, index)
        maps: dict[str, int] = {}
        for index, route_map in enumerate(self.route_maps):
            if route_map.name.startswith("trueup-"):
                problems.append(
                    (f"route_maps[{index}].name", "names starting trueup- are trueup's")
                )
            if route_map.name in maps:
                problems.append(
                    (
                        f"route_maps[{index}].name",
                        f"{route_map.name} is already route_maps[{maps[route_map.name]}]",
                    )
                )
            maps.setdefault(route_map.name, index)
            for e, entry in enumerate(route_map.entries):
                wanted = entry.match.prefix_list
                if wanted is not None and wanted not in lists:
                    problems.append(
                        (
                            f"route_maps[{index}].entries[{e}].match.prefix_list",
                            f"no prefix list {wanted} in spec.routing.prefix_lists",
                        )
                    )
        if self.bgp is not None:
            for index, neighbor in enumerate(self.bgp.neighbors):
                for field in ("route_map_in", "route_map_out"):
                    wanted = getattr(neighbor, field)
                    if wanted is not None and wanted not in maps:
                        problems.append(
                            (
                                f"bgp.neighbors[{index}].{field}",
                                f"no route map {wanted} in spec.routing.route_maps",
                            )
                        )
        problems += self._route_map_families(lists)
        problems += self._redistributed_protocols()
        if self.bgp is None and self.ospf is None and self.ospf6 is None:
            problems.append(("", "routing asks for nothing: give bgp, ospf or ospf6"))
        return problems

    def _route_map_families(self, lists: dict[str, int]) -> list[tuple[str, str]]:
        """A neighbour's route map matches prefix lists of its families: FRR takes one of the
        other family, whose entry then never matches (its permit never taken, its deny inert)."""
        if self.bgp is None:
            return []
        maps = {m.name: (i, m) for i, m in enumerate(self.route_maps)}
        problems: list[tuple[str, str]] = []
        for index, neighbor in enumerate(self.bgp.neighbors):
            versions = {4 if f == "ipv4_unicast" else 6 for f in neighbor_families(neighbor)}
            for field in ("route_map_in", "route_map_out"):
                found = maps.get(getattr(neighbor, field) or "")
                if found is None:
                    continue
                m, route_map = found
                for e, entry in enumerate(route_map.entries):
                    wanted = entry.match.prefix_list
                    if wanted is None or wanted not in lists:
                        continue
                    version = prefix_list_family(self.prefix_lists[lists[wanted]].entries)
                    if version not in versions:
                        families = ", ".join(neighbor_families(neighbor))
                        problems.append(
                            (
                                f"bgp.neighbors[{index}].{field}",
                                f"route map {route_map.name} matches IPv{version} prefix list "
                                f"{wanted} (route_maps[{m}].entries[{e}]) but neighbour "
                                f"{neighbor.address} is in {families} only: give a prefix list "
                                f"of its family, or add ipv{version}_unicast to its families",
                            )
                        )
        return problems

    def _redistributed_protocols(self) -> list[tuple[str, str]]:
        """What is redistributed runs here: BGP's `ospf` is OSPFv2 in IPv4, OSPFv3 in IPv6."""
        problems: list[tuple[str, str]] = []
        if self.bgp is not None:
            for family, ospf, name in (
                ("ipv4_unicast", self.ospf, "ospf"),
                ("ipv6_unicast", self.ospf6, "ospf6"),
            ):
                af = self.bgp.family(family)
                if af is not None and "ospf" in af.redistribute and ospf is None:
                    version = "OSPFv2" if name == "ospf" else "OSPFv3"
                    problems.append(
                        (
                            f"bgp.{family}.redistribute",
                            f"ospf in {family} is {version}, and spec.routing.{name} is not "
                            f"given: configure {name} or remove ospf",
                        )
                    )
        for name, ospf in (("ospf", self.ospf), ("ospf6", self.ospf6)):
            if ospf is not None and "bgp" in ospf.redistribute and self.bgp is None:
                problems.append(
                    (
                        f"{name}.redistribute",
                        "bgp is redistributed, and spec.routing.bgp is not given: configure bgp "
                        "or remove bgp",
                    )
                )
        return problems

    def secret_names(self) -> set[str]:
        if self.bgp is None:
            return set()
        return {n.password.removeprefix("secret:") for n in self.bgp.neighbors if n.password}


def _interfaces_known(
    routing: RoutingSection, spec: DeviceSpec, others: OtherSections
) -> list[Problem]:
    """An OSPF interface is one the document manages (spec.interfaces or spec.management)."""
    del others
    known = {spec.management.interface, *(i.name for i in spec.interfaces)}
    problems: list[Problem] = []
    for name, section in (("ospf", routing.ospf), ("ospf6", routing.ospf6)):
        if section is None:
            continue
        for a, area in enumerate(section.areas):
            for i, interface in enumerate(area.interfaces):
                if interface.name not in known:
                    problems.append(
                        (
                            f"routing.{name}.areas[{a}].interfaces[{i}].name",
                            f"{interface.name} is not in spec.interfaces (OSPF runs on "
                            "interfaces the document manages)",
                        )
                    )
    return problems


SECTION = Section("routing", RoutingSection, checks=(CrossCheck(_interfaces_known),))
