"""`spec.dhcp`: what the document asks of DHCP (pure data, validated; errors name the path).

```yaml
spec:
  dhcp:
    interfaces: [lan0]
    lifetimes: {valid: 3600, renew: 900, rebind: 1800, preferred: 2700}
    options: {domain-name-servers: [203.0.113.1]}        # every subnet of the family
    subnets:
      - id: 1                                             # Kea's subnet id: keep it stable
        subnet: 203.0.113.0/24
        pools: [203.0.113.100-203.0.113.150]
        options: {routers: 203.0.113.1}
        reservations:
          - {hw-address: "02:00:00:00:00:aa", ip-address: 203.0.113.20, hostname: printer}
      - {id: 2, subnet: "2001:db8:1::/64", pools: ["2001:db8:1::100-2001:db8:1::1ff"]}
    ha:                                                    # optional: Kea's HA hook
      this-server: edge-01
      mode: hot-standby
      peers:
        - {name: edge-01, url: "http://192.0.2.1:8000/", role: primary}
        - {name: edge-02, url: "http://192.0.2.2:8000/", role: standby}
```

The family of a subnet follows its prefix (IPv4 → kea-dhcp4, IPv6 →
kea-dhcp6). Subnet ids are Kea's lease keys: an id defaults to the subnet's
position (1-based) but should be written down, so reordering keeps leases.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from typing import Annotated, Literal

from pydantic import AfterValidator, ConfigDict, Field

from trueup.model.document import _PathError  # the document's path-carrying error
from trueup.model.limits import quoted
from trueup.model.problems import Checked, check
from trueup.model.sections import Section

__all__ = ["SECTION", "DhcpSection", "HaPeer", "HaSettings", "Lifetimes", "Reservation", "Subnet"]

_IFNAME = re.compile(r"^[A-Za-z0-9_.\-]{1,15}$")
_MAC = re.compile(r"^([0-9A-Fa-f]{2}:){5}[0-9A-Fa-f]{2}$")
_OPTION = re.compile(r"^[a-z0-9][a-z0-9\-]*$")


def _ifname(value: str) -> str:
    if not _IFNAME.match(value):
        raise ValueError(f"{quoted(value)} is not an interface name")
    return value


def _network(value: str) -> str:
    try:
        return str(ipaddress.ip_network(value, strict=True))
    except ValueError as exc:
        raise ValueError(f"{quoted(value)} is not an IPv4/IPv6 network: {exc}") from exc


def _pool(value: str) -> str:
    text = value.replace(" ", "")
    if "-" in text:
        first, _, last = text.partition("-")
        try:
            low, high = ipaddress.ip_address(first), ipaddress.ip_address(last)
        except ValueError as exc:
            raise ValueError(f"{quoted(value)} is not a pool like FIRST-LAST: {exc}") from exc
        if low.version != high.version or int(low) > int(high):
            raise ValueError(f"{quoted(value)}: the first address must not be above the last")
        return f"{low}-{high}"
    return _network(text)


def _address(value: str) -> str:
    """Checked, kept as written (the document's digest is over what the operator wrote)."""
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        raise ValueError(f"{quoted(value)} is not an IPv4/IPv6 address") from None


def _mac(value: str) -> str:
    if not _MAC.match(value):
        raise ValueError(f"{quoted(value)} is not a hardware address like 02:00:00:00:00:01")
    return value.lower()


def _option_name(value: str) -> str:
    if not _OPTION.match(value):
        raise ValueError(f"{quoted(value)} is not a Kea option name like domain-name-servers")
    return value


IfName = Annotated[str, AfterValidator(_ifname)]
Network = Annotated[str, AfterValidator(_network)]
Pool = Annotated[str, AfterValidator(_pool)]
Mac = Annotated[str, AfterValidator(_mac)]
Address = Annotated[str, AfterValidator(_address)]
OptionName = Annotated[str, AfterValidator(_option_name)]
OptionValue = str | int | bool | list[str | int]
Lifetime = Annotated[int, Field(ge=1, le=2**31)]


class _Model(Checked):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Lifetimes(_Model):
    valid: Lifetime = 3600
    renew: Lifetime | None = None
    rebind: Lifetime | None = None
    preferred: Lifetime | None = None  # DHCPv6 only


class Reservation(_Model):
    hw_address: Mac | None = Field(None, alias="hw-address")
    duid: str | None = None
    ip_address: Address = Field(alias="ip-address")
    hostname: str | None = None

    @check
    def _identifier(self) -> Reservation:
        if (self.hw_address is None) == (self.duid is None):
            raise ValueError("a reservation needs exactly one of hw-address or duid")
        return self


@functools.lru_cache(maxsize=4096)
def _family(subnet: str) -> int:
    """4 or 6 for a validated prefix (asked for every subnet on every compile: parsed once)."""
    return ipaddress.ip_network(subnet).version


class Subnet(_Model):
    id: Annotated[int, Field(ge=1, le=2**32 - 2)] | None = None
    subnet: Network
    interface: IfName | None = None
    pools: list[Pool] = []
    options: dict[OptionName, OptionValue] = {}
    reservations: list[Reservation] = []
    valid_lifetime: Lifetime | None = Field(None, alias="valid-lifetime")

    @property
    def family(self) -> int:
        return _family(self.subnet)

    @check
    def _pools_inside(self) -> list[tuple[str, str]]:
        network = ipaddress.ip_network(self.subnet)
        problems: list[tuple[str, str]] = []
        for i, pool in enumerate(self.pools):
            ends = pool.split("-") if "-" in pool else [pool.split("/")[0]]
            if any(ipaddress.ip_address(end) not in network for end in ends):
                problems.append((f"pools[{i}]", f"{pool} is not inside {self.subnet}"))
        return problems

    @check
    def _reservations_inside(self) -> list[tuple[str, str]]:
        network = ipaddress.ip_network(self.subnet)
        return [
            (
                f"reservations[{i}].ip-address",
                f"{reservation.ip_address} is not inside {self.subnet}",
            )
            for i, reservation in enumerate(self.reservations)
            if ipaddress.ip_address(reservation.ip_address) not in network
        ]


class HaPeer(_Model):
    name: str
    url: str
    role: Literal["primary", "secondary", "standby", "backup"]
    auto_failover: bool = Field(True, alias="auto-failover")


class HaSettings(_Model):
    this_server: str = Field(alias="this-server")
    mode: Literal["hot-standby", "load-balancing", "passive-backup"] = "hot-standby"
    peers: list[HaPeer]

    @check
    def _self_listed(self) -> HaSettings:
        if self.this_server not in {p.name for p in self.peers}:
            raise ValueError(f"this-server {quoted(self.this_server)} is not one of the peers")
        return self


class DhcpSection(_Model):
    """`spec.dhcp`."""

    interfaces: list[IfName] = Field(min_length=1)
    lifetimes: Lifetimes = Lifetimes()
    options: dict[OptionName, OptionValue] = {}
    subnets: list[Subnet] = Field(min_length=1)
    ha: HaSettings | None = None

    @check
    def _ids(self) -> DhcpSection:
        problems: list[tuple[str, str]] = []
        seen: dict[tuple[int, int], int] = {}
        networks: list[tuple[int, ipaddress.IPv4Network | ipaddress.IPv6Network]] = []
        for i, subnet in enumerate(self.subnets):
            key = (subnet.family, self.subnet_id(i))
            if key in seen:
                problems.append(
                    (f"subnets[{i}].id", f"{key[1]} is already used by subnets[{seen[key]}]")
                )
            seen.setdefault(key, i)
            network = ipaddress.ip_network(subnet.subnet)
            for j, other in networks:
                if other.version == network.version and other.overlaps(network):
                    problems.append(
                        (
                            f"subnets[{i}].subnet",
                            f"{network} overlaps subnets[{j}] ({other}); "
                            "an address must belong to one subnet",
                        )
                    )
                    break
            networks.append((i, network))
            if subnet.interface is not None and subnet.interface not in self.interfaces:
                problems.append(
                    (
                        f"subnets[{i}].interface",
                        f"{subnet.interface} is not in spec.dhcp.interfaces",
                    )
                )
        if problems:
            raise _PathError.many(problems)
        return self

    def subnet_id(self, index: int) -> int:
        subnet = self.subnets[index]
        return subnet.id if subnet.id is not None else index + 1

    def families(self) -> list[int]:
        return sorted({s.family for s in self.subnets})


SECTION = Section("dhcp", DhcpSection)
