"""In-memory stand-ins for the system seam, for unit tests.

`FakeNetlink` behaves like one network namespace: links must exist before
addresses go on them, duplicates are refused with EEXIST, a gateway must be
on-link (inside a prefix on an up link) as the kernel demands.
"""

from __future__ import annotations

import errno
import ipaddress

from trueup.system.netlink import AddrInfo, LinkInfo, NetlinkError, RouteInfo
from trueup.system.runner import Completed

__all__ = ["FakeAnnouncer", "FakeFiles", "FakeNetlink", "FakeRunner"]


class FakeRunner:
    """Answers commands from a table (`argv` tuple → Completed); records every call."""

    def __init__(self, answers: dict[tuple[str, ...], Completed] | None = None) -> None:
        self.answers = dict(answers or {})
        self.calls: list[tuple[str, ...]] = []

    def run(self, argv: list[str], *, input: str | None = None, timeout: float = 30.0) -> Completed:
        del input, timeout
        key = tuple(argv)
        self.calls.append(key)
        return self.answers.get(key, Completed(key, 127, "", f"{argv[0]}: not faked"))


class FakeAnnouncer:
    """Records announcements instead of sending them."""

    def __init__(self) -> None:
        self.announced: list[tuple[str, str]] = []

    def announce(self, ifname: str, prefix: str) -> None:
        self.announced.append((ifname, prefix))


class FakeFiles:
    """Files in memory (`path → text`); `fail_on` maps a path to the OSError a write raises."""

    def __init__(self, files: dict[str, str] | None = None) -> None:
        self.files: dict[str, str] = dict(files or {})
        self.fail_on: dict[str, OSError] = {}
        self.writes: list[tuple[str, str]] = []

    def read(self, path: str) -> str | None:
        return self.files.get(path)

    def write(self, path: str, text: str) -> None:
        if path in self.fail_on:
            raise self.fail_on[path]
        self.writes.append((path, text))
        self.files[path] = text

    def remove(self, path: str) -> None:
        if path in self.fail_on:
            raise self.fail_on[path]
        self.files.pop(path, None)


class FakeNetlink:
    def __init__(self, links: dict[str, int] | None = None) -> None:
        self.link_state: dict[str, LinkInfo] = {}
        self.addrs: list[AddrInfo] = []
        self.route_table: list[RouteInfo] = []
        self.calls: list[str] = []
        self.fail_on: dict[str, NetlinkError] = {}
        for index, (name, mtu) in enumerate((links or {}).items(), start=2):
            self.link_state[name] = LinkInfo(name, index, "down", mtu, carrier=False)

    def _check(self, operation: str) -> None:
        self.calls.append(operation)
        for needle, error in self.fail_on.items():
            if needle in operation:
                raise error

    def _link(self, name: str, operation: str) -> LinkInfo:
        if name not in self.link_state:
            raise NetlinkError(operation, "No such device", errno.ENODEV)
        return self.link_state[name]

    def links(self) -> list[LinkInfo]:
        return list(self.link_state.values())

    def addresses(self) -> list[AddrInfo]:
        return list(self.addrs)

    def routes(self, tables: set[int]) -> list[RouteInfo]:
        return [r for r in self.route_table if r.table in tables]

    def set_link(self, name: str, *, state: str | None = None, mtu: int | None = None) -> None:
        operation = f"set link {name}"
        self._check(operation)
        link = self._link(name, operation)
        self.link_state[name] = LinkInfo(
            name, link.index, state or link.state, mtu or link.mtu, link.carrier
        )

    def add_address(self, ifname: str, prefix: str) -> None:
        operation = f"add address {prefix} on {ifname}"
        self._check(operation)
        self._link(ifname, operation)
        info = AddrInfo(ifname, prefix, ipaddress.ip_interface(prefix).version)
        if info not in self.addrs:  # like KernelNetlink: present counts as added
            self.addrs.append(info)

    def del_address(self, ifname: str, prefix: str) -> None:
        operation = f"delete address {prefix} on {ifname}"
        self._check(operation)
        info = AddrInfo(ifname, prefix, ipaddress.ip_interface(prefix).version)
        if info in self.addrs:  # like KernelNetlink: absent counts as removed
            self.addrs.remove(info)
            # Like the kernel: routes whose gateway is no longer on-link are flushed.
            self.route_table = [r for r in self.route_table if self._onlink(r)]

    def _onlink(self, route: RouteInfo) -> bool:
        if route.via is None:
            return True
        gateway = ipaddress.ip_address(route.via)
        return any(
            gateway in ipaddress.ip_interface(a.prefix).network
            for a in self.addrs
            if route.dev is None or a.ifname == route.dev
        )

    def add_route(self, route: RouteInfo) -> None:
        operation = f"add route to {route.to} (table {route.table})"
        self._check(operation)
        dev = route.dev
        if route.via is not None:
            gateway = ipaddress.ip_address(route.via)
            onlink = [
                a
                for a in self.addrs
                if gateway in ipaddress.ip_interface(a.prefix).network
                and (dev is None or a.ifname == dev)
            ]
            if not onlink:
                raise NetlinkError(operation, "Network is unreachable", errno.ENETUNREACH)
            dev = onlink[0].ifname
        self.route_table = [r for r in self.route_table if r.key != route.key]
        self.route_table.append(
            RouteInfo(route.table, route.to, route.via, dev, route.metric, route.family)
        )

    def del_route(self, route: RouteInfo) -> None:
        operation = f"delete route to {route.to} (table {route.table})"
        self._check(operation)
        for existing in self.route_table:
            if existing.key == route.key:
                self.route_table.remove(existing)
                return

    def close(self) -> None:
        pass
