"""The rtnetlink wire format: the records trueup reads from the kernel, and their one codec.

Who calls this: `KernelNetlink` (dump replies, `trueup.system.netlink`) and
`KernelEventSource` (multicast notifications, `trueup.system.events`). Both
decode through the functions below, so a route seen in a dump and the same
route announced by an RTM_NEWROUTE notification are the same `RouteInfo`;
tests/unit/test_rtnl_codec.py checks that against messages captured from a
real kernel (tests/fixtures/rtnl/, made by scripts/capture_rtnl_fixtures.py).

Decoding never filters: link-local addresses, the kernel's own routes and
non-unicast routes decode like any other. What observation ignores is decided
by the caller (`KernelNetlink`), because attribution needs every message —
an RTM_DELROUTE of a connected route explains a vanished address.

Decoding never raises on what it is given: a truncated or malformed message
decodes to None and `split` stops at the first message that does not fit.

Messages are decoded by hand (struct over the header and the attributes we
use) rather than with pyroute2's parser, for speed: a no-op plan re-reads
every address and route of the router. Measured with
`python -m scripts.capture_rtnl_fixtures --measure` (2026-11-30, Python
3.11.7, x86_64, CPU time, best of 15): 1,000 RTM_NEWADDR messages decode to
records in 3.3 ms here and in 22 ms with pyroute2's `ifaddrmsg().decode()`
(7x, before pyroute2's messages are even turned into records); the fixtures'
four dumps (44 messages) in 0.35 ms here and 2.7 ms with pyroute2's marshal.

Why this module is over 400 lines: who sent a message is part of reading it —
the ports of this process's own sockets and its own IPv6 address writes (which
the kernel announces with port 0) are known here, beside the codec both the
dump and the notification paths decode through; apart, each would re-state it.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "MESSAGE_NAMES",
    "OPERSTATES",
    "PROTO_NAMES",
    "RTN_UNICAST",
    "RTPROT_KERNEL",
    "RTPROT_STATIC",
    "AddrInfo",
    "LinkInfo",
    "Nexthop",
    "Record",
    "RouteInfo",
    "decode",
    "decode_address",
    "decode_link",
    "decode_route",
    "detail",
    "peek_route",
    "split",
]

# Message types (linux/rtnetlink.h) and the names events carry.
RTM_NEWLINK, RTM_DELLINK = 16, 17
RTM_NEWADDR, RTM_DELADDR = 20, 21
RTM_NEWROUTE, RTM_DELROUTE = 24, 25
MESSAGE_NAMES = {
    RTM_NEWLINK: "RTM_NEWLINK",
    RTM_DELLINK: "RTM_DELLINK",
    RTM_NEWADDR: "RTM_NEWADDR",
    RTM_DELADDR: "RTM_DELADDR",
    RTM_NEWROUTE: "RTM_NEWROUTE",
    RTM_DELROUTE: "RTM_DELROUTE",
}

# Attributes used (linux/if_link.h, if_addr.h, rtnetlink.h).
IFLA_IFNAME, IFLA_MTU, IFLA_OPERSTATE, IFLA_LINKINFO, IFLA_INFO_KIND = 3, 4, 16, 18, 1
IFA_ADDRESS, IFA_LOCAL, IFA_PROTO = 1, 2, 11
IFA_FLAGS = 8

# The netlink ports of the sockets this process opened to write with (`note_own_port`):
# a notification from one of them is trueup's own change, never another writer's.
# The most recent ones are kept after their socket closed: their notifications come later.
_OWN_PORTS: dict[int, None] = {}
_OWN_PORTS_KEPT = 256


def note_own_port(sock: socket.socket) -> None:
    """Remember the port the kernel bound `sock` to as one of this process's own."""
    try:
        port = int(sock.getsockname()[0])
    except (OSError, IndexError, TypeError, ValueError):
        return
    _OWN_PORTS.pop(port, None)
    _OWN_PORTS[port] = None
    while len(_OWN_PORTS) > _OWN_PORTS_KEPT:
        del _OWN_PORTS[next(iter(_OWN_PORTS))]


def is_own_port(port: int) -> bool:
    """Whether notifications from netlink `port` are this process's own writes."""
    return port != 0 and (port in _OWN_PORTS or port == os.getpid())


# The kernel announces IPv6 address changes with port 0 whoever asked for them, so
# this process's own IPv6 address writes are noted (`note_own_address_write`): for
# `OWN_WRITE_WINDOW` seconds, port-0 notifications of the same message for that address
# (the add, then DAD completing) are its own; one of the other message (another writer
# deleting what was just added) is not, and ends the claim.
OWN_WRITE_WINDOW = 10.0
_OWN_WRITES: dict[str, tuple[str, float]] = {}  # canonical prefix → (message name, until)
_OWN_WRITES_LOCK = threading.Lock()


def _canonical_v6(prefix: str) -> str | None:
    try:
        interface = ipaddress.ip_interface(prefix)
    except ValueError:
        return None
    return str(interface) if interface.version == 6 else None


def note_own_address_write(message: str, prefix: str) -> None:
    """This process is about to send `message` (`RTM_NEWADDR`/`RTM_DELADDR`) for `prefix`."""
    key = _canonical_v6(prefix)
    if key is None:
        return  # IPv4 notifications carry the writer's port
    now = time.monotonic()
    with _OWN_WRITES_LOCK:
        for old in [k for k, (_m, until) in _OWN_WRITES.items() if until < now]:
            del _OWN_WRITES[old]
        _OWN_WRITES[key] = (message, now + OWN_WRITE_WINDOW)


def is_own_address_write(message: str, prefix: str) -> bool:
    """Whether a port-0 `message` for `prefix` is this process's own write (see above)."""
    key = _canonical_v6(prefix)
    if key is None:
        return False
    with _OWN_WRITES_LOCK:
        noted = _OWN_WRITES.get(key)
        if noted is None:
            return False
        if noted[1] < time.monotonic() or noted[0] != message:
            del _OWN_WRITES[key]
            return False
        return True


# ifa_flags bits (linux/if_addr.h) that tell who removed an address, by name
ADDRESS_FLAGS = {
    0x01: "secondary",
    0x08: "dadfailed",
    0x20: "deprecated",
    0x40: "tentative",
    0x80: "permanent",
}
RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_PRIORITY, RTA_MULTIPATH, RTA_TABLE, RTA_VIA = (
    1,
    4,
    5,
    6,
    9,
    15,
    18,
)
IFF_UP = 0x1
IFF_LOWER_UP = 0x10000
OPERSTATES = ("UNKNOWN", "NOTPRESENT", "DOWN", "LOWERLAYERDOWN", "TESTING", "DORMANT", "UP")

RTN_UNICAST = 1
RTPROT_KERNEL = 2
RTPROT_STATIC = 4
PROTO_NAMES = {
    0: "unspec",
    1: "redirect",
    2: "kernel",
    3: "boot",
    4: "static",
    9: "ra",
    11: "zebra",
    12: "bird",
    16: "dhcp",
    186: "bgp",
    188: "ospf",
}

_NLMSGHDR = struct.Struct("=IHHII")  # length, type, flags, seq, pid
_IFINFOMSG = struct.Struct("=BxHiII")  # family, type, index, flags, change
_IFADDRMSG = struct.Struct("=BBBBI")  # family, prefixlen, flags, scope, index
# family, dst_len, src_len, tos, table, protocol, scope, type, flags
_RTMSG = struct.Struct("=BBBBBBBBI")
_RTNEXTHOP = struct.Struct("=HBBi")  # length, flags, hops, ifindex
_RTATTR = struct.Struct("=HH")
_U32 = struct.Struct("=I")
_HEADER = _NLMSGHDR.size
_FAMILIES = {socket.AF_INET: 4, socket.AF_INET6: 6}
# Everything a malformed message can make struct, inet_ntop or str.decode raise.
_MALFORMED = (struct.error, ValueError, OSError, IndexError)


@dataclass(frozen=True)
class LinkInfo:
    name: str
    index: int
    state: str  # admin state: up | down
    mtu: int
    carrier: bool
    kind: str = ""


@dataclass(frozen=True)
class AddrInfo:
    ifname: str
    prefix: str  # canonical "address/len"
    family: int  # 4 | 6


@dataclass(frozen=True)
class Nexthop:
    """One path of a multipath route (RTA_MULTIPATH)."""

    via: str | None
    dev: str | None
    weight: int = 1


@dataclass(frozen=True)
class RouteInfo:
    table: int
    to: str  # canonical network
    via: str | None  # single-path routes; a multipath route has `nexthops` instead
    dev: str | None
    metric: int
    family: int
    proto: int = RTPROT_STATIC
    nexthops: tuple[Nexthop, ...] = ()
    route_type: int = RTN_UNICAST  # unicast, local, broadcast, blackhole, … (rtm_type)

    @property
    def key(self) -> tuple[int, str, int]:
        return (self.table, self.to, self.metric)


Record = LinkInfo | AddrInfo | RouteInfo


def split(data: bytes) -> Iterator[tuple[int, int, int, int, bytes]]:
    """(type, flags, seq, pid, message) for each netlink message in a datagram.

    `message` is the whole message, header included — what the decoders take.
    Stops at the first message whose length does not fit what was received.
    """
    offset = 0
    end = len(data)
    while offset + _HEADER <= end:
        length, msg_type, flags, seq, pid = _NLMSGHDR.unpack_from(data, offset)
        if length < _HEADER or offset + length > end:
            return
        yield msg_type, flags, seq, pid, data[offset : offset + length]
        offset += (length + 3) & ~3


def _attrs(chunk: bytes, offset: int) -> dict[int, bytes]:
    """rtattr type → payload, from `offset` to the end of `chunk`."""
    out: dict[int, bytes] = {}
    end = len(chunk)
    while offset + 4 <= end:
        length, kind = _RTATTR.unpack_from(chunk, offset)
        if length < 4 or offset + length > end:
            raise ValueError("rtattr overruns its message")
        out[kind & 0x3FFF] = chunk[offset + 4 : offset + length]
        offset += (length + 3) & ~3
    return out


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode()


def decode_link(chunk: bytes) -> LinkInfo | None:
    """An RTM_NEWLINK/RTM_DELLINK message as a `LinkInfo`; None if malformed."""
    try:
        _family, _type, index, flags, _change = _IFINFOMSG.unpack_from(chunk, _HEADER)
        attrs = _attrs(chunk, _HEADER + _IFINFOMSG.size)
        if IFLA_IFNAME not in attrs:
            return None
        kind = ""
        if IFLA_LINKINFO in attrs:
            kind = _text(_attrs(attrs[IFLA_LINKINFO], 0).get(IFLA_INFO_KIND, b""))
        return LinkInfo(
            name=_text(attrs[IFLA_IFNAME]),
            index=index,
            state="up" if flags & IFF_UP else "down",
            mtu=_U32.unpack(attrs[IFLA_MTU])[0] if IFLA_MTU in attrs else 0,
            carrier=bool(flags & IFF_LOWER_UP),
            kind=kind,
        )
    except _MALFORMED:
        return None


# The hot path of a no-op plan: 1,000 of these take 3.3 ms, 22 ms with pyroute2 (see above).
def decode_address(chunk: bytes, names: Mapping[int, str]) -> AddrInfo | None:
    """An RTM_NEWADDR/RTM_DELADDR message as an `AddrInfo`; None if malformed.

    `names` maps interface index to name; an index it does not know is kept
    as its number.
    """
    try:
        family, prefixlen, _flags, _scope, index = _IFADDRMSG.unpack_from(chunk, _HEADER)
        version = _FAMILIES.get(family)
        if version is None:
            return None
        attrs = _attrs(chunk, _HEADER + _IFADDRMSG.size)
        raw = attrs.get(IFA_LOCAL) or attrs.get(IFA_ADDRESS)
        if raw is None:
            return None
        address = socket.inet_ntop(family, raw)
        return AddrInfo(names.get(index) or str(index), f"{address}/{prefixlen}", version)
    except _MALFORMED:
        return None


def _gateway(attrs: dict[int, bytes], family: int) -> str | None:
    if RTA_GATEWAY in attrs:
        return socket.inet_ntop(family, attrs[RTA_GATEWAY])
    if RTA_VIA in attrs:  # a gateway of the other family (IPv4 via IPv6)
        via = attrs[RTA_VIA]
        return socket.inet_ntop(struct.unpack_from("=H", via)[0], via[2:])
    return None


def _nexthops(payload: bytes, family: int, names: Mapping[int, str]) -> tuple[Nexthop, ...]:
    out = []
    offset = 0
    while offset + _RTNEXTHOP.size <= len(payload):
        length, _flags, hops, ifindex = _RTNEXTHOP.unpack_from(payload, offset)
        if length < _RTNEXTHOP.size or offset + length > len(payload):
            raise ValueError("rtnexthop overruns RTA_MULTIPATH")
        attrs = _attrs(payload[offset : offset + length], _RTNEXTHOP.size)
        dev = names.get(ifindex) if ifindex else None
        out.append(Nexthop(via=_gateway(attrs, family), dev=dev, weight=hops + 1))
        offset += (length + 3) & ~3
    return tuple(out)


def decode_route(chunk: bytes, names: Mapping[int, str]) -> RouteInfo | None:
    """An RTM_NEWROUTE/RTM_DELROUTE message as a `RouteInfo`; None if malformed.

    The table is RTA_TABLE when present (tables above 255 exist only there).
    A multipath route has `via`/`dev` None and its paths in `nexthops`.
    `names` maps interface index to name; an unknown index gives `dev` None.
    """
    try:
        family, dst_len, _src, _tos, table, proto, _scope, rtype, _flags = _RTMSG.unpack_from(
            chunk, _HEADER
        )
        version = _FAMILIES.get(family)
        if version is None:
            return None
        attrs = _attrs(chunk, _HEADER + _RTMSG.size)
        if RTA_TABLE in attrs:
            table = _U32.unpack(attrs[RTA_TABLE])[0]
        if RTA_DST in attrs:
            dst = socket.inet_ntop(family, attrs[RTA_DST])
        else:
            dst = "::" if version == 6 else "0.0.0.0"
        oif = _U32.unpack(attrs[RTA_OIF])[0] if RTA_OIF in attrs else None
        nexthops: tuple[Nexthop, ...] = ()
        if RTA_MULTIPATH in attrs:
            nexthops = _nexthops(attrs[RTA_MULTIPATH], family, names)
        return RouteInfo(
            table=table,
            to=f"{dst}/{dst_len}",
            via=_gateway(attrs, family),
            dev=names.get(oif) if oif is not None else None,
            metric=_U32.unpack(attrs[RTA_PRIORITY])[0] if RTA_PRIORITY in attrs else 0,
            family=version,
            proto=proto,
            nexthops=nexthops,
            route_type=rtype,
        )
    except _MALFORMED:
        return None


def peek_route(chunk: bytes) -> tuple[int, int] | None:
    """(protocol, type) of a route message from its fixed header, without decoding the rest.

    For filters: a router's kernel routes (one local route per address) far
    outnumber its own, and skipping them before `decode_route` keeps route
    observation as cheap as it was before the codec decoded everything.
    """
    if len(chunk) < _HEADER + _RTMSG.size:
        return None
    return chunk[_HEADER + 5], chunk[_HEADER + 7]  # rtm_protocol, rtm_type


def decode(msg_type: int, chunk: bytes, names: Mapping[int, str]) -> Record | None:
    """Any link, address or route message as its record; None for other types or malformed."""
    if msg_type in (RTM_NEWLINK, RTM_DELLINK):
        return decode_link(chunk)
    if msg_type in (RTM_NEWADDR, RTM_DELADDR):
        return decode_address(chunk, names)
    if msg_type in (RTM_NEWROUTE, RTM_DELROUTE):
        return decode_route(chunk, names)
    return None


def detail(msg_type: int, chunk: bytes) -> dict[str, Any]:
    """What a notification tells beyond its record, for the audit trail (JSON values).

    Links: the operational state; addresses: the scope, the flags
    (`address_flags`: permanent, tentative, dadfailed, …) and, when the kernel
    sends it, the address protocol; routes: the scope. Empty if malformed.
    """
    try:
        if msg_type in (RTM_NEWLINK, RTM_DELLINK):
            attrs = _attrs(chunk, _HEADER + _IFINFOMSG.size)
            operstate = None
            if IFLA_OPERSTATE in attrs:
                code = attrs[IFLA_OPERSTATE][0]
                operstate = OPERSTATES[code] if code < len(OPERSTATES) else str(code)
            return {"operstate": operstate}
        if msg_type in (RTM_NEWADDR, RTM_DELADDR):
            _family, _len, flags, scope, _index = _IFADDRMSG.unpack_from(chunk, _HEADER)
            out: dict[str, Any] = {"scope": scope}
            attrs = _attrs(chunk, _HEADER + _IFADDRMSG.size)
            if IFA_PROTO in attrs:
                out["address_protocol"] = attrs[IFA_PROTO][0]
            if len(attrs.get(IFA_FLAGS, b"")) >= 4:
                flags = int.from_bytes(attrs[IFA_FLAGS][:4], sys.byteorder)
            out["address_flags"] = [name for bit, name in ADDRESS_FLAGS.items() if flags & bit]
            return out
        if msg_type in (RTM_NEWROUTE, RTM_DELROUTE):
            return {"scope": _RTMSG.unpack_from(chunk, _HEADER)[6]}
    except _MALFORMED:
        pass
    return {}
