"""Where a webhook may go: the target policy, checked at configuration and at delivery.

Routing calls `check_url` when a target is configured; the notifier calls `vet`
before every attempt. A URL is parsed by the HTTP client's own parser
(`httpx.URL`) and its host read the way the resolver reads it: IPv4 in every
spelling `inet_aton` accepts (`127.1`, `2130706433`, `0x7f.1`, `0177.0.0.1`), a
trailing dot, IDNA folding (`ⓛocalhost` is `localhost`), IPv6 with a zone.

Refused by default, whatever the spelling (`refusal`): loopback, link-local,
private (RFC 1918, ULA, site-local), shared (CGNAT 100.64/10), multicast,
unspecified, broadcast, documentation and other reserved addresses, and the
IPv4-mapped, IPv4-compatible, NAT64, 6to4 and Teredo forms of those; the names
`localhost` and `*.localhost`. A tenant's allowlist (`Allowlist`: networks and
exact host names) opens the way to its internal receivers, except to addresses
that are never a receiver (unspecified, multicast, broadcast).

At delivery the name is resolved once (`Resolve`, the seam tests replace),
every address it resolves to is checked, and the request goes to the vetted
address itself (`Pinned`), with the name kept in the Host header and the TLS
server name: a second resolution (DNS rebinding) never happens.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
import idna

from trueup.server.service.errors import Invalid
from trueup.server.service.notify.hostnames import Address, inet_aton, parse_host

__all__ = [
    "Allowlist",
    "Pinned",
    "PolicyRefused",
    "Resolve",
    "check_url",
    "parse_host",
    "refusal",
    "system_resolve",
    "vet",
]

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolve = Callable[[str, int], list[str]]
ALLOWLIST_ENTRIES = 100
_HINT = "internal receivers need the tenant's allowlist"
_NO_RECEIVER = "no webhook receiver listens there"


def _nets(*spec: str) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(s) for s in spec)


# Addresses that are never a webhook receiver, allowlisted or not.
_NEVER: tuple[tuple[tuple[Network, ...], str], ...] = (
    (_nets("0.0.0.0/32", "::/128"), "the unspecified address"),
    (_nets("255.255.255.255/32"), "the broadcast address"),
    (_nets("224.0.0.0/4", "ff00::/8"), "a multicast address"),
)
# The rest of IANA's special-purpose registries, first match wins.
_INSIDE: tuple[tuple[tuple[Network, ...], str], ...] = (
    *_NEVER,
    (_nets("127.0.0.0/8", "::1/128"), "a loopback address"),
    (_nets("169.254.0.0/16", "fe80::/10"), "a link-local address"),
    (_nets("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"), "a private address (RFC 1918)"),
    (_nets("fc00::/7"), "a private address (unique local, fc00::/7)"),
    (_nets("fec0::/10"), "a private address (site-local)"),
    (_nets("100.64.0.0/10"), "a shared address (CGNAT, 100.64.0.0/10)"),
    (_nets("0.0.0.0/8"), "a reserved address ('this network')"),
    (
        _nets("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32"),
        "a documentation address",
    ),
    (_nets("64:ff9b:1::/48"), "a reserved address (local-use NAT64)"),
    (_nets("192.0.0.0/24"), "a reserved address (IETF protocol assignments)"),
    (_nets("198.18.0.0/15"), "a reserved address (benchmarking)"),
    (_nets("192.88.99.0/24"), "a reserved address (6to4 relay anycast)"),
    (_nets("100::/64"), "a reserved address (discard-only)"),
)
_MAPPED = ipaddress.ip_network("::ffff:0:0/96")
_COMPATIBLE = ipaddress.ip_network("::/96")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_6TO4 = ipaddress.ip_network("2002::/16")
_TEREDO = ipaddress.ip_network("2001::/32")
_EMBEDDING = (_MAPPED, _COMPATIBLE, _NAT64, _6TO4, _TEREDO)


class PolicyRefused(Exception):
    """A target the policy refuses; the message is what the admin reads."""


def _unscoped(address: Address) -> Address:
    if isinstance(address, ipaddress.IPv6Address) and address.scope_id:
        return ipaddress.IPv6Address(str(address).split("%")[0])
    return address


def _classify(address: Address, table: Iterable[tuple[tuple[Network, ...], str]]) -> str | None:
    for networks, reason in table:
        if any(address.version == n.version and address in n for n in networks):
            return reason
    return None


def _embedded(address: ipaddress.IPv6Address) -> tuple[str, list[ipaddress.IPv4Address]]:
    """IPv4 addresses an IPv6 address carries (mapped, compatible, NAT64, 6to4, Teredo)."""
    value = int(address)
    if address in _MAPPED:
        return "an IPv4-mapped", [ipaddress.IPv4Address(value & 0xFFFFFFFF)]
    if address in _COMPATIBLE:
        return "an IPv4-compatible", [ipaddress.IPv4Address(value & 0xFFFFFFFF)]
    if address in _NAT64:
        return "a NAT64", [ipaddress.IPv4Address(value & 0xFFFFFFFF)]
    if address in _6TO4:
        return "a 6to4", [ipaddress.IPv4Address((value >> 80) & 0xFFFFFFFF)]
    if address in _TEREDO and address.teredo is not None:
        return "a Teredo", list(address.teredo)
    return "", []


def refusal(address: Address) -> str | None:
    """Why the default policy refuses `address` ("a loopback address"), or None."""
    address = _unscoped(address)
    reason = _classify(address, _INSIDE)
    if reason is not None:
        return reason
    if isinstance(address, ipaddress.IPv6Address):
        form, inner = _embedded(address)
        for v4 in inner:
            why = refusal(v4)
            if why is not None:
                return f"{form} form of {v4} ({why})"
    if not address.is_global:
        return "a reserved address"
    return None


def _never(address: Address) -> str | None:
    address = _unscoped(address)
    direct = _classify(address, _NEVER)
    if direct is None and isinstance(address, ipaddress.IPv6Address):
        form, inner = _embedded(address)
        for v4 in inner:
            why = _classify(v4, _NEVER)
            if why is not None:
                return f"{form} form of {v4} ({why})"
    return direct


@dataclass(frozen=True)
class Allowlist:
    """A tenant's internal receivers: networks (CIDRs) and exact host names."""

    networks: tuple[Network, ...] = ()
    names: tuple[str, ...] = ()

    @classmethod
    def parse(cls, entries: list[str], field: str = "entries") -> Allowlist:
        problems: list[str] = []
        networks: list[Network] = []
        names: list[str] = []
        if len(entries) > ALLOWLIST_ENTRIES:
            raise Invalid([f"{field}: at most {ALLOWLIST_ENTRIES} entries"])
        for index, entry in enumerate(entries):
            where = f"{field}[{index}]"
            if "/" in entry or ":" in entry or inet_aton(entry) is not None:
                try:
                    network = ipaddress.ip_network(entry, strict=False)
                except ValueError:
                    problems.append(f"{where}: {entry!r} is not a network (CIDR) or host name")
                    continue
                shortest = 8
                if network.prefixlen < shortest:
                    problems.append(
                        f"{where}: {entry!r} is wider than /{shortest}; "
                        "name the internal receivers' networks, not the internet"
                    )
                elif isinstance(network, ipaddress.IPv6Network) and any(
                    network.overlaps(n) and network.prefixlen < n.prefixlen + shortest
                    for n in _EMBEDDING
                ):
                    # ::ffff:0:0/96 is /96 wide but is every IPv4 address, loopback and
                    # metadata included: the width rule applies to the IPv4 it embeds.
                    problems.append(
                        f"{where}: {entry!r} covers more than a /{shortest} of IPv4 in its "
                        "IPv6 forms (mapped, compatible, NAT64, 6to4, Teredo); name the IPv4 "
                        "network instead"
                    )
                elif any(
                    n.version == network.version and network.overlaps(n)
                    for networks_, _ in _NEVER
                    for n in networks_
                ):
                    problems.append(
                        f"{where}: {entry!r} covers addresses that are never a receiver "
                        "(unspecified, broadcast or multicast)"
                    )
                elif network not in networks:
                    networks.append(network)
                continue
            try:
                name, _ = parse_host(entry)
            except (ValueError, idna.IDNAError):
                problems.append(f"{where}: {entry!r} is not a network (CIDR) or host name")
                continue
            if inet_aton(name) is not None or ":" in name:
                # '¹' normalises to '1', which resolvers read as 0.0.0.1: a name that
                # spells an address would be permitted by name but is an address.
                problems.append(
                    f"{where}: {entry!r} reads as the address {name} once normalised; "
                    "write the network (CIDR) itself"
                )
                continue
            if name not in names:
                names.append(name)
        if problems:
            raise Invalid(problems)
        return cls(tuple(networks), tuple(names))

    def entries(self) -> list[str]:
        return [str(n) for n in self.networks] + list(self.names)

    def permits(self, address: Address) -> bool:
        address = _unscoped(address)
        return any(address.version == n.version and address in n for n in self.networks)


@dataclass(frozen=True)
class _Parsed:
    url: httpx.URL
    host: str  # as the resolver sees it
    address: Address | None  # when the host spells an address
    port: int
    credentials: bool


def _parse(url: str) -> _Parsed:
    try:
        parsed = httpx.URL(url)
        if parsed.scheme not in ("http", "https") or not parsed.raw_host:
            raise ValueError("not an http:// or https:// URL with a host")
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        if not 1 <= port <= 65535:
            raise ValueError(f"port {port} is out of range")
        host, address = parse_host(parsed.raw_host.decode("ascii"))
    except (httpx.InvalidURL, ValueError, idna.IDNAError) as exc:
        # Never the URL itself in the message: it may carry credentials.
        raise Invalid([_unparsable(url) or f"url: not a valid http(s) URL: {exc}"]) from None
    return _Parsed(parsed, host, address, port, bool(parsed.userinfo))


def _unparsable(url: str) -> str | None:
    """Why a URL the HTTP client refuses points inside, when its host says so (`0177.0.0.1`,
    `ⓛocalhost`): the clearer message."""
    try:
        written = urlsplit(url).hostname or ""
        host, address = parse_host(written)
    except (ValueError, idna.IDNAError, UnicodeError):
        return None
    why = refusal(address) if address is not None else _refused_name(host)
    return f"url: {written} is {why}; {_HINT}" if why else None


def _refused_name(host: str) -> str | None:
    if host == "localhost" or host.endswith(".localhost"):
        return "a loopback name"
    return None


def check_url(url: str, allowlist: Allowlist) -> None:
    """At configuration: the URL, its credentials and the host as written. Raises Invalid."""
    parsed = _parse(url)
    if parsed.credentials:
        raise Invalid(
            [
                "url: carries credentials (user:password@), which would be stored and shown "
                "in the clear; send them with the target's auth_header (stored sealed) instead"
            ]
        )
    if parsed.host in allowlist.names:
        why = parsed.address and _never(parsed.address)
    elif parsed.address is not None:
        why = _never(parsed.address) or (
            None if allowlist.permits(parsed.address) else refusal(parsed.address)
        )
    else:
        why = _refused_name(parsed.host)
    if why:
        hint = _HINT if parsed.address is None or not _never(parsed.address) else _NO_RECEIVER
        shown = parsed.url.raw_host.decode("ascii")
        spelled = (
            f"{shown} ({parsed.address})"
            if parsed.address and shown != str(parsed.address)
            else shown
        )
        raise Invalid([f"url: {spelled} is {why}; {hint}"])


def redact(url: str) -> str:
    """The URL without its credentials (what the log and the API show)."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL:
        return "<invalid URL>"
    return str(parsed.copy_with(userinfo=b"")) if parsed.userinfo else url


@dataclass(frozen=True)
class Pinned:
    """Where the request goes: the vetted address, and the name it is for."""

    url: httpx.URL  # the target URL with the vetted address as its host
    host_header: str
    sni_hostname: str | None
    address: str


def system_resolve(host: str, port: int) -> list[str]:
    """Every address the system resolver gives for `host` (the `system`-like boundary)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def vet(url: str, allowlist: Allowlist, resolve: Resolve) -> Pinned:
    """At delivery: resolve once, check every address, pin the request to a vetted one.

    Raises PolicyRefused (with the reason, never an address the name resolved to),
    or socket.gaierror when the name does not resolve."""
    parsed = _parse(url)
    if parsed.credentials:
        raise PolicyRefused(
            "the URL carries credentials, which are not sent; "
            "delete the target and add it again with an auth_header"
        )
    by_name = parsed.host in allowlist.names
    why = None if by_name else _refused_name(parsed.host)
    if why:
        raise PolicyRefused(f"{parsed.host} is {why}; {_HINT}")
    if parsed.address is not None:
        addresses: list[Address] = [parsed.address]
    else:
        addresses = [ipaddress.ip_address(a) for a in resolve(parsed.host, parsed.port)]
        if not addresses:
            raise socket.gaierror(socket.EAI_NONAME, "no address")
    for address in addresses:
        why = _never(address)
        if why is None and not by_name and not allowlist.permits(address):
            why = refusal(address)
        if why:
            verb = "is" if parsed.address is not None else "resolves to"
            raise PolicyRefused(f"{parsed.host} {verb} {why}; {_HINT}")
    chosen = addresses[0]
    host_header = parsed.url.netloc.decode("ascii")
    return Pinned(
        url=parsed.url.copy_with(host=str(_unscoped(chosen))),
        host_header=host_header,
        sni_hostname=parsed.host if parsed.address is None else None,
        address=str(chosen),
    )
