"""`spec.dns`: what the document asks of DNS (pure data, validated; errors name the path).

```yaml
spec:
  dns:
    zone: lan.test                      # the local zone
    listen: [203.0.113.1, "2001:db8:1::1@5353"]   # ADDRESS or ADDRESS@PORT (default 53)
    ttl: 300                            # default for records without one
    records:
      - {name: router, type: A, value: 203.0.113.1}
      - {name: "@", type: MX, value: "10 mail"}
      - {name: www, type: CNAME, value: router, ttl: 60}
      - {name: _sip._udp, type: SRV, value: "10 5 5060 sip"}
      - {name: "@", type: TXT, value: "v=spf1 -all"}
      - {name: 1.113.0.203.in-addr.arpa., type: PTR, value: router}
    reverse: [203.0.113.0/24, "2001:db8:1::/64"]   # reverse zones, as prefixes
    leases: {ttl: 60}                   # records from DHCP leases (absent: none)
```

Names are relative to the zone (`@` is the zone itself) unless they end
with a dot. Every record's owner must be inside the zone or one of the
reverse zones; targets (CNAME, PTR, MX, SRV) that are relative are in the
zone. Records come out in canonical text (`records.py`), as Knot prints them.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Literal

from pydantic import AfterValidator, ConfigDict, Field

from trueup.model.document import _PathError  # the document's path-carrying error
from trueup.model.limits import quoted
from trueup.model.problems import Checked, check
from trueup.model.sections import Section

__all__ = [
    "SECTION",
    "DnsRecord",
    "DnsSection",
    "LeaseRecords",
    "canonical_name",
    "canonical_record",
    "reverse_zone",
]

_LABEL = re.compile(r"^[a-z0-9_]([a-z0-9_\-]{0,61}[a-z0-9_])?$")


def canonical_name(name: str, zone: str) -> str:
    """`name` made absolute in `zone` (`@` is the zone), lower-case, checked."""
    text = name.strip().lower()
    if text == "@":
        text = zone
    elif not text.endswith("."):
        text = f"{text}.{zone}" if zone else f"{text}."
    labels = text[:-1].split(".") if text != "." else []
    if len(text) > 254 or not labels or not all(_LABEL.match(label) for label in labels):
        raise ValueError(f"{name!r} is not a domain name")
    return text


def _txt(value: str) -> str:
    if not all(32 <= ord(c) < 127 for c in value):
        raise ValueError("TXT values are printable ASCII")
    if len(value) > 255:
        raise ValueError("a TXT value is at most 255 characters")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _numbers(value: str, count: int, what: str) -> list[str]:
    words = value.split()
    if len(words) != count + 1 or not all(w.isdigit() and int(w) < 65536 for w in words[:count]):
        raise ValueError(f"{value!r} is not {what}")
    return [str(int(w)) for w in words[:count]] + [words[count]]


def canonical_record(name: str, rtype: str, value: str, ttl: int, zone: str) -> str:
    """One record as canonical text; ValueError says what is wrong with it."""
    owner = canonical_name(name, zone)
    if rtype in ("A", "AAAA"):
        try:
            address = ipaddress.ip_address(value.strip())
        except ValueError as exc:
            raise ValueError(f"value {value!r} is not an address") from exc
        if address.version != (4 if rtype == "A" else 6):
            raise ValueError(f"value {value!r} is not an IPv{4 if rtype == 'A' else 6} address")
        rdata = str(address)
    elif rtype in ("CNAME", "PTR"):
        rdata = canonical_name(value, zone)
    elif rtype == "MX":
        preference, target = _numbers(value, 1, "PREFERENCE TARGET")
        rdata = f"{preference} {canonical_name(target, zone)}"
    elif rtype == "SRV":
        *numbers, target = _numbers(value, 3, "PRIORITY WEIGHT PORT TARGET")
        rdata = " ".join([*numbers, canonical_name(target, zone)])
    elif rtype == "TXT":
        rdata = _txt(value)
    else:
        raise ValueError(f"record type {rtype} is not supported")
    return f"{owner} {ttl} {rtype} {rdata}"


def reverse_zone(prefix: str) -> str:
    """`203.0.113.0/24` → `113.0.203.in-addr.arpa.` (octet or nibble boundaries)."""
    network = ipaddress.ip_network(prefix)
    labels = network.network_address.reverse_pointer.split(".")
    keep = network.prefixlen // (8 if network.version == 4 else 4)
    drop = (4 if network.version == 4 else 32) - keep
    return ".".join(labels[drop:]) + "."


_MAX_TTL = 2_147_483_647
Ttl = Annotated[int, Field(ge=0, le=_MAX_TTL)]


def _zone(value: str) -> str:
    return canonical_name(value, "")


def _listen(value: str) -> str:
    address, _, port = value.partition("@")
    try:
        canonical = str(ipaddress.ip_address(address))
    except ValueError as exc:
        raise ValueError(f"{quoted(value)} is not ADDRESS or ADDRESS@PORT") from exc
    number = int(port) if port.isdigit() else (53 if not port else -1)
    if not 0 < number < 65536:
        raise ValueError(f"{quoted(value)}: the port must be 1-65535")
    return f"{canonical}@{number}"


def _reverse(value: str) -> str:
    try:
        network = ipaddress.ip_network(value, strict=True)
    except ValueError as exc:
        raise ValueError(f"{quoted(value)} is not an IPv4/IPv6 prefix: {exc}") from exc
    step = 8 if network.version == 4 else 4
    if network.prefixlen == 0 or network.prefixlen % step:
        unit = "8 (IPv4)" if network.version == 4 else "4 (IPv6)"
        raise ValueError(f"{quoted(value)}: a reverse zone's prefix length is a multiple of {unit}")
    return str(network)


_LABELS = re.compile(r"^[A-Za-z0-9_@.\-]+$")


class DnsRecord(Checked):
    """One static record; `ttl` defaults to the section's."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=253)
    type: Literal["A", "AAAA", "CNAME", "TXT", "MX", "SRV", "PTR"]
    value: str = Field(min_length=1, max_length=1000)
    ttl: Ttl | None = None

    @check
    def _names(self) -> DnsRecord:
        if not _LABELS.match(self.name):
            raise ValueError(f"name {quoted(self.name)} is not a domain name")
        return self


class LeaseRecords(Checked):
    """Records derived from DHCP leases: hostname → A/AAAA in the zone, PTR in reverse zones.

    `lease4_file`/`lease6_file` default to where trueup's DHCP subsystem has
    Kea keep them (`STATE_DIR/run/kea-dhcpN/kea-leasesN.csv`).
    """

    model_config = ConfigDict(extra="forbid")

    ttl: Ttl = 300
    lease4_file: str | None = None
    lease6_file: str | None = None


class DnsSection(Checked):
    """`spec.dns`: one local zone served by Knot, its reverse zones and lease-derived records."""

    model_config = ConfigDict(extra="forbid")

    zone: Annotated[str, AfterValidator(_zone)]
    listen: list[Annotated[str, AfterValidator(_listen)]] = Field(min_length=1)
    ttl: Ttl = 300
    records: list[DnsRecord] = Field(default_factory=list)
    reverse: list[Annotated[str, AfterValidator(_reverse)]] = Field(default_factory=list)
    leases: LeaseRecords | None = None

    @check
    def _records_fit(self) -> DnsSection:
        zones = self.zones()
        problems: list[tuple[str, str]] = []
        owners: dict[str, list[int]] = {}
        for index, record in enumerate(self.records):
            where = f"records[{index}]"
            try:
                text = canonical_record(
                    record.name,
                    record.type,
                    record.value,
                    self.ttl if record.ttl is None else record.ttl,
                    self.zone,
                )
            except ValueError as exc:
                problems.append((where, str(exc)))
                continue
            owner = text.split(" ", 1)[0]
            if self.zone_of(owner) is None:
                problems.append(
                    (
                        f"{where}.name",
                        f"{owner} is outside the zones {', '.join(zones)} (a name ending in "
                        "a dot is absolute; declare a reverse zone under reverse:)",
                    )
                )
                continue
            owners.setdefault(owner, []).append(index)
        for owner, indexes in owners.items():
            types = {self.records[i].type for i in indexes}
            if "CNAME" in types and len(types) > 1:
                cname = next(i for i in indexes if self.records[i].type == "CNAME")
                problems.append((f"records[{cname}]", f"{owner} has a CNAME and other records"))
        if problems:
            raise _PathError.many(problems)
        return self

    def zones(self) -> list[str]:
        """The zone, then the reverse zones (absolute names)."""
        return [self.zone, *(reverse_zone(prefix) for prefix in self.reverse)]

    def zone_of(self, owner: str) -> str | None:
        """The most specific of this section's zones that holds `owner`."""
        inside = [z for z in self.zones() if owner == z or owner.endswith("." + z)]
        return max(inside, key=len) if inside else None

    def static_records(self) -> dict[str, list[str]]:
        """Zone → its static records, canonical and sorted."""
        out: dict[str, list[str]] = {zone: [] for zone in self.zones()}
        for record in self.records:
            ttl = self.ttl if record.ttl is None else record.ttl
            text = canonical_record(record.name, record.type, record.value, ttl, self.zone)
            zone = self.zone_of(text.split(" ", 1)[0])
            assert zone is not None  # checked by the validator
            out[zone].append(text)
        return {zone: sorted(set(records)) for zone, records in out.items()}


SECTION = Section("dns", DnsSection)
