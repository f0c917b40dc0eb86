"""The netlink seam: links, addresses and routes of the network namespace we run in.

`Netlink` is the protocol every subsystem talks to; `KernelNetlink` drives the
kernel through pyroute2, `FakeNetlink` (in `trueup.system.fake`) keeps the
same state in memory for unit tests.

pyroute2's `IPRoute` must stay on the thread that created it, so a
`KernelNetlink` is opened for one piece of work (an observation, a
transaction) and closed after it; opening one costs well under a millisecond.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

__all__ = [
    "PROTO_NAMES",
    "RTPROT_STATIC",
    "AddrInfo",
    "KernelNetlink",
    "LinkInfo",
    "Netlink",
    "NetlinkError",
    "RouteInfo",
]

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
    """Netlink against the kernel of the current network namespace."""

    def __init__(self) -> None:
        from pyroute2 import IPRoute

        self._ipr: Any = IPRoute()
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
        self._ipr.close()

    def _call(self, operation: str, kind: str, *args: Any, **kwargs: Any) -> Any:
        from pyroute2.netlink.exceptions import NetlinkError as PyrouteError

        try:
            return getattr(self._ipr, kind)(*args, **kwargs)
        except PyrouteError as exc:
            message = exc.args[1] if len(exc.args) > 1 else str(exc)
            raise NetlinkError(operation, message, exc.code) from None

    def links(self) -> list[LinkInfo]:
        out = []
        for msg in self._call("dump links", "link", "dump"):
            linkinfo = msg.get("IFLA_LINKINFO")
            kind = linkinfo.get("IFLA_INFO_KIND") if linkinfo else None
            info = LinkInfo(
                name=msg.get("IFLA_IFNAME"),
                index=msg["index"],
                state="up" if msg["flags"] & 1 else "down",
                mtu=msg.get("IFLA_MTU"),
                carrier=bool(msg["flags"] & 0x10000) or msg.get("IFLA_OPERSTATE") == "UP",
                kind=kind or "",
            )
            self._index[info.name] = info.index
            out.append(info)
        return out

    def _ifindex(self, name: str) -> int:
        if name not in self._index:
            self.links()
        if name not in self._index:
            raise NetlinkError(f"interface {name}", "no such interface")
        return self._index[name]

    def addresses(self) -> list[AddrInfo]:
        names = _ifindex_map(self.links())
        out = []
        for msg in self._call("dump addresses", "addr", "dump"):
            address = msg.get("IFA_ADDRESS")
            if address is None:
                continue
            prefix = f"{address}/{msg['prefixlen']}"
            family = 6 if msg["family"] == socket.AF_INET6 else 4
            if family == 6 and ipaddress.ip_address(address).is_link_local:
                continue  # the kernel's own, per link
            out.append(
                AddrInfo(
                    ifname=names.get(msg["index"], str(msg["index"])),
                    prefix=str(ipaddress.ip_interface(prefix)),
                    family=family,
                )
            )
        return out

    def routes(self, tables: set[int]) -> list[RouteInfo]:
        names = _ifindex_map(self.links())
        out = []
        for family in (socket.AF_INET, socket.AF_INET6):
            for msg in self._call("dump routes", "route", "dump", family=family):
                table = msg.get("RTA_TABLE") or msg["table"]
                if table not in tables or msg["type"] != _RTN_UNICAST:
                    continue
                if msg["proto"] in _IGNORED_PROTOCOLS:
                    continue
                dst = msg.get("RTA_DST")
                fam = 6 if family == socket.AF_INET6 else 4
                if dst is None:
                    dst = "::" if fam == 6 else "0.0.0.0"
                oif = msg.get("RTA_OIF")
                out.append(
                    RouteInfo(
                        table=table,
                        to=str(ipaddress.ip_network(f"{dst}/{msg['dst_len']}", strict=False)),
                        via=msg.get("RTA_GATEWAY"),
                        dev=names.get(oif) if oif is not None else None,
                        metric=msg.get("RTA_PRIORITY") or 0,
                        family=fam,
                        proto=msg["proto"],
                    )
                )
        return out

    def set_link(self, name: str, *, state: str | None = None, mtu: int | None = None) -> None:
        kwargs: dict[str, Any] = {}
        if state is not None:
            kwargs["state"] = state
        if mtu is not None:
            kwargs["mtu"] = mtu
        if kwargs:
            self._call(f"set link {name}", "link", "set", index=self._ifindex(name), **kwargs)

    def add_address(self, ifname: str, prefix: str) -> None:
        """Add an address; one already present counts as added."""
        iface = ipaddress.ip_interface(prefix)
        kwargs: dict[str, Any] = {}
        if iface.version == 4 and iface.network.prefixlen < 31:
            kwargs["broadcast"] = str(iface.network.broadcast_address)
        with _tolerate(errno.EEXIST):
            self._call(
                f"add address {prefix} on {ifname}",
                "addr",
                "add",
                index=self._ifindex(ifname),
                address=str(iface.ip),
                prefixlen=iface.network.prefixlen,
                **kwargs,
            )

    def del_address(self, ifname: str, prefix: str) -> None:
        """Remove an address; one already gone counts as removed."""
        iface = ipaddress.ip_interface(prefix)
        with _tolerate(errno.EADDRNOTAVAIL, errno.ENODEV):
            self._call(
                f"delete address {prefix} on {ifname}",
                "addr",
                "del",
                index=self._ifindex(ifname),
                address=str(iface.ip),
                prefixlen=iface.network.prefixlen,
            )

    def _route_args(self, route: RouteInfo) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "dst": route.to,
            "table": route.table,
            "priority": route.metric,
            "family": socket.AF_INET6 if route.family == 6 else socket.AF_INET,
        }
        if route.via is not None:
            kwargs["gateway"] = route.via
        if route.dev is not None:
            kwargs["oif"] = self._ifindex(route.dev)
        return kwargs

    def add_route(self, route: RouteInfo) -> None:
        """Install a route, replacing one with the same key."""
        self._call(
            f"add route to {route.to} (table {route.table})",
            "route",
            "replace",
            proto=RTPROT_STATIC,
            **self._route_args(route),
        )

    def del_route(self, route: RouteInfo) -> None:
        """Remove a route; one already gone (flushed with its address) counts as removed."""
        kwargs = self._route_args(route)
        kwargs.pop("gateway", None)
        kwargs.pop("oif", None)
        with _tolerate(errno.ESRCH):
            self._call(
                f"delete route to {route.to} (table {route.table})", "route", "del", **kwargs
            )
