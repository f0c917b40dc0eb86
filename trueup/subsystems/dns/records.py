"""Records as canonical text, and the records DHCP leases give (pure functions, no I/O).

A record is one line, `OWNER TTL TYPE RDATA`, exactly as `knotc zone-read`
prints it (without the `[zone]` prefix): owner absolute and lower-case,
addresses in their canonical form, target names absolute, TXT quoted. The
document, Knot and the zone file are compared in this one form.

Lease-derived records (`lease_records`), the rules:

* only leases in state `default` that have not expired, with a hostname that
  makes a DNS label (Kea's FQDN forms `host.` and `host.ZONE` are reduced to
  `host`; anything else that is not a label is skipped and counted);
* `host.ZONE TTL A|AAAA ADDRESS`, and `PTR host.ZONE` in the most specific
  reverse zone that holds the address (none: no PTR);
* a name that has a static record is never taken by a lease (a client
  calling itself `router` does not move `router`);
* two leases with one hostname and family: the one that expires last wins,
  alone (its PTR too).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

# Records in canonical text are the section's (the document's values are canonical).
from trueup.subsystems.dns.section import canonical_name, canonical_record, reverse_zone
from trueup.system.kealeases import Lease

__all__ = [
    "LeaseSettings",
    "LeaseView",
    "canonical_name",
    "canonical_record",
    "lease_records",
    "parse_zone_file",
    "render_zone_file",
    "reverse_zone",
]

_HOST = re.compile(r"^[a-z0-9]([a-z0-9\-]{0,61}[a-z0-9])?$")


@dataclass(frozen=True)
class LeaseSettings:
    """What lease-derived records depend on, besides the leases."""

    zone: str
    ttl: int
    reverse: tuple[str, ...] = ()
    # Owners with static records: never taken by a lease.
    static_owners: frozenset[str] = frozenset()

    def to_json(self) -> dict[str, object]:
        return {"zone": self.zone, "ttl": self.ttl, "reverse": list(self.reverse)}


@dataclass
class LeaseView:
    """The records leases give, per zone, and the leases left out (with why)."""

    records: dict[str, set[str]] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)


def _host(hostname: str, zone: str) -> str | None:
    name = hostname.strip().lower().rstrip(".")
    bare = zone.rstrip(".")
    if name.endswith("." + bare):
        name = name[: -len(bare) - 1]
    return name if _HOST.match(name) else None


def lease_records(leases: Iterable[Lease], settings: LeaseSettings, now: float) -> LeaseView:
    view = LeaseView(records={settings.zone: set()})
    networks = sorted(
        (ipaddress.ip_network(p) for p in settings.reverse), key=lambda n: -n.prefixlen
    )
    for network in networks:
        view.records[reverse_zone(str(network))] = set()
    winners: dict[tuple[str, int], Lease] = {}
    for lease in leases:
        if lease.state != "default" or lease.expire <= now or not lease.hostname:
            continue
        if lease.family == 6 and lease.lease_type not in ("", "IA_NA"):
            continue
        host = _host(lease.hostname, settings.zone)
        if host is None:
            view.skipped.append(f"{lease.address}: hostname {lease.hostname!r} is not a label")
            continue
        owner = f"{host}.{settings.zone}"
        if owner in settings.static_owners:
            view.skipped.append(f"{lease.address}: {owner} has static records")
            continue
        key = (owner, lease.family)
        if key not in winners or lease.expire > winners[key].expire:
            winners[key] = lease
    for (owner, family), lease in sorted(winners.items()):
        rtype = "A" if family == 4 else "AAAA"
        address = ipaddress.ip_address(lease.address)
        view.records[settings.zone].add(f"{owner} {settings.ttl} {rtype} {address}")
        holder = next((n for n in networks if address in n), None)
        pointer = f"{address.reverse_pointer}."
        if holder is not None and pointer not in settings.static_owners:
            zone = reverse_zone(str(holder))
            view.records[zone].add(f"{pointer} {settings.ttl} PTR {owner}")
    return view


# -- the zone file ----------------------------------------------------------------
def render_zone_file(zone: str, records: Iterable[str], serial: int) -> str:
    """SOA and the records, one per line, in the canonical form (Knot reads it as is)."""
    soa = f"{zone} 3600 IN SOA ns.{zone} hostmaster.{zone} {serial} 3600 900 604800 60"
    lines = ["; written by trueup: edits are drift and are put back", soa]
    for record in sorted(records):
        owner, ttl, rtype, rdata = record.split(" ", 3)
        lines.append(f"{owner} {ttl} IN {rtype} {rdata}")
    return "\n".join(lines) + "\n"


def parse_zone_file(text: str) -> list[str]:
    """The records of a zone file trueup wrote (SOA left out), canonical and sorted.

    A line that is not in trueup's one-record-per-line form is kept as
    `unparsed: LINE`, so an edit that trueup cannot read is still drift.
    """
    out: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(";"):
            continue
        words = line.split(None, 4)
        if len(words) == 5 and words[2].upper() == "IN" and words[1].isdigit():
            owner, ttl, _class, rtype, rdata = words
            if rtype.upper() == "SOA":
                continue
            out.append(f"{owner.lower()} {int(ttl)} {rtype.upper()} {rdata}")
        else:
            out.append(f"unparsed: {line}")
    return sorted(out)
