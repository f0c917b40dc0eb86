"""Raw rtnetlink for the fast path: a link up, addresses and a default route added, a dump.

Who calls this: `trueup.agent.fastboot`, which brings the management address
up before the agent imports anything heavy. It only ever adds: there is no
delete here, and an add that finds the object already there (EEXIST) is left
to the caller to count as done. Everything else — observation, changes that
remove, replace or reorder — belongs to `trueup.system.netlink`.

Why a second encoder: `trueup.system.netlink` builds its requests with
pyroute2's message classes, whose import alone costs more than the whole
fast path may take. Why a second (tiny) decoder: `trueup.system.rtnl`, the
codec of every other read, builds dataclasses and imports `dataclasses` and
`typing` for them (about 20 ms at start). The two cannot drift apart
unnoticed: tests/unit/test_rawnl.py checks these requests byte for byte
against what pyroute2 encodes for `KernelNetlink`, and the decoded dumps
against `trueup.system.rtnl` on the messages captured from a real kernel
(tests/fixtures/rtnl/).

Stdlib only (`socket`, `struct`, `os`).
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterator

from trueup.system.rtnl import note_own_address_write, note_own_port

__all__ = [
    "RawNetlink",
    "add_address_request",
    "add_default_route_request",
    "dump_addresses_request",
    "get_link_request",
    "link_flags",
    "link_up_request",
    "message_addresses",
    "split",
]

NETLINK_ROUTE = 0
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_ACK, NLM_F_EXCL, NLM_F_CREATE, NLM_F_DUMP = 0x1, 0x4, 0x200, 0x400, 0x300
RTM_NEWLINK, RTM_GETLINK = 16, 18
RTM_NEWADDR, RTM_GETADDR = 20, 22
RTM_NEWROUTE = 24
IFA_ADDRESS, IFA_LOCAL, IFA_BROADCAST = 1, 2, 4
RTA_GATEWAY, RTA_OIF, RTA_PRIORITY, RTA_TABLE = 5, 4, 6, 15
IFF_UP, IFF_RUNNING = 0x1, 0x40
RT_TABLE_MAIN, RTPROT_STATIC, RT_SCOPE_UNIVERSE, RTN_UNICAST = 254, 4, 0, 1

_NLMSGHDR = struct.Struct("=IHHII")  # length, type, flags, seq, pid
_IFINFOMSG = struct.Struct("=BxHiII")  # family, type, index, flags, change
_IFADDRMSG = struct.Struct("=BBBBI")  # family, prefixlen, flags, scope, index
_RTMSG = struct.Struct("=BBBBBBBBI")  # family, dst/src len, tos, table, proto, scope, type, flags
_RTATTR = struct.Struct("=HH")
_U32 = struct.Struct("=I")
_HEADER = _NLMSGHDR.size


def _attr(kind: int, data: bytes) -> bytes:
    length = _RTATTR.size + len(data)
    return _RTATTR.pack(length, kind) + data + b"\0" * (-length % 4)


def _message(msg_type: int, flags: int, seq: int, body: bytes) -> bytes:
    return _NLMSGHDR.pack(_HEADER + len(body), msg_type, flags, seq, 0) + body


def _family(address: str) -> tuple[int, bytes]:
    if ":" in address:
        return socket.AF_INET6, socket.inet_pton(socket.AF_INET6, address)
    return socket.AF_INET, socket.inet_pton(socket.AF_INET, address)


def get_link_request(seq: int, index: int) -> bytes:
    """RTM_GETLINK for one interface (answered by one RTM_NEWLINK)."""
    return _message(RTM_GETLINK, NLM_F_REQUEST, seq, _IFINFOMSG.pack(0, 0, index, 0, 0))


def link_up_request(seq: int, index: int) -> bytes:
    """RTM_NEWLINK setting IFF_UP and nothing else (what `ip link set IF up` sends)."""
    body = _IFINFOMSG.pack(0, 0, index, IFF_UP, IFF_UP)
    return _message(RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK, seq, body)


def add_address_request(seq: int, index: int, prefix: str) -> bytes:
    """RTM_NEWADDR (create, exclusive) for `prefix` ("198.51.100.2/24"), broadcast as `ip` sets it."""
    text, _, length = prefix.partition("/")
    family, packed = _family(text)
    prefixlen = int(length)
    body = _IFADDRMSG.pack(family, prefixlen, 0, RT_SCOPE_UNIVERSE, index)
    body += _attr(IFA_LOCAL, packed) + _attr(IFA_ADDRESS, packed)
    if family == socket.AF_INET and prefixlen < 31:
        host = int.from_bytes(packed, "big") | ((1 << (32 - prefixlen)) - 1)
        body += _attr(IFA_BROADCAST, host.to_bytes(4, "big"))
    flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
    return _message(RTM_NEWADDR, flags, seq, body)


def add_default_route_request(seq: int, index: int, gateway: str, metric: int) -> bytes:
    """RTM_NEWROUTE (create, exclusive: never replaces) for the default route via `gateway`."""
    family, packed = _family(gateway)
    body = _RTMSG.pack(
        family, 0, 0, 0, RT_TABLE_MAIN, RTPROT_STATIC, RT_SCOPE_UNIVERSE, RTN_UNICAST, 0
    )
    body += _attr(RTA_TABLE, _U32.pack(RT_TABLE_MAIN)) + _attr(RTA_PRIORITY, _U32.pack(metric))
    body += _attr(RTA_GATEWAY, packed) + _attr(RTA_OIF, _U32.pack(index))
    flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
    return _message(RTM_NEWROUTE, flags, seq, body)


def dump_addresses_request(seq: int) -> bytes:
    """RTM_GETADDR dump of every address of every family."""
    body = _IFADDRMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
    return _message(RTM_GETADDR, NLM_F_REQUEST | NLM_F_DUMP, seq, body)


def split(data: bytes) -> Iterator[tuple[int, int, bytes]]:
    """(type, seq, whole message) for each message of a datagram; stops at one that overruns."""
    offset = 0
    while offset + _HEADER <= len(data):
        length, msg_type, _flags, seq, _pid = _NLMSGHDR.unpack_from(data, offset)
        if length < _HEADER or offset + length > len(data):
            return
        yield msg_type, seq, data[offset : offset + length]
        offset += (length + 3) & ~3


def _attrs(message: bytes, offset: int) -> dict[int, bytes]:
    out: dict[int, bytes] = {}
    while offset + _RTATTR.size <= len(message):
        length, kind = _RTATTR.unpack_from(message, offset)
        if length < _RTATTR.size or offset + length > len(message):
            break
        out[kind & 0x3FFF] = message[offset + _RTATTR.size : offset + length]
        offset += (length + 3) & ~3
    return out


def link_flags(message: bytes) -> int | None:
    """The interface flags (IFF_*) of an RTM_NEWLINK message; None if it is too short."""
    if len(message) < _HEADER + _IFINFOMSG.size:
        return None
    return int(_IFINFOMSG.unpack_from(message, _HEADER)[3])


def message_addresses(message: bytes) -> tuple[int, str] | None:
    """(interface index, "address/len") of an RTM_NEWADDR message; None if malformed.

    IFA_LOCAL before IFA_ADDRESS (on a point-to-point link IFA_ADDRESS is the
    peer), as `trueup.system.rtnl.decode_address` does.
    """
    try:
        family, prefixlen, _flags, _scope, index = _IFADDRMSG.unpack_from(message, _HEADER)
        if family not in (socket.AF_INET, socket.AF_INET6):
            return None
        attrs = _attrs(message, _HEADER + _IFADDRMSG.size)
        raw = attrs.get(IFA_LOCAL) or attrs.get(IFA_ADDRESS)
        if raw is None:
            return None
        return index, f"{socket.inet_ntop(family, raw)}/{prefixlen}"
    except (struct.error, ValueError, OSError):
        return None


def _link_local_v6(prefix: str) -> bool:
    """fe80::/10 (the kernel's own, left out as `trueup.system.netlink` leaves them out)."""
    head = prefix.split(":", 1)[0].lower()
    return ":" in prefix and len(head) == 4 and head[:3] in ("fe8", "fe9", "fea", "feb")


class RawNetlink:
    """One NETLINK_ROUTE socket of the current namespace; one request at a time, any thread."""

    def __init__(self, timeout: float = 2.0) -> None:
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
        try:
            self._sock.settimeout(timeout)
            self._sock.bind((0, 0))
        except OSError:
            self._sock.close()
            raise
        note_own_port(self._sock)
        self._seq = 0

    def __enter__(self) -> RawNetlink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._sock.close()

    def _next(self) -> int:
        self._seq += 1
        return self._seq

    def _replies(self, request: bytes, seq: int) -> Iterator[tuple[int, bytes]]:
        """(type, message) of the answer to `request`, up to DONE or an error/ack; raises OSError."""
        self._sock.send(request)
        while True:
            for msg_type, msg_seq, message in split(self._sock.recv(1 << 16)):
                if msg_seq != seq:
                    continue
                if msg_type == NLMSG_DONE:
                    return
                if msg_type == NLMSG_ERROR:
                    code = (
                        -struct.unpack_from("=i", message, _HEADER)[0] if len(message) > 19 else 0
                    )
                    if code:
                        raise OSError(code, os.strerror(code))
                    return
                yield msg_type, message

    def _ack(self, request: bytes, seq: int) -> None:
        for _ in self._replies(request, seq):
            pass

    def link_flags(self, index: int) -> int | None:
        """IFF_* flags of interface `index`; None if the kernel answered with something else."""
        seq = self._next()
        for msg_type, message in self._replies(get_link_request(seq, index), seq):
            if msg_type == RTM_NEWLINK:
                return link_flags(message)
        return None

    def addresses(self, index: int) -> list[str]:
        """The addresses on interface `index` ("address/len"), IPv6 link-local ones left out."""
        seq = self._next()
        out = []
        for msg_type, message in self._replies(dump_addresses_request(seq), seq):
            if msg_type != RTM_NEWADDR:
                continue
            decoded = message_addresses(message)
            if decoded is not None and decoded[0] == index and not _link_local_v6(decoded[1]):
                out.append(decoded[1])
        return out

    def set_link_up(self, index: int) -> None:
        seq = self._next()
        self._ack(link_up_request(seq, index), seq)

    def add_address(self, index: int, prefix: str) -> None:
        """Raises OSError (EEXIST when it is already there)."""
        seq = self._next()
        note_own_address_write("RTM_NEWADDR", prefix)
        self._ack(add_address_request(seq, index, prefix), seq)

    def add_default_route(self, index: int, gateway: str, metric: int) -> None:
        """Raises OSError (EEXIST when a default route with this metric exists: never replaced)."""
        seq = self._next()
        self._ack(add_default_route_request(seq, index, gateway, metric), seq)
