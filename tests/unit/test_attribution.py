"""Attribution: which kernel notifications explain a drift, fed through FakeEventSource."""

from __future__ import annotations

from typing import Any

import pytest

from trueup.reconcile.attribution import (
    DriftBook,
    DriftRecord,
    EventLog,
    attribute,
    event_kinds,
    identifiers,
    writers,
)
from trueup.subsystems.base import Difference, Scope
from trueup.subsystems.registry import default_subsystems
from trueup.system.events import FakeEventSource, NetlinkEvent

NOW = 1_800_000_000.0
LAN = "203.0.113.1/24"
ADDRESSES = "spec.interfaces[lan0].addresses"
ROUTE = "spec.routes[table=254,to=192.0.2.0/24,metric=0]"
SCOPE = Scope(interfaces=frozenset({"mgmt0", "lan0"}), management_interface="mgmt0")


def _diff(subsystem: str, path: str) -> Difference:
    return Difference(subsystem, path, desired=[LAN], observed=[])


def _event(kind: str, message: str, at: float = NOW, **fields: Any) -> NetlinkEvent:
    return NetlinkEvent(kind, message, at, **fields)


@pytest.fixture
def log() -> tuple[EventLog, FakeEventSource]:
    events = EventLog()
    source = FakeEventSource()
    source.start(events.append)
    return events, source


def _subsystem(name: str) -> Any:
    return next(s for s in default_subsystems() if s.name == name)


def test_event_kinds_are_what_the_subsystem_watches() -> None:
    from trueup.system.watches import every, files, rtnetlink

    class FileBacked:
        name = "motd"
        watches = (files("/etc/motd"), every(30))
        watch_kinds = frozenset[str]()

    class Polled:
        name = "sysctl"
        watches = (every(10.0),)
        watch_kinds = frozenset[str]()

    class Kernel:
        name = "routes"
        watches = (rtnetlink("route"),)
        watch_kinds = frozenset({"route"})

    assert event_kinds(FileBacked()) == {"file"}  # type: ignore[arg-type]
    assert event_kinds(Polled()) == set()  # type: ignore[arg-type]
    assert event_kinds(Kernel()) == {"route"}  # type: ignore[arg-type]
    # The shipped subsystems: links drift is explained by link notifications only.
    assert event_kinds(_subsystem("links")) == {"link"}
    assert event_kinds(_subsystem("routes")) == {"route", "link", "address"}


def test_identifiers_name_interfaces_destinations_and_management() -> None:
    found = identifiers([_diff("addresses", ADDRESSES), _diff("routes", ROUTE)], SCOPE)
    assert found == {"lan0", "192.0.2.0/24"}
    assert identifiers([_diff("management", "spec.management.addresses")], SCOPE) == {
        "mgmt0",
        "0.0.0.0/0",
        "::/0",
    }


def test_matching_notification_is_attached_and_others_are_not(
    log: tuple[EventLog, FakeEventSource],
) -> None:
    events, source = log
    source.emit(_event("route", "RTM_DELROUTE", destination="198.18.0.0/15", sender_port=0))
    source.emit(_event("link", "RTM_NEWLINK", ifname="lan9", sender_port=0))
    source.emit(
        _event("address", "RTM_DELADDR", ifname="lan0", address=LAN, sender_port=77, sender="ip")
    )
    record = DriftRecord(since=NOW, paths=[ADDRESSES], detected_by="event")
    attribute(
        record, [_diff("addresses", ADDRESSES)], SCOPE, {"address", "link"}, events.after(0), 10.0
    )
    assert [a["message"] for a in record.attribution] == ["RTM_DELADDR"]
    assert record.attribution[0]["sender"] == "ip"
    assert record.seen_events == 3
    # A later look considers only what arrived since.
    attribute(
        record, [_diff("addresses", ADDRESSES)], SCOPE, {"address", "link"}, events.after(0), 10.0
    )
    assert len(record.attribution) == 1


def test_unmatched_notifications_of_the_right_kind_are_related(
    log: tuple[EventLog, FakeEventSource],
) -> None:
    """The kernel flushes a route without its own notification when its address goes."""
    events, source = log
    source.emit(_event("address", "RTM_DELADDR", ifname="lan0", address=LAN, sender_port=77))
    source.emit(_event("link", "RTM_NEWLINK", ifname="lan0", at=NOW - 60))  # too old
    record = DriftRecord(since=NOW, paths=[ROUTE], detected_by="event")
    attribute(record, [_diff("routes", ROUTE)], SCOPE, {"route", "address"}, events.after(0), 10.0)
    assert [(a["message"], a["match"]) for a in record.attribution] == [("RTM_DELADDR", "related")]


def test_drift_without_notifications_says_which_look_found_it() -> None:
    record = DriftRecord(since=NOW, paths=[ADDRESSES], detected_by="resync")
    attribute(record, [_diff("addresses", ADDRESSES)], SCOPE, {"address"}, [], 10.0)
    assert record.attribution[0]["message"] is None
    assert "a full resync" in record.attribution[0]["detail"]


def test_attribution_keeps_the_last_twenty(log: tuple[EventLog, FakeEventSource]) -> None:
    events, source = log
    for i in range(30):
        source.emit(_event("address", "RTM_NEWADDR", ifname="lan0", address=LAN, at=NOW + i))
    record = DriftRecord(since=NOW, paths=[ADDRESSES], detected_by="event")
    attribute(record, [_diff("addresses", ADDRESSES)], SCOPE, {"address"}, events.after(0), 10.0)
    assert len(record.attribution) == 20
    assert record.attribution[-1]["received_at"].startswith("2027-01-15")


def test_writers_names_only_writers_other_than_the_kernel(
    log: tuple[EventLog, FakeEventSource],
) -> None:
    events, source = log
    source.emit(_event("address", "RTM_DELADDR", ifname="lan0", address=LAN, sender_port=0))
    diffs = [_diff("addresses", ADDRESSES)]
    assert writers(diffs, SCOPE, {"address"}, events.after(0)) == {}
    seq = events.last_seq
    source.emit(
        _event("address", "RTM_DELADDR", ifname="lan0", address=LAN, sender_port=99, sender="nm")
    )
    assert writers(diffs, SCOPE, {"address"}, events.after(seq)) == {
        ADDRESSES: "RTM_DELADDR from nm (port 99)"
    }
    # a real difference names the missing address: the writer is of that address alone
    item = Difference("addresses", ADDRESSES, [LAN, "203.0.113.9/24"], [], missing=[LAN])
    assert writers([item], SCOPE, {"address"}, events.after(seq)) == {
        f"{ADDRESSES}[{LAN}]": "RTM_DELADDR from nm (port 99)"
    }
    assert writers(diffs, SCOPE, {"route"}, events.after(seq)) == {}  # wrong kind


def test_drift_book_keeps_the_last_drift_when_it_ends() -> None:
    book = DriftBook()
    record = book.start("addresses", NOW, "event")
    assert book.start("addresses", NOW + 5, "resync") is record  # still the same drift
    book.end("addresses", NOW + 10)
    assert book.get("addresses") is None
    assert book.last["addresses"]["ended_at"].startswith("2027-01-15")
    book.start("routes", NOW, "event")
    book.forget(["routes"])
    assert book.current == {}
    assert "routes" not in book.last  # forgotten, not ended
