"""The fast path's raw rtnetlink: requests byte for byte, dumps decoded as the one codec does.

Requests are compared with what pyroute2 encodes for `KernelNetlink` (the
encoder of every other write); decoding is compared with `trueup.system.rtnl`
on messages captured from a real kernel (tests/fixtures/rtnl/).
"""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from trueup.system import rawnl, rtnl
from trueup.system.netlink import (
    NLM_F_ACK,
    NLM_F_CREATE,
    NLM_F_EXCL,
    NLM_F_REQUEST,
    KernelNetlink,
    RouteInfo,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "rtnl"
INDEX: dict[str, Any] = json.loads((FIXTURES / "index.json").read_text())
ADD = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL


@pytest.fixture
def kernel_netlink() -> Iterator[KernelNetlink]:
    """KernelNetlink's encoder (opening a netlink socket needs no privilege)."""
    netlink = KernelNetlink()
    netlink._index = {"mgmt0": 7}
    try:
        yield netlink
    finally:
        netlink.close()


def _encoded(msg: Any, msg_type: int, flags: int, seq: int = 5) -> bytes:
    """What `KernelNetlink._send` puts on the socket."""
    msg["header"]["type"] = msg_type
    msg["header"]["flags"] = flags
    msg["header"]["sequence_number"] = seq
    msg.encode()
    return bytes(msg.data)


@pytest.mark.parametrize(
    "prefix", ["198.51.100.2/24", "192.0.2.1/31", "192.0.2.1/32", "2001:db8::2/64"]
)
def test_add_address_is_what_pyroute2_encodes(kernel_netlink: KernelNetlink, prefix: str) -> None:
    expected = _encoded(kernel_netlink._addr_msg("mgmt0", prefix), rawnl.RTM_NEWADDR, ADD)
    assert rawnl.add_address_request(5, 7, prefix) == expected


@pytest.mark.parametrize(
    ("gateway", "metric", "family", "to"),
    [("198.51.100.1", 0, 4, "0.0.0.0/0"), ("2001:db8::1", 1024, 6, "::/0")],
)
def test_default_route_is_what_pyroute2_encodes(
    kernel_netlink: KernelNetlink, gateway: str, metric: int, family: int, to: str
) -> None:
    route = RouteInfo(254, to, gateway, "mgmt0", metric, family)
    msg = kernel_netlink._route_msg(route, for_delete=False)
    assert rawnl.add_default_route_request(5, 7, gateway, metric) == _encoded(
        msg, rawnl.RTM_NEWROUTE, ADD
    )


def test_link_up_is_what_pyroute2_encodes() -> None:
    from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

    msg = ifinfmsg()
    msg["index"], msg["flags"], msg["change"], msg["attrs"] = 7, 1, 1, []
    expected = _encoded(msg, rawnl.RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK)
    assert rawnl.link_up_request(5, 7) == expected


@pytest.mark.skipif(sys.byteorder != "little", reason="spelled out for a little-endian host")
def test_add_address_bytes() -> None:
    """The layout, spelled out: header, ifaddrmsg, IFA_LOCAL, IFA_ADDRESS, IFA_BROADCAST."""
    hexed = bytes.fromhex
    assert rawnl.add_address_request(9, 3, "198.51.100.2/24") == (
        hexed("30000000" "1400" "0506" "09000000" "00000000")  # len 48, RTM_NEWADDR, flags, seq, pid
        + hexed("02" "18" "00" "00" "03000000")  # AF_INET, /24, flags, scope, index 3
        + hexed("0800" "0200") + socket.inet_aton("198.51.100.2")  # IFA_LOCAL
        + hexed("0800" "0100") + socket.inet_aton("198.51.100.2")  # IFA_ADDRESS
        + hexed("0800" "0400") + socket.inet_aton("198.51.100.255")  # IFA_BROADCAST
    )  # fmt: skip


def test_requests_never_replace() -> None:
    """Create-exclusive: an existing address or default route is an EEXIST, never replaced."""
    for message in (
        rawnl.add_address_request(1, 2, "198.51.100.2/24"),
        rawnl.add_default_route_request(1, 2, "198.51.100.1", 0),
    ):
        flags = int.from_bytes(message[6:8], sys.byteorder)
        assert flags & NLM_F_EXCL and not flags & 0x100  # NLM_F_REPLACE


def _dump(name: str) -> list[bytes]:
    data = (FIXTURES / name).read_bytes()
    return [m for t, _seq, m in rawnl.split(data) if t not in (rawnl.NLMSG_DONE, rawnl.NLMSG_ERROR)]


_captured = pytest.mark.skipif(
    sys.byteorder != INDEX["byte_order"], reason="fixtures are in the capturing host's byte order"
)


@_captured
def test_address_dump_decodes_as_the_codec_does() -> None:
    messages = _dump("addresses.bin")
    assert messages
    links = {link.index: link.name for link in map(rtnl.decode_link, _dump("links.bin")) if link}
    for message in messages:
        expected = rtnl.decode_address(message, links)
        decoded = rawnl.message_addresses(message)
        assert expected is not None and decoded is not None
        assert (links.get(decoded[0], str(decoded[0])), decoded[1]) == (
            expected.ifname,
            expected.prefix,
        )


@_captured
def test_link_flags_agree_with_the_codec() -> None:
    for message in _dump("links.bin"):
        link = rtnl.decode_link(message)
        flags = rawnl.link_flags(message)
        assert link is not None and flags is not None
        assert ("up" if flags & rawnl.IFF_UP else "down") == link.state


def test_malformed_messages_decode_to_none() -> None:
    message = rawnl.add_address_request(1, 2, "198.51.100.2/24")  # an RTM_NEWADDR, as a dump has
    assert rawnl.message_addresses(message) == (2, "198.51.100.2/24")
    assert rawnl.message_addresses(message[:20]) is None
    assert rawnl.message_addresses(message[:16] + b"\x07" + message[17:]) is None  # family 7
    assert rawnl.link_flags(message[:20]) is None
    # split stops at a message whose length overruns the datagram
    assert [m for _t, _s, m in rawnl.split(message + message[:30])] == [message]


def test_link_local_addresses_are_left_out() -> None:
    assert rawnl._link_local_v6("fe80::1/64") and rawnl._link_local_v6("febf::1/64")
    assert not rawnl._link_local_v6("2001:db8::1/64")
    assert not rawnl._link_local_v6("198.51.100.2/24")
