"""Kernel change notifications: the rtnetlink multicast groups for links, addresses and routes.

Who calls this: the reconcile loop (`trueup.reconcile.loop`). An event only
*wakes* the loop — every pass re-reads the kernel — but it also carries what
the kernel told, for drift attribution: the message type (`RTM_DELADDR`, …),
the route protocol, the netlink port of the writer (`sender_port`; 0 means
the kernel itself, otherwise it is usually the writer's PID) and when it
arrived.

`KernelEventSource` reads a raw `NETLINK_ROUTE` socket on its own thread (no
pyroute2 `IPRoute`, whose sockets must stay on their creating thread) and
decodes every message with `trueup.system.rtnl`, the codec that also decodes
`KernelNetlink`'s dumps: an event carries the same `LinkInfo`/`AddrInfo`/
`RouteInfo` (`record`) a dump would show for that object. Nothing is
filtered here — an RTM_DELROUTE of a connected route matters to attribution.
A receive-buffer overflow (ENOBUFS) is reported as an `overflow` event:
events were lost, and the loop answers with a full pass, as it does for
every event; a message of ours that does not decode is reported the same way
(`unparsed`). `FakeEventSource` is the seam's stand-in for unit tests.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from trueup.system import ownwrites, rtnl
from trueup.system.rtnl import PROTO_NAMES, AddrInfo, LinkInfo, Record, RouteInfo

__all__ = [
    "EventCallback",
    "EventSource",
    "FakeEventSource",
    "KernelEventSource",
    "NetlinkEvent",
    "event_from_message",
    "events_from_datagram",
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
    own: bool = False  # sent from one of this agent's own netlink sockets: trueup's change
    # Which own write sent it: "trueup heal TXN", "trueup apply TXN", … (`trueup.system.ownwrites`).
    writer: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    record: Record | None = None  # the object as the codec decoded it (not in to_json)

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
            if self.own:
                out["sender"] = self.writer or ownwrites.OUTSIDE
                out["own"] = True
        out.update(self.detail)
        return out


EventCallback = Callable[[NetlinkEvent], None]


class EventSource(Protocol):
    name: str

    def start(self, callback: EventCallback) -> None: ...
    def stop(self) -> None: ...


class InterfaceNames(Mapping[int, str]):
    """Interface names for notifications, which carry only an index.

    The kernel's current name; for a link already gone, the last name seen
    (a deleted link's addresses and routes are announced before its own
    RTM_DELLINK, and read after it); else the index as text. Every index has
    an answer, so lookups never miss.
    """

    def __init__(self) -> None:
        self._seen: dict[int, str] = {}
        with contextlib.suppress(OSError):
            self._seen.update(socket.if_nameindex())

    def learn(self, link: LinkInfo) -> None:
        self._seen[link.index] = link.name

    def __getitem__(self, index: int) -> str:
        try:
            return socket.if_indextoname(index)
        except OSError:
            return self._seen.get(index) or str(index)

    def __iter__(self) -> Iterator[int]:
        return iter(self._seen)

    def __len__(self) -> int:
        return len(self._seen)


def _sender(port: int) -> str | None:
    if port <= 0:
        return "kernel" if port == 0 else None
    try:
        return Path(f"/proc/{port}/comm").read_text().strip() or None
    except OSError:
        return None  # the writer already exited (or the port is not a PID)


def event_from_message(
    msg_type: int,
    message: bytes,
    port: int,
    received_at: float,
    names: Mapping[int, str],
    sender_of: Callable[[int], str | None] = _sender,
) -> NetlinkEvent | None:
    """A `NetlinkEvent` from one rtnetlink message (header included), or None if not ours.

    `port` is the message's nlmsg_pid; a link, address or route message that
    does not decode becomes an `unparsed` overflow event (look again).
    """
    name = rtnl.MESSAGE_NAMES.get(msg_type)
    if name is None:
        return None
    record = rtnl.decode(msg_type, message, names)
    if record is None:
        log.warning("%s notification that does not decode (%d bytes)", name, len(message))
        return NetlinkEvent("overflow", "unparsed", received_at, detail={"rtm": name})
    common: dict[str, Any] = {
        "kind": _KINDS[name],
        "message": name,
        "received_at": received_at,
        "sender_port": port,
        "sender": sender_of(port),
        "own": rtnl.is_own_port(port),
        "record": record,
    }
    if common["own"]:
        common["writer"] = ownwrites.writer_at(received_at)
    detail = rtnl.detail(msg_type, message)
    if isinstance(record, LinkInfo):
        return NetlinkEvent(
            ifname=record.name,
            detail={"admin_state": record.state, "mtu": record.mtu, **detail},
            **common,
        )
    if isinstance(record, AddrInfo):
        if port == 0 and rtnl.is_own_address_write(name, record.prefix):
            common["own"] = True  # an IPv6 address this process just wrote
            common["writer"] = ownwrites.writer_at(received_at)
        return NetlinkEvent(ifname=record.ifname, address=record.prefix, detail=detail, **common)
    assert isinstance(record, RouteInfo)
    detail = {"route_type": record.route_type, **detail}
    if record.nexthops:
        detail["nexthops"] = [
            {"via": hop.via, "dev": hop.dev, "weight": hop.weight} for hop in record.nexthops
        ]
    return NetlinkEvent(
        ifname=record.dev,
        destination=record.to,
        table=record.table,
        gateway=record.via,
        protocol=PROTO_NAMES.get(record.proto, str(record.proto)),
        detail=detail,
        **common,
    )


def events_from_datagram(
    data: bytes,
    received_at: float,
    names: Mapping[int, str],
    sender_of: Callable[[int], str | None] = _sender,
) -> list[NetlinkEvent]:
    """The events in one datagram read from the notification socket."""
    out = []
    for msg_type, _flags, _seq, port, message in rtnl.split(data):
        event = event_from_message(msg_type, message, port, received_at, names, sender_of)
        if event is not None:
            out.append(event)
    return out


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
        assert self._sock is not None
        names = InterfaceNames()
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
                events = events_from_datagram(data, now, names)
            except Exception:  # the codec never raises by contract; this thread must outlive a bug
                log.exception("netlink notification that does not decode")
                events = [NetlinkEvent("overflow", "unparsed", now)]
            for event in events:
                if isinstance(event.record, LinkInfo):
                    names.learn(event.record)
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
