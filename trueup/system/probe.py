"""Probes that leave through one uplink: ICMP echo and TCP connect, bound to the interface.

Who calls this: the gateway monitor (`trueup.agent.gateways`), once per
round and uplink. Every socket is bound to the uplink with SO_BINDTODEVICE,
so the kernel routes the probe only through that interface whatever the
default route says (the gateways subsystem keeps a route through each
uplink's gateway for it in `PROBE_TABLE`, reached by a rule that matches
only sockets bound to the uplink). ICMP uses a datagram ("ping")
socket where `net.ipv4.ping_group_range` allows it, else a raw socket
(CAP_NET_RAW), matched by identifier and sequence. A round sends to every
target at once and waits for the answers until its timeout.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import selectors
import socket
import struct
import time
from dataclasses import dataclass, field

__all__ = ["ProbeTarget", "probe_round"]

_ECHO_REQUEST = {4: 8, 6: 128}
_ECHO_REPLY = {4: 0, 6: 129}
SO_BINDTODEVICE = getattr(socket, "SO_BINDTODEVICE", 25)


@dataclass(frozen=True)
class ProbeTarget:
    address: str
    port: int | None = None  # None: ICMP echo; else TCP connect

    @property
    def family(self) -> int:
        return ipaddress.ip_address(self.address).version


@dataclass
class _Pending:
    target: ProbeTarget
    sock: socket.socket
    sent: float
    ident: int = 0
    seq: int = 0
    raw: bool = False
    answer: float | None = field(default=None)


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total: int = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return ~total & 0xFFFF


def _bound(sock: socket.socket, interface: str) -> socket.socket:
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_BINDTODEVICE, interface.encode() + b"\0")
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def _icmp_socket(family: int, interface: str) -> tuple[socket.socket, bool]:
    """(socket, raw): a ping socket where allowed, else a raw one."""
    af = socket.AF_INET6 if family == 6 else socket.AF_INET
    proto = socket.IPPROTO_ICMPV6 if family == 6 else socket.IPPROTO_ICMP
    try:
        return _bound(socket.socket(af, socket.SOCK_DGRAM, proto), interface), False
    except OSError as exc:
        if exc.errno not in (errno.EACCES, errno.EPERM, errno.EPROTONOSUPPORT):
            raise
    return _bound(socket.socket(af, socket.SOCK_RAW, proto), interface), True


def _send_echo(target: ProbeTarget, interface: str, seq: int) -> _Pending:
    sock, raw = _icmp_socket(target.family, interface)
    ident = int.from_bytes(os.urandom(2), "big")
    payload = b"trueup-gw" + os.urandom(7)
    header = struct.pack("!BBHHH", _ECHO_REQUEST[target.family], 0, 0, ident, seq)
    checksum = _checksum(header + payload) if target.family == 4 else 0
    packet = struct.pack("!BBHHH", _ECHO_REQUEST[target.family], 0, checksum, ident, seq) + payload
    sent = time.monotonic()
    try:
        sock.sendto(packet, (target.address, 0))
    except OSError:
        sock.close()
        raise
    return _Pending(target, sock, sent, ident, seq, raw)


def _echo_answered(pending: _Pending) -> bool:
    """Whether what the socket holds now is this probe's reply (reads every datagram)."""
    while True:
        try:
            data = pending.sock.recv(2048)
        except BlockingIOError:
            return False
        except OSError:
            return False
        if pending.raw and pending.target.family == 4 and data:
            data = data[(data[0] & 0x0F) * 4 :]  # a raw IPv4 socket returns the IP header
        if len(data) < 8:
            continue
        kind, _code, _sum, ident, seq = struct.unpack_from("!BBHHH", data)
        if kind != _ECHO_REPLY[pending.target.family] or seq != pending.seq:
            continue
        if pending.raw and ident != pending.ident:
            continue  # someone else's echo reply (a datagram socket's are the kernel's to match)
        return True


def _start_connect(target: ProbeTarget, interface: str) -> _Pending:
    af = socket.AF_INET6 if target.family == 6 else socket.AF_INET
    sock = _bound(socket.socket(af, socket.SOCK_STREAM), interface)
    sent = time.monotonic()
    code = sock.connect_ex((target.address, target.port or 0))
    if code not in (0, errno.EINPROGRESS):
        sock.close()
        raise OSError(code, os.strerror(code))
    return _Pending(target, sock, sent)


def probe_round(
    interface: str, targets: list[ProbeTarget], timeout: float, seq: int = 1
) -> tuple[float | None, ...]:
    """Each target's latency in ms through `interface`, None where no answer came in `timeout`."""
    pending: list[_Pending | None] = []
    selector = selectors.DefaultSelector()
    try:
        for target in targets:
            try:
                probe = (
                    _send_echo(target, interface, seq & 0xFFFF)
                    if target.port is None
                    else _start_connect(target, interface)
                )
            except OSError:
                pending.append(None)  # no route, link down, refused at once: no answer
                continue
            pending.append(probe)
            events = selectors.EVENT_READ if target.port is None else selectors.EVENT_WRITE
            selector.register(probe.sock, events, probe)
        deadline = time.monotonic() + timeout
        waiting = sum(1 for p in pending if p is not None)
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for key, _mask in selector.select(left):
                answered: _Pending = key.data
                now = time.monotonic()
                if answered.target.port is None:
                    done = _echo_answered(answered)
                    if done:
                        answered.answer = now
                else:
                    done = True
                    if answered.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                        answered.answer = now
                if done:
                    selector.unregister(answered.sock)
                    waiting -= 1
    finally:
        selector.close()
        for opened in pending:
            if opened is not None:
                opened.sock.close()
    return tuple(
        None if p is None or p.answer is None else round((p.answer - p.sent) * 1000.0, 3)
        for p in pending
    )
