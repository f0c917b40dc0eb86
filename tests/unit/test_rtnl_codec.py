"""The rtnetlink codec against messages captured from a real kernel (tests/fixtures/rtnl/).

The fixtures come from `python -m scripts.capture_rtnl_fixtures` (index.json
says what each file holds). The dump path is what `KernelNetlink` does with a
dump reply (`links_from_dump`, `addresses_from_dump`, `routes_from_dump`);
the event path is what `KernelEventSource` does with each datagram it reads
(`events_from_datagram`). Both must give the same record for the same object.
"""

from __future__ import annotations

import json
import random
import struct
import sys
from pathlib import Path
from typing import Any

import pytest

from trueup.system import rtnl
from trueup.system.events import NetlinkEvent, events_from_datagram
from trueup.system.netlink import (
    AddrInfo,
    LinkInfo,
    Nexthop,
    RouteInfo,
    addresses_from_dump,
    links_from_dump,
    routes_from_dump,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "rtnl"
INDEX: dict[str, Any] = json.loads((FIXTURES / "index.json").read_text())
DUMPS = ("links.bin", "addresses.bin", "routes4.bin", "routes6.bin")
EVENTS = ("events-setup.bin", "events-changes.bin")
MAIN, BOOT, KERNEL = 254, 3, 2  # `ip route add` installs routes with protocol boot
NLMSG_ERROR, NLMSG_DONE = 2, 3

pytestmark = pytest.mark.skipif(
    sys.byteorder != INDEX["byte_order"], reason="fixtures are in the capturing host's byte order"
)


def _dump(name: str) -> list[bytes]:
    """The messages of a dump reply, as KernelNetlink's transport hands them on."""
    data = (FIXTURES / name).read_bytes()
    return [c for t, _f, _s, _p, c in rtnl.split(data) if t not in (NLMSG_DONE, NLMSG_ERROR)]


def _datagrams(name: str) -> list[bytes]:
    data = (FIXTURES / name).read_bytes()
    out, offset = [], 0
    for size in INDEX["files"][name]["datagrams"]:
        out.append(data[offset : offset + size])
        offset += size
    return out


NAMES = {link.index: link.name for link in links_from_dump(_dump("links.bin"))}


def _events(name: str) -> list[NetlinkEvent]:
    """The event path, datagram by datagram; the sender lookup is left out (no /proc)."""
    return [
        event
        for datagram in _datagrams(name)
        for event in events_from_datagram(datagram, 0.0, NAMES, sender_of=lambda _port: None)
    ]


def _all_routes() -> list[RouteInfo]:
    """Every route of both route dumps, decoded but not filtered."""
    decoded = [rtnl.decode_route(c, NAMES) for c in _dump("routes4.bin") + _dump("routes6.bin")]
    return [route for route in decoded if route is not None]


def _is_link_local(address: AddrInfo) -> bool:
    return address.prefix.startswith("fe80:")


# -- the fixtures are what the index says -----------------------------------------
@pytest.mark.parametrize("name", DUMPS + EVENTS)
def test_fixture_matches_its_index(name: str) -> None:
    about = INDEX["files"][name]
    data = (FIXTURES / name).read_bytes()
    assert len(data) == about["bytes"] == sum(about["datagrams"])
    type_names = {**rtnl.MESSAGE_NAMES, NLMSG_DONE: "NLMSG_DONE", NLMSG_ERROR: "NLMSG_ERROR"}
    types = [type_names.get(t, str(t)) for t, *_ in rtnl.split(data)]
    assert {t: types.count(t) for t in types} == about["messages"]


# -- the dump path, with concrete values --------------------------------------------
def test_dump_links() -> None:
    links = links_from_dump(_dump("links.bin"))
    assert NAMES == {1: "lo", 2: "lan0p", 3: "lan0", 4: "wan0p", 5: "wan0"}
    by_name = {link.name: link for link in links}
    assert by_name["lan0"] == LinkInfo("lan0", 3, "up", 9000, True, "veth")
    assert by_name["wan0"] == LinkInfo("wan0", 5, "up", 1500, True, "veth")
    assert by_name["lo"] == LinkInfo("lo", 1, "up", 65536, True, "")


def test_dump_addresses_leave_out_ipv6_link_local() -> None:
    observed = addresses_from_dump(_dump("addresses.bin"), NAMES)
    assert set(observed) == {
        AddrInfo("lo", "127.0.0.1/8", 4),
        AddrInfo("lo", "::1/128", 6),
        AddrInfo("lan0", "203.0.113.1/24", 4),
        AddrInfo("lan0", "2001:db8:1::1/64", 6),
        AddrInfo("wan0", "198.51.100.2/24", 4),
        AddrInfo("wan0", "2001:db8:2::2/64", 6),
    }
    decoded = [rtnl.decode_address(c, NAMES) for c in _dump("addresses.bin")]
    link_local = [a for a in decoded if a is not None and _is_link_local(a)]
    assert sorted(a.ifname for a in link_local) == ["lan0", "lan0p", "wan0", "wan0p"]


MAIN_PATHS = (Nexthop("203.0.113.254", "lan0", 1), Nexthop("203.0.113.253", "lan0", 1))
WEIGHTED_PATHS = (Nexthop("203.0.113.254", "lan0", 1), Nexthop("198.51.100.1", "wan0", 3))
V6_PATHS = (Nexthop("2001:db8:1::fe", "lan0", 1), Nexthop("2001:db8:2::1", "wan0", 1))
OBSERVED_ROUTES = {
    RouteInfo(MAIN, "0.0.0.0/0", "198.51.100.1", "wan0", 0, 4, BOOT),
    RouteInfo(MAIN, "192.0.2.0/24", None, None, 0, 4, BOOT, nexthops=MAIN_PATHS),
    RouteInfo(100, "192.0.2.0/25", "203.0.113.254", "lan0", 0, 4, BOOT),
    RouteInfo(100, "192.0.2.64/26", None, None, 0, 4, BOOT, nexthops=WEIGHTED_PATHS),
    RouteInfo(1000, "192.0.2.128/25", "203.0.113.253", "lan0", 50, 4, BOOT),
    RouteInfo(MAIN, "2001:db8:100::/48", "2001:db8:1::fe", "lan0", 1024, 6, BOOT),
    RouteInfo(MAIN, "2001:db8:300::/48", None, None, 1024, 6, BOOT, nexthops=V6_PATHS),
    RouteInfo(1000, "2001:db8:200::/48", "2001:db8:2::1", "wan0", 10, 6, BOOT),
}


def test_dump_routes_numbered_tables_multipath_and_ipv6() -> None:
    messages = _dump("routes4.bin") + _dump("routes6.bin")
    assert set(routes_from_dump(messages, NAMES, {MAIN, 100, 1000})) == OBSERVED_ROUTES
    # Table 1000 exists only in RTA_TABLE (rtm_table says RT_TABLE_COMPAT, 252).
    assert {r.to for r in routes_from_dump(messages, NAMES, {1000})} == {
        "192.0.2.128/25",
        "2001:db8:200::/48",
    }


def test_dump_routes_leave_out_the_kernels_and_non_unicast() -> None:
    observed = set(
        routes_from_dump(_dump("routes4.bin") + _dump("routes6.bin"), NAMES, {MAIN, 100})
    )
    decoded = set(_all_routes())
    left_out = {r for r in decoded - observed if r.table in (MAIN, 100)}
    assert all(r.proto == KERNEL or r.route_type != rtnl.RTN_UNICAST for r in left_out)
    assert RouteInfo(100, "192.0.2.192/26", None, None, 0, 4, BOOT, route_type=6) in left_out
    assert RouteInfo(MAIN, "203.0.113.0/24", None, "lan0", 0, 4, KERNEL) in left_out
    assert RouteInfo(MAIN, "2001:db8:1::/64", None, "lan0", 256, 6, KERNEL) in left_out


def test_peek_route_reads_what_decode_route_reads() -> None:
    for chunk in _dump("routes4.bin") + _dump("routes6.bin"):
        route = rtnl.decode_route(chunk, NAMES)
        assert route is not None
        assert rtnl.peek_route(chunk) == (route.proto, route.route_type)


# -- the two paths agree ---------------------------------------------------------------
def test_dump_and_event_paths_decode_links_identically() -> None:
    last: dict[int, LinkInfo] = {}
    for event in _events("events-setup.bin"):
        if event.message == "RTM_NEWLINK" and isinstance(event.record, LinkInfo):
            last[event.record.index] = event.record
    assert list(last.values()) and sorted(last) == sorted(NAMES)
    for link in links_from_dump(_dump("links.bin")):
        assert last[link.index] == link


def test_dump_and_event_paths_decode_addresses_identically() -> None:
    announced = {e.record for e in _events("events-setup.bin") if e.message == "RTM_NEWADDR"}
    decoded = [rtnl.decode_address(c, NAMES) for c in _dump("addresses.bin")]
    dumped = [address for address in decoded if address is not None]
    # The kernel announces an IPv6 link-local address once DAD is done; in the capture
    # they were still tentative, so only the dump has them.
    assert [a for a in dumped if a not in announced] == [a for a in dumped if _is_link_local(a)]
    removed = {e.record for e in _events("events-changes.bin") if e.message == "RTM_DELADDR"}
    assert AddrInfo("lan0", "2001:db8:1::1/64", 6) in removed & set(dumped)


def test_dump_and_event_paths_decode_routes_identically() -> None:
    announced = {e.record for e in _events("events-setup.bin") if e.message == "RTM_NEWROUTE"}
    dumped = _all_routes()
    assert len(dumped) == 29
    # Every route of every table and type, the kernel's own included.
    assert [r for r in dumped if r not in announced] == []
    removed = {e.record for e in _events("events-changes.bin") if e.message == "RTM_DELROUTE"}
    assert removed & set(dumped) >= {
        RouteInfo(1000, "192.0.2.128/25", "203.0.113.253", "lan0", 50, 4, BOOT),
        RouteInfo(MAIN, "192.0.2.0/24", None, None, 0, 4, BOOT, nexthops=MAIN_PATHS),
        RouteInfo(1000, "2001:db8:200::/48", "2001:db8:2::1", "wan0", 10, 6, BOOT),
        RouteInfo(MAIN, "2001:db8:1::/64", None, "lan0", 256, 6, KERNEL),
    }


# -- what the event path tells attribution --------------------------------------------
def test_every_captured_notification_becomes_an_event() -> None:
    for name in EVENTS:
        events = _events(name)
        assert len(events) == sum(INDEX["files"][name]["messages"].values())
        assert all(e.kind in ("link", "address", "route") and e.record for e in events)
        json.dumps([e.to_json() for e in events])  # audit-ready


def test_events_carry_what_attribution_needs() -> None:
    events = _events("events-changes.bin")
    first = events[0].to_json()
    assert first["message"] == "RTM_DELROUTE" and first["kind"] == "route"
    assert (first["destination"], first["table"], first["gateway"]) == (
        "192.0.2.128/25",
        1000,
        "203.0.113.253",
    )
    assert (first["ifname"], first["protocol"]) == ("lan0", "boot")
    assert first["sender_port"] > 0  # the `ip` that asked
    multipath = events[1]
    assert multipath.destination == "192.0.2.0/24" and multipath.ifname is None
    assert multipath.detail["nexthops"] == [
        {"via": "203.0.113.254", "dev": "lan0", "weight": 1},
        {"via": "203.0.113.253", "dev": "lan0", "weight": 1},
    ]
    removal = next(e for e in events if e.message == "RTM_DELADDR")
    assert (removal.ifname, removal.address) == ("lan0", "203.0.113.9/24")
    assert removal.sender_port and removal.sender_port > 0
    connected = next(e for e in events if e.destination == "2001:db8:1::/64")
    assert connected.message == "RTM_DELROUTE" and connected.protocol == "kernel"
    assert connected.to_json()["sender"] == "kernel"  # port 0
    down = next(e for e in events if e.message == "RTM_NEWLINK" and e.ifname == "wan0")
    assert down.detail == {"admin_state": "down", "mtu": 1500, "operstate": "DOWN"}
    assert "record" not in down.to_json()


def test_pyroute2_parser_agrees_with_the_codec() -> None:
    """pyroute2's parser, which the event path used before, reads the same values."""
    from pyroute2.netlink.rtnl.marshal import MarshalRtnl

    marshal = MarshalRtnl()
    for name in DUMPS + EVENTS:
        for datagram in _datagrams(name):
            parsed = [m for m in marshal.parse(datagram) if m.get("event") in _KINDS]
            ours = [
                rtnl.decode(t, c, NAMES)
                for t, _f, _s, _p, c in rtnl.split(datagram)
                if t in rtnl.MESSAGE_NAMES
            ]
            assert len(parsed) == len(ours)
            for message, record in zip(parsed, ours, strict=True):
                assert _as_pyroute2_sees(record) == _pyroute2_values(message)


_KINDS = set(rtnl.MESSAGE_NAMES.values())


def _as_pyroute2_sees(record: rtnl.Record | None) -> tuple[Any, ...]:
    if isinstance(record, LinkInfo):
        return (record.name, record.mtu, record.state)
    if isinstance(record, AddrInfo):
        return (record.prefix,)
    assert isinstance(record, RouteInfo)
    hops = tuple((h.via, h.weight) for h in record.nexthops)
    return (record.to, record.table, record.via, record.metric, record.proto, hops)


def _pyroute2_values(message: Any) -> tuple[Any, ...]:
    kind = message["event"][len("RTM_NEW") :]  # LINK, ADDR or ROUTE
    if kind == "LINK":
        return (message.get("IFLA_IFNAME"), message.get("IFLA_MTU"), message.get("state"))
    if kind == "ADDR":
        address = message.get("IFA_LOCAL") or message.get("IFA_ADDRESS")
        return (f"{address}/{message['prefixlen']}",)
    family_default = "::" if message["family"] == 10 else "0.0.0.0"
    hops = tuple(
        (hop.get("RTA_GATEWAY"), hop["hops"] + 1) for hop in message.get("RTA_MULTIPATH") or ()
    )
    return (
        f"{message.get('RTA_DST') or family_default}/{message['dst_len']}",
        message.get("RTA_TABLE") or message["table"],
        message.get("RTA_GATEWAY"),
        message.get("RTA_PRIORITY") or 0,
        message["proto"],
        hops,
    )


# -- malformed input never raises ------------------------------------------------------
def _every_message() -> list[tuple[int, bytes]]:
    return [
        (t, c)
        for name in DUMPS + EVENTS
        for t, _f, _s, _p, c in rtnl.split((FIXTURES / name).read_bytes())
        if t in rtnl.MESSAGE_NAMES
    ]


def test_truncated_messages_decode_to_none_or_a_record() -> None:
    for msg_type, chunk in _every_message():
        for cut in range(0, len(chunk), 3):  # every residue mod 4: attributes are 4-aligned
            truncated = chunk[:cut]
            assert list(rtnl.split(truncated)) == []  # the header's length no longer fits
            record = rtnl.decode(msg_type, truncated, NAMES)
            assert record is None or isinstance(record, LinkInfo | AddrInfo | RouteInfo)
            rtnl.detail(msg_type, truncated)
            rtnl.peek_route(truncated)


def test_a_message_of_ours_that_does_not_decode_is_an_unparsed_event() -> None:
    msg_type, chunk = next((t, c) for t, c in _every_message() if t == 21)  # RTM_DELADDR
    short = struct.pack("=I", 20) + chunk[4:20]  # a consistent header, the ifaddrmsg cut short
    events = events_from_datagram(short, 1.0, NAMES, sender_of=lambda _port: None)
    assert [(e.kind, e.message, e.detail) for e in events] == [
        ("overflow", "unparsed", {"rtm": "RTM_DELADDR"})
    ]
    assert rtnl.decode(msg_type, short, NAMES) is None


def test_overlong_attributes_and_garbage_never_raise() -> None:
    rng = random.Random(9)
    for msg_type, chunk in _every_message():
        for offset in range(16, len(chunk) - 4, 4):  # an attribute length pointing past the end
            broken = chunk[:offset] + struct.pack("=H", 0xFFFF) + chunk[offset + 2 :]
            rtnl.decode(msg_type, broken, NAMES)
            rtnl.detail(msg_type, broken)
        noisy = bytearray(chunk)
        for _ in range(8):
            noisy[rng.randrange(16, len(noisy))] = rng.randrange(256)
        rtnl.decode(msg_type, bytes(noisy), NAMES)
    for _ in range(2000):
        garbage = rng.randbytes(rng.randrange(0, 200))
        for t, _f, _s, _p, c in rtnl.split(garbage):
            rtnl.decode(t, c, NAMES)
        events_from_datagram(garbage, 0.0, NAMES, sender_of=lambda _port: None)
