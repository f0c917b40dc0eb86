"""Kernel change notifications: the rtnetlink multicast groups for links, addresses and routes.

Who calls this: the reconcile loop (`trueup.reconcile.loop`). An event only
*wakes* the loop — every pass re-reads the kernel — but it also carries what
the kernel told, for drift attribution: the message type (`RTM_DELADDR`, …),
the route protocol, the netlink port of the writer (`sender_port`; 0 means
the kernel itself, otherwise it is usually the writer's PID) and when it
arrived.

`KernelEventSource` reads a raw `NETLINK_ROUTE` socket on its own thread (no
pyroute2 `IPRoute`, whose sockets must stay on their creating thread) and
parses messages with pyroute2's marshal. A receive-buffer overflow (ENOBUFS)
is reported as an `overflow` event: events were lost, and the loop answers
with a full pass, as it does for every event. `FakeEventSource` is the seam's
stand-in for unit tests.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from trueup.system.netlink import PROTO_NAMES

__all__ = [
    "EventCallback",
    "EventSource",
    "FakeEventSource",
    "KernelEventSource",
    "NetlinkEvent",
    "iso_time",
]

log = logging.getLogger("trueup.events")

# rtnetlink multicast groups (linux/rtnetlink.h)
_RTMGRP_LINK = 0x1
_RTMGRP_IPV4_IFADDR = 0x10
_RTMGRP_IPV4_ROUTE = 0x40
_RTMGRP_IPV6_IFADDR = 0x100
_RTMGRP_IPV6_ROUTE = 0x400
GROUPS = (
    _RTMGRP_LINK
    | _RTMGRP_IPV4_IFADDR
    | _RTMGRP_IPV4_ROUTE
    | _RTMGRP_IPV6_IFADDR
    | _RTMGRP_IPV6_ROUTE
)
_KINDS = {
    "RTM_NEWLINK": "link",
    "RTM_DELLINK": "link",
    "RTM_NEWADDR": "address",
    "RTM_DELADDR": "address",
    "RTM_NEWROUTE": "route",
    "RTM_DELROUTE": "route",
}


def iso_time(seconds: float) -> str:
    return (
        datetime.fromtimestamp(seconds, UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


@dataclass(frozen=True)
class NetlinkEvent:
    """One kernel notification, reduced to what attribution needs."""

    kind: str  # link | address | route | overflow
    message: str  # RTM_NEWADDR, RTM_DELROUTE, … (or "overflow")
    received_at: float  # wall-clock seconds
    ifname: str | None = None
    address: str | None = None  # address events: "address/len"
    destination: str | None = None  # route events: the network
    table: int | None = None
    gateway: str | None = None
    protocol: str | None = None  # route protocol (static, kernel, boot, dhcp, …)
    sender_port: int | None = None  # nlmsg_pid: 0 = the kernel, else usually the writer's PID
    sender: str | None = None  # the writer's command name, when it was still running
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "message": self.message,
            "kind": self.kind,
            "received_at": iso_time(self.received_at),
        }
        for key in ("ifname", "address", "destination", "table", "gateway", "protocol"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        if self.sender_port is not None:
            out["sender_port"] = self.sender_port
            out["sender"] = self.sender or ("kernel" if self.sender_port == 0 else "unknown")
        out.update(self.detail)
        return out


EventCallback = Callable[[NetlinkEvent], None]


class EventSource(Protocol):
    name: str

    def start(self, callback: EventCallback) -> None: ...
    def stop(self) -> None: ...


def _ifname(index: int | None, label: str | None = None) -> str | None:
    if label:
        return label
    if index is None:
        return None
    try:
        return socket.if_indextoname(index)
    except OSError:
        return str(index)  # the link is already gone


def _sender(port: int) -> str | None:
    if port <= 0:
        return "kernel" if port == 0 else None
    try:
        return Path(f"/proc/{port}/comm").read_text().strip() or None
    except OSError:
        return None  # the writer already exited (or the port is not a PID)


def event_from_message(msg: Any, received_at: float) -> NetlinkEvent | None:
    """A `NetlinkEvent` from one parsed pyroute2 rtnetlink message, or None if not ours."""
    message = msg.get("event")
    kind = _KINDS.get(str(message))
    if kind is None:
        return None
    port = int(msg["header"].get("pid") or 0)
    common: dict[str, Any] = {
        "kind": kind,
        "message": str(message),
        "received_at": received_at,
        "sender_port": port,
        "sender": _sender(port),
    }
    if kind == "link":
        flags = int(msg.get("flags") or 0)
        return NetlinkEvent(
            ifname=msg.get("IFLA_IFNAME") or _ifname(msg.get("index")),
            detail={
                "admin_state": "up" if flags & 1 else "down",
                "mtu": msg.get("IFLA_MTU"),
                "operstate": msg.get("IFLA_OPERSTATE"),
            },
            **common,
        )
    if kind == "address":
        address = msg.get("IFA_LOCAL") or msg.get("IFA_ADDRESS")
        prefix = None
        if address is not None:
            prefix = str(ipaddress.ip_interface(f"{address}/{msg['prefixlen']}"))
        detail: dict[str, Any] = {"scope": msg.get("scope")}
        proto = msg.get("IFA_PROTO")
        if proto is not None:
            detail["address_protocol"] = proto
        return NetlinkEvent(
            ifname=_ifname(msg.get("index"), msg.get("IFA_LABEL")),
            address=prefix,
            detail=detail,
            **common,
        )
    family = 6 if msg.get("family") == socket.AF_INET6 else 4
    dst = msg.get("RTA_DST") or ("::" if family == 6 else "0.0.0.0")
    proto_number = int(msg.get("proto") or 0)
    return NetlinkEvent(
        ifname=_ifname(msg.get("RTA_OIF")),
        destination=str(ipaddress.ip_network(f"{dst}/{msg.get('dst_len', 0)}", strict=False)),
        table=int(msg.get("RTA_TABLE") or msg.get("table") or 0),
        gateway=msg.get("RTA_GATEWAY"),
        protocol=PROTO_NAMES.get(proto_number, str(proto_number)),
        detail={"route_type": msg.get("type"), "scope": msg.get("scope")},
        **common,
    )


class KernelEventSource:
    """rtnetlink notifications of the current network namespace, on a thread of their own."""

    name = "netlink"

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._sock: socket.socket | None = None
        self._stop_r = -1
        self._stop_w = -1
        self._thread: threading.Thread | None = None

    def start(self, callback: EventCallback) -> None:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, 0)
        try:
            sock.setsockopt(socket.SOL_SOCKET, 33, 4 * 1024 * 1024)  # SO_RCVBUFFORCE
        except OSError:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
        sock.bind((0, GROUPS))
        self._sock = sock
        self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC)
        self._thread = threading.Thread(
            target=self._run, args=(callback,), name="trueup-netlink-events", daemon=True
        )
        self._thread.start()

    def _run(self, callback: EventCallback) -> None:
        from pyroute2.netlink.rtnl.marshal import MarshalRtnl

        assert self._sock is not None
        marshal = MarshalRtnl()
        while True:
            ready, _, _ = select.select([self._sock.fileno(), self._stop_r], [], [])
            if self._stop_r in ready:
                return
            try:
                data = self._sock.recv(1 << 20)
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:
                    callback(NetlinkEvent("overflow", "overflow", self.clock()))
                    continue
                log.error("netlink event socket failed: %s", exc)
                return
            now = self.clock()
            try:
                messages = marshal.parse(data)
            except Exception:  # a message pyroute2 cannot parse still means "look again"
                log.exception("unparseable netlink notification")
                callback(NetlinkEvent("overflow", "unparsed", now))
                continue
            for msg in messages:
                try:
                    event = event_from_message(msg, now)
                except Exception:
                    log.exception("netlink notification without the expected fields")
                    event = NetlinkEvent("overflow", "unparsed", now)
                if event is not None:
                    callback(event)

    def stop(self) -> None:
        if self._thread is None:
            return
        os.write(self._stop_w, b"x")
        self._thread.join(timeout=5)
        if self._sock is not None:
            self._sock.close()
        os.close(self._stop_r)
        os.close(self._stop_w)
        self._thread = None


class FakeEventSource:
    """Unit tests call `emit()`; the callback runs on the caller's thread."""

    name = "fake"

    def __init__(self) -> None:
        self.callback: EventCallback | None = None

    def start(self, callback: EventCallback) -> None:
        self.callback = callback

    def emit(self, event: NetlinkEvent) -> None:
        if self.callback is not None:
            self.callback(event)

    def stop(self) -> None:
        self.callback = None
