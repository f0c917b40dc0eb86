"""The netlink seam: links, addresses, routes and rules of the network namespace we run in.

`Netlink` is the protocol every subsystem talks to; `KernelNetlink` drives the
kernel (requests encoded with pyroute2's message classes on a plain netlink
socket, replies decoded by `trueup.system.rtnl`), `CachedNetlink` shares one
dump among the subsystems of a pass, and `FakeNetlink` (in
`trueup.system.fake`) keeps the same state in memory for unit tests. A
`KernelNetlink` is opened for one piece of work (an observation, a
transaction) and closed after it.

The records (`LinkInfo`, `AddrInfo`, `RouteInfo`) are defined with their
codec in `trueup.system.rtnl` and exported from here. What observation leaves
out — IPv6 link-local addresses, the kernel's own routes, routes that are not
unicast — is decided here (`addresses_from_dump`, `routes_from_dump`), not in
the codec: the event path decodes every message.

Why this module is over 400 lines: one request encoder per kind of kernel
object plus the dump filters; the codec itself is `trueup.system.rtnl`.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import struct
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

from trueup.system import rtnl
from trueup.system.rtnl import (
    PROTO_NAMES,
    RTN_UNICAST,
    RTPROT_KERNEL,
    RTPROT_STATIC,
    AddrInfo,
    LinkInfo,
    Nexthop,
    RouteInfo,
)

__all__ = [
    "PROTO_NAMES",
    "RTPROT_STATIC",
    "AddrInfo",
    "CachedNetlink",
    "KernelNetlink",
    "LinkInfo",
    "Netlink",
    "NetlinkError",
    "Nexthop",
    "RouteInfo",
    "RuleInfo",
    "addresses_from_dump",
    "links_from_dump",
    "load_encoders",
    "routes_from_dump",
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
RTM_NEWRULE, RTM_DELRULE, RTM_GETRULE = 32, 33, 34
FR_ACT_TO_TBL = 1
IFF_UP = 0x1
RT_SCOPE_UNIVERSE, RT_SCOPE_LINK, RT_SCOPE_NOWHERE = 0, 253, 255

# Connected, redirect and RA routes belong to the kernel: never observed.
_IGNORED_PROTOCOLS = {1, RTPROT_KERNEL, 9}


@dataclass(frozen=True)
class RuleInfo:
    """A policy-routing rule of the one shape trueup writes: traffic of sockets bound to
    `oif` (SO_BINDTODEVICE) looks up `table`, at `priority`."""

    family: int
    priority: int
    oif: str
    table: int


def rules_from_dump(messages: Iterable[bytes]) -> list[RuleInfo]:
    """The `oif … lookup TABLE` rules of an RTM_GETRULE dump reply (other rules are left out)."""
    from pyroute2.netlink.rtnl.fibmsg import fibmsg

    out = []
    for chunk in messages:
        msg = fibmsg(chunk)
        msg.decode()
        attrs = dict(msg["attrs"])
        if msg["action"] != FR_ACT_TO_TBL or "FRA_OIFNAME" not in attrs or "FRA_IIFNAME" in attrs:
            continue
        if any(k in attrs for k in ("FRA_FWMARK", "FRA_SRC", "FRA_DST")):
            continue
        family = 6 if msg["family"] == socket.AF_INET6 else 4
        table = attrs.get("FRA_TABLE", msg["table"])
        out.append(RuleInfo(family, attrs.get("FRA_PRIORITY", 0), attrs["FRA_OIFNAME"], table))
    return out


class NetlinkError(RuntimeError):
    """A netlink request the kernel refused; `errno` is the kernel's."""

    def __init__(self, operation: str, message: str, errno: int | None = None) -> None:
        self.operation = operation
        self.errno = errno
        super().__init__(f"{operation}: {message}")


class Netlink(Protocol):
    def links(self) -> list[LinkInfo]: ...
    def addresses(self) -> list[AddrInfo]: ...
    def routes(self, tables: set[int]) -> list[RouteInfo]: ...
    def set_link(self, name: str, *, state: str | None = None, mtu: int | None = None) -> None: ...
    def add_address(self, ifname: str, prefix: str) -> None: ...
    def del_address(self, ifname: str, prefix: str) -> None: ...
    def add_route(self, route: RouteInfo) -> None: ...
    def del_route(self, route: RouteInfo) -> None: ...
    def rules(self) -> list[RuleInfo]: ...
    def add_rule(self, rule: RuleInfo) -> None: ...
    def del_rule(self, rule: RuleInfo) -> None: ...
    def close(self) -> None: ...


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


# -- the dump path: decode with the codec, then keep what observation wants ----------
def links_from_dump(messages: Iterable[bytes]) -> list[LinkInfo]:
    """The links of an RTM_GETLINK dump reply (one message per link)."""
    return [link for link in map(rtnl.decode_link, messages) if link is not None]


def addresses_from_dump(messages: Iterable[bytes], names: Mapping[int, str]) -> list[AddrInfo]:
    """The addresses of an RTM_GETADDR dump reply; IPv6 link-local ones (the kernel's) left out."""
    out = []
    for chunk in messages:
        address = rtnl.decode_address(chunk, names)
        if address is not None and not (address.family == 6 and _is_link_local_v6(address.prefix)):
            out.append(address)
    return out


def routes_from_dump(
    messages: Iterable[bytes], names: Mapping[int, str], tables: set[int]
) -> list[RouteInfo]:
    """The unicast routes in `tables` of an RTM_GETROUTE dump reply, without the kernel's own."""
    out = []
    for chunk in messages:
        header = rtnl.peek_route(chunk)
        if header is None or header[0] in _IGNORED_PROTOCOLS or header[1] != RTN_UNICAST:
            continue  # most of a dump: local and connected routes, one or more per address
        route = rtnl.decode_route(chunk, names)
        if route is not None and route.table in tables:
            out.append(route)
    return out


def load_encoders() -> None:
    """Import pyroute2's message classes now (a few hundred milliseconds on first use).

    For a caller with time to spare before its first change, such as `trueup
    management set` while it waits for the writer lock.
    """
    from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg
    from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg
    from pyroute2.netlink.rtnl.rtmsg import rtmsg

    del ifaddrmsg, ifinfmsg, rtmsg


class KernelNetlink:
    """Netlink against the kernel of the current network namespace.

    Requests are encoded with pyroute2's rtnetlink classes and sent on a
    plain NETLINK_ROUTE socket, one request and its acknowledgement at a
    time; replies are decoded by `trueup.system.rtnl`. That keeps the
    per-request cost near the kernel's own (the figures are in
    docs/benchmarks.md) and lets any thread use the handle.
    """

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
        self._sock.bind((0, 0))
        rtnl.note_own_port(self._sock)
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
            for msg_type, _flags, msg_seq, _pid, chunk in rtnl.split(self._sock.recv(1 << 20)):
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
    def links(self) -> list[LinkInfo]:
        from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

        out = links_from_dump(self._dump("dump links", ifinfmsg(), RTM_GETLINK))
        self._index.update((link.name, link.index) for link in out)
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
        return addresses_from_dump(self._dump("dump addresses", ifaddrmsg(), RTM_GETADDR), names)

    def routes(self, tables: set[int]) -> list[RouteInfo]:
        from pyroute2.netlink.rtnl.rtmsg import rtmsg

        names = _ifindex_map(self.links())
        out = []
        for family in (socket.AF_INET, socket.AF_INET6):
            request = rtmsg()
            request["family"] = family
            out += routes_from_dump(self._dump("dump routes", request, RTM_GETROUTE), names, tables)
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
        rtnl.note_own_address_write("RTM_NEWADDR", prefix)
        with _tolerate(errno.EEXIST):
            self._request(
                f"add address {prefix} on {ifname}",
                self._addr_msg(ifname, prefix),
                RTM_NEWADDR,
                NLM_F_CREATE | NLM_F_EXCL,
            )

    def del_address(self, ifname: str, prefix: str) -> None:
        """Remove an address; one already gone counts as removed."""
        rtnl.note_own_address_write("RTM_DELADDR", prefix)
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
        msg["type"] = RTN_UNICAST
        if for_delete:
            msg["scope"] = RT_SCOPE_NOWHERE
        else:
            msg["proto"] = route.proto
            gatewayed = route.via is not None or bool(route.nexthops)
            msg["scope"] = RT_SCOPE_UNIVERSE if gatewayed else RT_SCOPE_LINK
        attrs: list[Any] = [("RTA_TABLE", route.table), ("RTA_PRIORITY", route.metric)]
        if network.prefixlen:
            attrs.append(("RTA_DST", str(network.network_address)))
        if not for_delete:
            if route.via is not None:
                attrs.append(("RTA_GATEWAY", route.via))
            if route.dev is not None:
                attrs.append(("RTA_OIF", self._ifindex(route.dev)))
            if route.nexthops:
                attrs.append(("RTA_MULTIPATH", [self._nexthop(hop) for hop in route.nexthops]))
        msg["attrs"] = attrs
        return msg

    def _nexthop(self, hop: Nexthop) -> dict[str, object]:
        """One path of a multipath route (`rtnexthop`: weight is hops + 1)."""
        attrs: list[Any] = [("RTA_GATEWAY", hop.via)] if hop.via is not None else []
        index = self._ifindex(hop.dev) if hop.dev is not None else 0
        return {"oif": index, "hops": hop.weight - 1, "attrs": attrs}

    def add_route(self, route: RouteInfo) -> None:
        """Install a route (its protocol, one path or `nexthops`), replacing one with the same key."""
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

    def _rule_msg(self, rule: RuleInfo) -> Any:
        from pyroute2.netlink.rtnl.fibmsg import fibmsg

        msg = fibmsg()
        msg["family"] = socket.AF_INET6 if rule.family == 6 else socket.AF_INET
        msg["action"] = FR_ACT_TO_TBL
        msg["table"] = rule.table if rule.table < 256 else 0
        msg["attrs"] = [
            ("FRA_PRIORITY", rule.priority),
            ("FRA_OIFNAME", rule.oif),
            ("FRA_TABLE", rule.table),
        ]
        return msg

    def rules(self) -> list[RuleInfo]:
        from pyroute2.netlink.rtnl.fibmsg import fibmsg

        out = []
        for family in (socket.AF_INET, socket.AF_INET6):
            request = fibmsg()
            request["family"] = family
            out += rules_from_dump(self._dump("dump rules", request, RTM_GETRULE))
        return out

    def add_rule(self, rule: RuleInfo) -> None:
        """Add a rule; one already present counts as added."""
        with _tolerate(errno.EEXIST):
            self._request(
                f"add rule oif {rule.oif} lookup {rule.table}",
                self._rule_msg(rule),
                RTM_NEWRULE,
                NLM_F_CREATE | NLM_F_EXCL,
            )

    def del_rule(self, rule: RuleInfo) -> None:
        """Remove a rule; one already gone counts as removed."""
        with _tolerate(errno.ENOENT):
            self._request(
                f"delete rule oif {rule.oif} lookup {rule.table}",
                self._rule_msg(rule),
                RTM_DELRULE,
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

    def forget(self) -> None:
        """Drop the cache: something else (another handle, a worker, a daemon creating a
        TUN device) may have changed the kernel."""
        self._drop()

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

    def rules(self) -> list[RuleInfo]:
        return self.inner.rules()

    def add_rule(self, rule: RuleInfo) -> None:
        self._drop()
        self.inner.add_rule(rule)

    def del_rule(self, rule: RuleInfo) -> None:
        self._drop()
        self.inner.del_rule(rule)

    def close(self) -> None:
        self.inner.close()
