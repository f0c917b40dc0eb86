"""`spec.ha`: the HA role and the virtual addresses it holds (pure data; errors name the path).

```yaml
spec:
  ha:
    role: primary            # primary | standby | none (none: no VIP held, no keepalived)
    priority: 150            # optional 1-254; default primary 200, standby 100
    advert_interval: 1       # seconds between VRRP advertisements (0.01-40.95)
    preempt: true            # a higher priority takes the VIPs back
    peers: [192.0.2.3]       # optional unicast peers; multicast when empty
    vips:
      - {interface: lan0, vrid: 51, addresses: [203.0.113.254/24]}
```
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from trueup.model.document import _PathError  # the document's path-carrying error
from trueup.model.problems import Checked, check
from trueup.model.sections import CrossCheck, OtherSections, Problem, Section
from trueup.model.types import IfName, IpAddress, IpPrefix, family_of
from trueup.model.virtual import host_of

if TYPE_CHECKING:
    from trueup.model.document import DeviceSpec

__all__ = ["DEFAULT_PRIORITY", "SECTION", "HaSection", "Vip", "dhcp_role_matches"]

DEFAULT_PRIORITY = {"primary": 200, "standby": 100}
# Kea HA peer roles (`spec.dhcp.ha.peers[].role`) each HA role agrees with.
_DHCP_ROLES = {"primary": {"primary"}, "standby": {"standby", "secondary", "backup"}}


class _Model(Checked):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Vip(_Model):
    interface: IfName
    vrid: int = Field(ge=1, le=255, description="VRRP virtual router id, unique per interface")
    addresses: list[IpPrefix] = Field(min_length=1)

    def families(self) -> list[int]:
        return sorted({family_of(a) for a in self.addresses})


class HaSection(_Model):
    """`spec.ha`."""

    role: Literal["primary", "standby", "none"]
    priority: int | None = Field(None, ge=1, le=254)
    advert_interval: float = Field(1.0, ge=0.01, le=40.95)
    preempt: bool = True
    peers: list[IpAddress] = []
    vips: list[Vip] = Field(min_length=1)

    @check
    def _consistent(self) -> HaSection:
        problems: list[tuple[str, str]] = []
        if round(self.advert_interval * 100) != self.advert_interval * 100:
            problems.append(("advert_interval", "expected seconds in steps of 0.01"))
        vrids: dict[tuple[str, int], int] = {}
        hosts: dict[str, str] = {}
        families: set[int] = set()
        for i, vip in enumerate(self.vips):
            key = (vip.interface, vip.vrid)
            if key in vrids:
                problems.append(
                    (
                        f"vips[{i}].vrid",
                        f"{vip.vrid} is already used on {vip.interface} by vips[{vrids[key]}]",
                    )
                )
            vrids.setdefault(key, i)
            for j, address in enumerate(vip.addresses):
                host = host_of(address)
                if host in hosts:
                    problems.append(
                        (f"vips[{i}].addresses[{j}]", f"duplicate address (also {hosts[host]})")
                    )
                hosts.setdefault(host, f"spec.ha.vips[{i}].addresses[{j}]")
            families.update(vip.families())
        if self.peers:
            peer_families = {family_of(p) for p in self.peers}
            for family in sorted(families - peer_families):
                problems.append(
                    (
                        "peers",
                        f"IPv{family} virtual addresses but no IPv{family} peer; unicast "
                        "VRRP needs a peer of each family (or no peers: multicast)",
                    )
                )
        if problems:
            raise _PathError.many(problems)
        return self

    def effective_priority(self) -> int:
        if self.priority is not None:
            return self.priority
        return DEFAULT_PRIORITY.get(self.role, 0)


def dhcp_role_hint(role: str) -> str:
    allowed = sorted(_DHCP_ROLES.get(role, set()))
    return "Kea HA peer role " + " or ".join(allowed) if allowed else "no Kea HA with role none"


def dhcp_role_matches(role: str, kea_role: str) -> bool:
    return kea_role in _DHCP_ROLES.get(role, set())


class _KeaPeer(BaseModel):
    """A Kea HA peer as this check reads it (`spec.dhcp.ha.peers[]`)."""

    name: str
    role: str


class _KeaHa(BaseModel):
    this_server: str
    peers: list[_KeaPeer]


class DhcpRoles(BaseModel):
    """What the HA role check reads of `spec.dhcp`: its Kea HA peers, if any."""

    ha: _KeaHa | None = None


def _fits_spec(ha: HaSection, spec: DeviceSpec, others: OtherSections) -> list[Problem]:
    """Virtual addresses on managed interfaces, apart from the interface and management
    addresses; the API never binds one (paths below `spec`)."""
    del others
    problems: list[Problem] = []
    names = {spec.management.interface, *(i.name for i in spec.interfaces)}
    owned: dict[str, str] = {}
    for i, address in enumerate(spec.management.addresses):
        owned[host_of(address)] = f"spec.management.addresses[{i}]"
    for i, iface in enumerate(spec.interfaces):
        for j, address in enumerate(iface.addresses):
            owned.setdefault(host_of(address), f"spec.interfaces[{i}].addresses[{j}]")
    vip_hosts: dict[str, str] = {}
    for i, vip in enumerate(ha.vips):
        if vip.interface not in names:
            problems.append(
                (
                    f"ha.vips[{i}].interface",
                    f"{vip.interface} is not a managed interface "
                    "(name it in spec.interfaces or spec.management)",
                )
            )
        for j, address in enumerate(vip.addresses):
            host = host_of(address)
            vip_hosts.setdefault(host, f"spec.ha.vips[{i}].addresses[{j}]")
            if host in owned and not owned[host].startswith("spec.management"):
                problems.append(
                    (
                        f"ha.vips[{i}].addresses[{j}]",
                        f"{host} is also {owned[host]}; a virtual address is held by "
                        "the HA role, not listed as an interface address",
                    )
                )
    for i, address in enumerate(spec.management.addresses):
        host = host_of(address)
        if host in vip_hosts:
            problems.append(
                (
                    f"management.addresses[{i}]",
                    f"{host} is an HA virtual address ({vip_hosts[host]}); the management "
                    "address must stay on this node whatever its HA role",
                )
            )
    bind = spec.management.api.bind
    if bind not in (None, "management") and host_of(str(bind)) in vip_hosts:
        problems.append(
            (
                "management.api.bind",
                f"{bind} is an HA virtual address ({vip_hosts[host_of(str(bind))]}); the "
                "API never binds a virtual address (bind the management address, "
                "'management', or leave it out for the wildcard)",
            )
        )
    return problems


def _dhcp_follows(ha: HaSection, spec: DeviceSpec, others: OtherSections) -> list[Problem]:
    """This server's Kea HA role (`spec.dhcp.ha`) agrees with `spec.ha.role`."""
    del spec
    dhcp = others.get("dhcp", DhcpRoles)
    if dhcp is None or dhcp.ha is None:
        return []
    problems: list[Problem] = []
    for k, peer in enumerate(dhcp.ha.peers):
        if peer.name != dhcp.ha.this_server:
            continue
        if not dhcp_role_matches(ha.role, peer.role):
            problems.append(
                (
                    f"dhcp.ha.peers[{k}].role",
                    f"this server ({peer.name}) is the Kea HA {peer.role} but "
                    f"spec.ha.role is {ha.role}; DHCP's HA role must follow it "
                    f"({dhcp_role_hint(ha.role)})",
                )
            )
    return problems


SECTION = Section(
    "ha",
    HaSection,
    checks=(CrossCheck(_fits_spec), CrossCheck(_dhcp_follows, against=("dhcp",))),
)
