"""`spec.gateways`: WAN uplinks, their probes, and the default routes that follow them.

Pure data (errors name the path); the monitor and the routes are the
subsystem's (`trueup.subsystems.gateways.subsystem`).

```yaml
spec:
  gateways:
    policy: failover           # failover (one active, lowest priority first) | balance (ECMP)
    tables: [main]             # the routing tables whose default routes follow the gateways
    uplinks:
      - name: isp-a
        interface: wan0        # in spec.interfaces
        gateway: 192.0.2.1     # on a subnet of wan0's addresses
        priority: 1
        probes: {icmp: [192.0.2.100], tcp: ["192.0.2.100:443"]}
        interval_ms: 500
        down_after: 3          # consecutive failed rounds before down
        up_after: 5            # consecutive good rounds before up
      - {name: isp-b, interface: wan1, gateway: 198.51.100.1, priority: 2,
         probes: {icmp: [198.51.100.100]}}
```
"""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING, Literal

from pydantic import ConfigDict, Field

from trueup.model.document import route_table_number
from trueup.model.problems import Checked, check
from trueup.model.sections import CrossCheck, OtherSections, Problem, Section
from trueup.model.types import IfName, IpAddress, family_of

if TYPE_CHECKING:
    from trueup.model.document import DeviceSpec

__all__ = ["SECTION", "GatewaysSection", "Probes", "Uplink", "default_route"]

MAIN_TABLE = 254
PROBE_TABLE = 4_000_250  # the probe routes' table (`trueup.subsystems.gateways.subsystem`)
_RESERVED_TABLES = (0, 253, 255)


def default_route(family: int) -> tuple[str, int]:
    """The destination and kernel metric of a default route of `family` asked for at metric 0."""
    return ("::/0", 1024) if family == 6 else ("0.0.0.0/0", 0)


class _Model(Checked):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Probes(_Model):
    icmp: list[IpAddress] = Field([], description="addresses answering ICMP echo")
    tcp: list[str] = Field([], description="HOST:PORT (IPv6: [HOST]:PORT) accepting TCP")

    def tcp_targets(self) -> list[tuple[str, int]]:
        """The TCP targets as (address, port); only valid ones (the check names the rest)."""
        out = []
        for text in self.tcp:
            parsed = _host_port(text)
            if parsed is not None:
                out.append(parsed)
        return out

    @check
    def _targets(self) -> list[tuple[str, str]]:
        problems = [
            (f"tcp[{i}]", f"{text!r} is not HOST:PORT (an address and a port 1-65535)")
            for i, text in enumerate(self.tcp)
            if _host_port(text) is None
        ]
        if not self.icmp and not self.tcp:
            problems.append(("icmp", "an uplink needs at least one probe target (icmp or tcp)"))
        return problems


def _host_port(text: str) -> tuple[str, int] | None:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 1 <= int(port) <= 65535:
        return None
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        return str(ipaddress.ip_address(host)), int(port)
    except ValueError:
        return None


class Uplink(_Model):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
    interface: IfName
    gateway: IpAddress
    priority: int = Field(1, ge=0, le=1000, description="failover order: lowest first")
    weight: int = Field(1, ge=1, le=256, description="share of the ECMP route under balance")
    probes: Probes
    interval_ms: int = Field(1000, ge=100, le=60000, description="between probe rounds")
    timeout_ms: int | None = Field(
        None, ge=10, le=60000, description="a probe's answer deadline (default: interval_ms)"
    )
    reliability: int = Field(1, ge=1, description="targets that must answer for a good round")
    window: int = Field(10, ge=1, le=1000, description="rounds the loss and latency are over")
    max_loss_percent: float = Field(20.0, ge=0, le=100)
    max_latency_ms: float = Field(1000.0, gt=0, le=60000)
    down_after: int = Field(3, ge=1, le=1000, description="consecutive failed rounds: down")
    up_after: int = Field(5, ge=1, le=1000, description="consecutive good rounds: up")

    @property
    def family(self) -> int:
        return family_of(self.gateway)

    @property
    def timeout_seconds(self) -> float:
        return (self.timeout_ms if self.timeout_ms is not None else self.interval_ms) / 1000.0

    def probe_settings(self) -> tuple[object, ...]:
        """What the monitor's state of this uplink depends on: a change starts it afresh."""
        return (
            self.interface,
            self.gateway,
            tuple(self.probes.icmp),
            tuple(self.probes.tcp),
            self.interval_ms,
            self.timeout_ms,
            self.reliability,
            self.window,
            self.max_loss_percent,
            self.max_latency_ms,
            self.down_after,
            self.up_after,
        )

    @check
    def _consistent(self) -> list[tuple[str, str]]:
        problems: list[tuple[str, str]] = []
        targets = len(self.probes.icmp) + len(self.probes.tcp)
        if targets and self.reliability > targets:
            problems.append(
                ("reliability", f"{self.reliability} targets must answer but only {targets} given")
            )
        if self.timeout_ms is not None and self.timeout_ms > self.interval_ms:
            problems.append(("timeout_ms", f"longer than interval_ms ({self.interval_ms})"))
        for i, target in enumerate(self.probes.icmp):
            if family_of(target) != self.family:
                problems.append(
                    (
                        f"probes.icmp[{i}]",
                        f"IPv{family_of(target)} target for an IPv{self.family} gateway",
                    )
                )
        for i, (host, _port) in enumerate(self.probes.tcp_targets()):
            if family_of(host) != self.family:
                problems.append(
                    (
                        f"probes.tcp[{i}]",
                        f"IPv{family_of(host)} target for an IPv{self.family} gateway",
                    )
                )
        return problems


class GatewaysSection(_Model):
    """`spec.gateways`."""

    policy: Literal["failover", "balance"] = "failover"
    tables: list[int | str] = Field(
        ["main"], min_length=1, description="'main', numbers or names from spec.tables"
    )
    uplinks: list[Uplink] = Field(min_length=1)

    @check
    def _unique(self) -> list[tuple[str, str]]:
        problems: list[tuple[str, str]] = []
        names: dict[str, int] = {}
        for i, uplink in enumerate(self.uplinks):
            if uplink.name in names:
                problems.append(
                    (
                        f"uplinks[{i}].name",
                        f"duplicate name {uplink.name} (also uplinks[{names[uplink.name]}])",
                    )
                )
            names.setdefault(uplink.name, i)
        return problems

    def families(self) -> list[int]:
        return sorted({u.family for u in self.uplinks})

    def table_numbers(self, names: dict[str, int]) -> list[int]:
        """The owned tables as numbers (unknown names are refused by the section's check)."""
        out = []
        for table in self.tables:
            try:
                out.append(route_table_number(table, names))
            except KeyError:
                continue
        return out


def _gateway_problem(uplink: Uplink, addresses: list[str]) -> str | None:
    """Why `uplink.gateway` cannot be a next hop out of its interface; None when it can.

    An IPv6 gateway may be link-local (fe80::/10, what routers announce): every
    interface with IPv6 has such an address, so it is on-link without a subnet.
    """
    gateway = ipaddress.ip_address(uplink.gateway)
    ours = [ipaddress.ip_interface(a) for a in addresses]
    if gateway.version == 6 and gateway.is_link_local:
        return None
    for address in ours:
        if address.ip == gateway:
            return f"{gateway} is {uplink.interface}'s own address, not a gateway beyond it"
    for address in ours:
        net = address.network
        if gateway not in net:
            continue
        if gateway.version == 4 and net.prefixlen < 31:
            if gateway == net.network_address:
                return f"{gateway} is the network address of {net}, not a host"
            if gateway == net.broadcast_address:
                return f"{gateway} is the broadcast address of {net}, not a host"
        return None
    have = ", ".join(addresses) or "no addresses"
    return f"{gateway} is not on a subnet of {uplink.interface} ({have})"


def _owned_tables(
    section: GatewaysSection, spec: DeviceSpec, problems: list[Problem]
) -> dict[int, str]:
    """Table number → the `spec.gateways.tables` entry owning it; refusals into `problems`."""
    gw = spec.management.gateway
    owned: dict[int, str] = {}
    for i, table in enumerate(section.tables):
        if (
            isinstance(table, str)
            and table != "main"
            and not table.isdigit()
            and table not in spec.tables
        ):
            problems.append(
                (f"gateways.tables[{i}]", f"unknown table {table!r}; name it in spec.tables")
            )
            continue
        number = route_table_number(table, spec.tables)
        if number in _RESERVED_TABLES or not 1 <= number <= 4294967295:
            problems.append((f"gateways.tables[{i}]", f"table {number} is reserved"))
            continue
        if number == PROBE_TABLE:
            problems.append(
                (
                    f"gateways.tables[{i}]",
                    f"table {number} is the probe routes' table, trueup's own; choose another",
                )
            )
            continue
        if number in owned:
            problems.append(
                (f"gateways.tables[{i}]", f"table {number} is listed twice (also {owned[number]})")
            )
            continue
        owned[number] = f"spec.gateways.tables[{i}]"
        if gw is not None and number == MAIN_TABLE and family_of(gw) in section.families():
            problems.append(
                (
                    f"gateways.tables[{i}]",
                    f"the main table's IPv{family_of(gw)} default route is the management "
                    f"route (spec.management.gateway {gw}), never moved by failover; "
                    "give the gateways a table of their own",
                )
            )
    return owned


def _fits_spec(section: GatewaysSection, spec: DeviceSpec, others: OtherSections) -> list[Problem]:
    """Uplinks on managed interfaces and their subnets; tables with one owner; the
    management default route never the gateways' (paths below `spec`)."""
    del others
    problems: list[Problem] = []
    interfaces = {iface.name: iface for iface in spec.interfaces}
    taken: dict[tuple[str, int], int] = {}
    for i, uplink in enumerate(section.uplinks):
        where = f"gateways.uplinks[{i}]"
        other = taken.setdefault((uplink.interface, uplink.family), i)
        if other != i:
            problems.append(
                (
                    f"{where}.interface",
                    f"{uplink.interface} is also uplinks[{other}]'s interface for "
                    f"IPv{uplink.family}; probes bound to one interface cannot tell two "
                    "gateways of a family apart: one uplink per interface and family",
                )
            )
            continue
        if uplink.interface == spec.management.interface:
            problems.append(
                (
                    f"{where}.interface",
                    f"{uplink.interface} is the management interface; its default route is "
                    "spec.management's and never moved by failover",
                )
            )
            continue
        iface = interfaces.get(uplink.interface)
        if iface is None:
            problems.append((f"{where}.interface", f"{uplink.interface} is not in spec.interfaces"))
            continue
        if iface.state == "down":
            problems.append(
                (f"{where}.interface", f"{uplink.interface} is down in spec.interfaces")
            )
        problem = _gateway_problem(uplink, iface.addresses)
        if problem is not None:
            problems.append((f"{where}.gateway", problem))
    owned = _owned_tables(section, spec, problems)
    families = section.families()
    for i, route in enumerate(spec.routes):
        try:
            number = spec.table_number(route.table)
        except KeyError:
            continue
        if (
            number in owned
            and route.to in ("0.0.0.0/0", "::/0")
            and family_of(route.to) in families
        ):
            problems.append(
                (
                    f"routes[{i}]",
                    f"a default route in table {route.table}, whose default route "
                    f"{owned[number]} gives to the gateways (two owners of one route)",
                )
            )
    return problems


SECTION = Section("gateways", GatewaysSection, checks=(CrossCheck(_fits_spec),))
