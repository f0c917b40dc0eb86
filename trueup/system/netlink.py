"""The netlink seam: links, addresses and routes of the network namespace we run in.

`Netlink` is the protocol every subsystem talks to; `KernelNetlink` drives the
kernel (rtnetlink messages encoded with pyroute2's codecs on a plain netlink
socket), `CachedNetlink` shares one dump among the subsystems of a pass, and
`FakeNetlink` (in `trueup.system.fake`) keeps the same state in memory for
unit tests. A `KernelNetlink` is opened for one piece of work (an
observation, a transaction) and closed after it.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

__all__ = [
    "PROTO_NAMES",
    "RTPROT_STATIC",
    "AddrInfo",
    "CachedNetlink",
    "KernelNetlink",
    "LinkInfo",
    "Netlink",
    "NetlinkError",
    "RouteInfo",
]

NETLINK_ROUTE = 0
NLMSG_ERROR = 2
NLMSG_DONE = 3
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
NLM_F_DUMP = 0x300
NLM_F_REPLACE = 0x100
NLM_F_EXCL = 0x200
NLM_F_CREATE = 0x400
RTM_NEWLINK, RTM_GETLINK = 16, 18
RTM_NEWADDR, RTM_DELADDR, RTM_GETADDR = 20, 21, 22
RTM_NEWROUTE, RTM_DELROUTE, RTM_GETROUTE = 24, 25, 26
IFLA_IFNAME, IFLA_MTU, IFLA_LINKINFO, IFLA_INFO_KIND = 3, 4, 18, 1
IFA_ADDRESS, IFA_LOCAL = 1, 2
RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_PRIORITY, RTA_TABLE = 1, 4, 5, 6, 15
IFF_UP = 0x1
IFF_LOWER_UP = 0x10000
RT_SCOPE_UNIVERSE, RT_SCOPE_LINK, RT_SCOPE_NOWHERE = 0, 253, 255

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
_IGNORED_PROTOCOLS = {1, RTPROT_KERNEL, 9}  # connected, redirect and RA routes belong to the kernel
_RTN_UNICAST = 1


class NetlinkError(RuntimeError):
    """A netlink request the kernel refused; `errno` is the kernel's."""

    def __init__(self, operation: str, message: str, errno: int | None = None) -> None:
        self.operation = operation
        self.errno = errno
        super().__init__(f"{operation}: {message}")


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
class RouteInfo:
    table: int
    to: str  # canonical network
    via: str | None
    dev: str | None
    metric: int
    family: int
    proto: int = RTPROT_STATIC

    @property
    def key(self) -> tuple[int, str, int]:
        return (self.table, self.to, self.metric)


class Netlink(Protocol):
    def links(self) -> list[LinkInfo]: ...
    def addresses(self) -> list[AddrInfo]: ...
    def routes(self, tables: set[int]) -> list[RouteInfo]: ...
    def set_link(self, name: str, *, state: str | None = None, mtu: int | None = None) -> None: ...
    def add_address(self, ifname: str, prefix: str) -> None: ...
    def del_address(self, ifname: str, prefix: str) -> None: ...
    def add_route(self, route: RouteInfo) -> None: ...
    def del_route(self, route: RouteInfo) -> None: ...
    def close(self) -> None: ...


def _attrs(chunk: bytes, offset: int) -> dict[int, bytes]:
    """rtattr type → payload, from `offset` to the end of the message."""
    out: dict[int, bytes] = {}
    end = len(chunk)
    while offset + 4 <= end:
        length, kind = struct.unpack_from("=HH", chunk, offset)
        if length < 4:
            break
        out[kind & 0x3FFF] = chunk[offset + 4 : offset + length]
        offset += (length + 3) & ~3
    return out


def _is_link_local_v6(text: str) -> bool:
    """fe80::/10, from inet_ntop text (first hextet fe80..febf), without parsing."""
    head = text.split(":", 1)[0].lower()
    return len(head) == 4 and head[:3] in ("fe8", "fe9", "fea", "feb")


@contextmanager
def _tolerate(*codes: int) -> Iterator[None]:
    """Treat the named kernel errors as success (the state is already as wanted)."""
    try:
        yield
    except NetlinkError as exc:
        if exc.errno not in codes:
            raise


def _ifindex_map(links: list[LinkInfo]) -> dict[int, str]:
    return {link.index: link.name for link in links}


class KernelNetlink:
    """Netlink against the kernel of the current network namespace.

    Messages are encoded and decoded with pyroute2's rtnetlink classes and
    sent on a plain NETLINK_ROUTE socket, one request and its acknowledgement
    at a time. That keeps the per-request cost near the kernel's own (the
    figures are in docs/benchmarks.md) and lets any thread use the handle.
    """

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
        self._sock.bind((0, 0))
        self._seq = 0
        self._index: dict[str, int] = {}

    def __enter__(self) -> KernelNetlink:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._sock.close()

    # -- transport ----------------------------------------------------------
    def _send(self, msg: Any, msg_type: int, flags: int) -> int:
        self._seq += 1
        msg["header"]["type"] = msg_type
        msg["header"]["flags"] = flags
        msg["header"]["sequence_number"] = self._seq
        msg.encode()
        self._sock.send(msg.data)
        return self._seq

    def _messages(self, seq: int) -> Iterator[tuple[int, bytes]]:
        """(type, message bytes) for the reply to `seq`, until DONE or an ack/error."""
        while True:
            data = self._sock.recv(1 << 20)
            offset = 0
            while offset + 16 <= len(data):
                length, msg_type, _flags, msg_seq, _pid = struct.unpack_from("=IHHII", data, offset)
                if length < 16:
                    return
                chunk = data[offset : offset + length]
                offset += (length + 3) & ~3
                if msg_seq != seq:
                    continue  # a late reply to an earlier request
                if msg_type == NLMSG_DONE:
                    return
                yield msg_type, chunk
                if msg_type == NLMSG_ERROR:
                    return

    def _request(self, operation: str, msg: Any, msg_type: int, flags: int) -> None:
        seq = self._send(msg, msg_type, NLM_F_REQUEST | NLM_F_ACK | flags)
        for reply_type, chunk in self._messages(seq):
            if reply_type == NLMSG_ERROR:
                code = -struct.unpack_from("=i", chunk, 16)[0]
                if code:
                    raise NetlinkError(operation, os.strerror(code), code)
                return

    def _dump(self, operation: str, msg: Any, msg_type: int) -> list[bytes]:
        seq = self._send(msg, msg_type, NLM_F_REQUEST | NLM_F_DUMP)
        out = []
        for reply_type, chunk in self._messages(seq):
            if reply_type == NLMSG_ERROR:
                code = -struct.unpack_from("=i", chunk, 16)[0]
                if code:
                    raise NetlinkError(operation, os.strerror(code), code)
                continue
            out.append(chunk)
        return out

    # -- observation --------------------------------------------------------
    # Dumps are decoded by hand: a thousand addresses must parse in a few
    # milliseconds for a no-op plan to stay cheap (docs/benchmarks.md).
    def links(self) -> list[LinkInfo]:
        from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

        out = []
        for chunk in self._dump("dump links", ifinfmsg(), RTM_GETLINK):
            _family, _type, index, flags, _change = struct.unpack_from("=BxHiII", chunk, 16)
            attrs = _attrs(chunk, 32)
            kind = ""
            if IFLA_LINKINFO in attrs:
                nested = attrs[IFLA_LINKINFO]
                kind_raw = _attrs(nested, 0).get(IFLA_INFO_KIND, b"")
                kind = kind_raw.rstrip(b"\0").decode()
            name = attrs.get(IFLA_IFNAME, b"").rstrip(b"\0").decode()
            mtu = struct.unpack("=I", attrs[IFLA_MTU])[0] if IFLA_MTU in attrs else 0
            info = LinkInfo(
                name=name,
                index=index,
                state="up" if flags & IFF_UP else "down",
                mtu=mtu,
                carrier=bool(flags & IFF_LOWER_UP),
                kind=kind,
            )
            self._index[info.name] = info.index
            out.append(info)
        return out

    def _ifindex(self, name: str) -> int:
        if name not in self._index:
            self.links()
        if name not in self._index:
            raise NetlinkError(f"interface {name}", "No such device", errno.ENODEV)
        return self._index[name]

    def addresses(self) -> list[AddrInfo]:
        from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg

        names = _ifindex_map(self.links())
        out = []
        for chunk in self._dump("dump addresses", ifaddrmsg(), RTM_GETADDR):
            family, prefixlen, _flags, _scope, index = struct.unpack_from("=BBBBI", chunk, 16)
            attrs = _attrs(chunk, 24)
            raw = attrs.get(IFA_LOCAL) or attrs.get(IFA_ADDRESS)
            if raw is None or family not in (socket.AF_INET, socket.AF_INET6):
                continue
            address = socket.inet_ntop(family, raw)
            version = 6 if family == socket.AF_INET6 else 4
            if version == 6 and _is_link_local_v6(address):
                continue  # the kernel's own, per link
            out.append(AddrInfo(names.get(index, str(index)), f"{address}/{prefixlen}", version))
        return out

    def routes(self, tables: set[int]) -> list[RouteInfo]:
        from pyroute2.netlink.rtnl.rtmsg import rtmsg

        names = _ifindex_map(self.links())
        out = []
        for family in (socket.AF_INET, socket.AF_INET6):
            request = rtmsg()
            request["family"] = family
            for chunk in self._dump("dump routes", request, RTM_GETROUTE):
                (_fam, dst_len, _src_len, _tos, table_u8, proto, _scope, rtype, _flags) = (
                    struct.unpack_from("=BBBBBBBBI", chunk, 16)
                )
                attrs = _attrs(chunk, 28)
                table = struct.unpack("=I", attrs[RTA_TABLE])[0] if RTA_TABLE in attrs else table_u8
                if table not in tables or rtype != _RTN_UNICAST or proto in _IGNORED_PROTOCOLS:
                    continue
                version = 6 if family == socket.AF_INET6 else 4
                dst = (
                    socket.inet_ntop(family, attrs[RTA_DST])
                    if RTA_DST in attrs
                    else ("::" if version == 6 else "0.0.0.0")
                )
                gateway = (
                    socket.inet_ntop(family, attrs[RTA_GATEWAY]) if RTA_GATEWAY in attrs else None
                )
                oif = struct.unpack("=I", attrs[RTA_OIF])[0] if RTA_OIF in attrs else None
                metric = struct.unpack("=I", attrs[RTA_PRIORITY])[0] if RTA_PRIORITY in attrs else 0
                out.append(
                    RouteInfo(
                        table=table,
                        to=f"{dst}/{dst_len}",
                        via=gateway,
                        dev=names.get(oif) if oif is not None else None,
                        metric=metric,
                        family=version,
                        proto=proto,
                    )
                )
        return out

    # -- changes ------------------------------------------------------------
    def set_link(self, name: str, *, state: str | None = None, mtu: int | None = None) -> None:
        from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

        if state is None and mtu is None:
            return
        msg = ifinfmsg()
        msg["index"] = self._ifindex(name)
        attrs: list[Any] = []
        if state is not None:
            msg["flags"] = IFF_UP if state == "up" else 0
            msg["change"] = IFF_UP
        if mtu is not None:
            attrs.append(("IFLA_MTU", mtu))
        msg["attrs"] = attrs
        self._request(f"set link {name}", msg, RTM_NEWLINK, 0)

    def _addr_msg(self, ifname: str, prefix: str) -> Any:
        from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg

        iface = ipaddress.ip_interface(prefix)
        msg = ifaddrmsg()
        msg["family"] = socket.AF_INET6 if iface.version == 6 else socket.AF_INET
        msg["prefixlen"] = iface.network.prefixlen
        msg["index"] = self._ifindex(ifname)
        attrs: list[Any] = [("IFA_LOCAL", str(iface.ip)), ("IFA_ADDRESS", str(iface.ip))]
        if iface.version == 4 and iface.network.prefixlen < 31:
            attrs.append(("IFA_BROADCAST", str(iface.network.broadcast_address)))
        msg["attrs"] = attrs
        return msg

    def add_address(self, ifname: str, prefix: str) -> None:
        """Add an address; one already present counts as added."""
        with _tolerate(errno.EEXIST):
            self._request(
                f"add address {prefix} on {ifname}",
                self._addr_msg(ifname, prefix),
                RTM_NEWADDR,
                NLM_F_CREATE | NLM_F_EXCL,
            )

    def del_address(self, ifname: str, prefix: str) -> None:
        """Remove an address; one already gone counts as removed."""
        with _tolerate(errno.EADDRNOTAVAIL, errno.ENODEV):
            self._request(
                f"delete address {prefix} on {ifname}",
                self._addr_msg(ifname, prefix),
                RTM_DELADDR,
                0,
            )

    def _route_msg(self, route: RouteInfo, *, for_delete: bool) -> Any:
        from pyroute2.netlink.rtnl.rtmsg import rtmsg

        network = ipaddress.ip_network(route.to)
        msg = rtmsg()
        msg["family"] = socket.AF_INET6 if route.family == 6 else socket.AF_INET
        msg["dst_len"] = network.prefixlen
        msg["table"] = route.table if route.table < 256 else 0
        msg["type"] = _RTN_UNICAST
        if for_delete:
            msg["scope"] = RT_SCOPE_NOWHERE
        else:
            msg["proto"] = RTPROT_STATIC
            msg["scope"] = RT_SCOPE_LINK if route.via is None else RT_SCOPE_UNIVERSE
        attrs: list[Any] = [("RTA_TABLE", route.table), ("RTA_PRIORITY", route.metric)]
        if network.prefixlen:
            attrs.append(("RTA_DST", str(network.network_address)))
        if not for_delete:
            if route.via is not None:
                attrs.append(("RTA_GATEWAY", route.via))
            if route.dev is not None:
                attrs.append(("RTA_OIF", self._ifindex(route.dev)))
        msg["attrs"] = attrs
        return msg

    def add_route(self, route: RouteInfo) -> None:
        """Install a route, replacing one with the same key."""
        self._request(
            f"add route to {route.to} (table {route.table})",
            self._route_msg(route, for_delete=False),
            RTM_NEWROUTE,
            NLM_F_CREATE | NLM_F_REPLACE,
        )

    def del_route(self, route: RouteInfo) -> None:
        """Remove a route; one already gone (flushed with its address) counts as removed."""
        with _tolerate(errno.ESRCH):
            self._request(
                f"delete route to {route.to} (table {route.table})",
                self._route_msg(route, for_delete=True),
                RTM_DELROUTE,
                0,
            )


class CachedNetlink:
    """Observation cache for one pass: each dump happens once until something changes.

    Several subsystems observe the same tables (links, addresses, routes);
    within a pass they share one dump. Any write drops the cache, so a
    re-observation after changes always sees the kernel's answer.
    """

    def __init__(self, inner: Netlink) -> None:
        self.inner = inner
        self._links: list[LinkInfo] | None = None
        self._addresses: list[AddrInfo] | None = None
        self._routes: dict[frozenset[int], list[RouteInfo]] = {}

    def _drop(self) -> None:
        self._links = self._addresses = None
        self._routes = {}

    def links(self) -> list[LinkInfo]:
        if self._links is None:
            self._links = self.inner.links()
        return self._links

    def addresses(self) -> list[AddrInfo]:
        if self._addresses is None:
            self._addresses = self.inner.addresses()
        return self._addresses

    def routes(self, tables: set[int]) -> list[RouteInfo]:
        key = frozenset(tables)
        if key not in self._routes:
            self._routes[key] = self.inner.routes(tables)
        return self._routes[key]

    def set_link(self, name: str, *, state: str | None = None, mtu: int | None = None) -> None:
        self._drop()
        self.inner.set_link(name, state=state, mtu=mtu)

    def add_address(self, ifname: str, prefix: str) -> None:
        self._drop()
        self.inner.add_address(ifname, prefix)

    def del_address(self, ifname: str, prefix: str) -> None:
        self._drop()
        self.inner.del_address(ifname, prefix)

    def add_route(self, route: RouteInfo) -> None:
        self._drop()
        self.inner.add_route(route)

    def del_route(self, route: RouteInfo) -> None:
        self._drop()
        self.inner.del_route(route)

    def close(self) -> None:
        self.inner.close()
