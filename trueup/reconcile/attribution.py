"""The kernel notifications that explain drift records (`trueup.reconcile.driftbook`).

Who calls this: the reconcile loop (`trueup.reconcile.loop`), once per
subsystem per pass. `DriftBook` and `DriftRecord` are re-exported from
`trueup.reconcile.driftbook`.

An event only wakes the loop; the pass re-reads everything. What an event
adds is *who*: each drift record carries the notifications whose object
(interface, address, route destination) the differing paths name, of the
kinds that can explain drift in that subsystem (`event_kinds`). The kernel
flushes routes and IPv6 addresses without a notification of their own when
their address or link goes, so when nothing matches, the notifications of
those kinds that did arrive are shown as `"match": "related"`; when none
arrived the record says which look found the drift (a resync, a request).

The same matching names the writer of a path for flap detection
(`writers`), item by item: a list path (an interface's addresses) is split
into one path per missing or extra item (`item_paths`), so one contested
address never stops the others on its interface from being healed. Only
notifications another writer sent count (`outside_writer`): a port other
than the kernel's, or an IPv6 address notification — which the kernel sends
with port 0 whoever asked — for a permanent address the kernel had no
reason to touch (no DAD failure or completion, not link-local, no link
change around it). Those are named for what is known: "an unidentified
writer (netlink port 0)", never "kernel".
"""

from __future__ import annotations

import ipaddress
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any, cast

from trueup.model.digests import canonical_json
from trueup.reconcile.driftbook import Attribution, DetectedBy, DriftBook, DriftRecord
from trueup.subsystems.base import Difference, Scope, Subsystem
from trueup.system.events import NetlinkEvent, iso_time

__all__ = [
    "ALL_KINDS",
    "DriftBook",
    "DriftRecord",
    "EventLog",
    "attribute",
    "event_json",
    "event_kinds",
    "identifiers",
    "item_label",
    "item_paths",
    "notification",
    "outside_writer",
    "writers",
]

MAX_ATTRIBUTION = 20  # notifications kept per drift record
MAX_RELATED = 5  # related (unmatched) notifications shown when nothing matched
ALL_KINDS = frozenset({"link", "address", "route"})
# A port-0 address notification this close to a change of its link is the kernel's doing.
LINK_GRACE = 2.0
UNIDENTIFIED = "an unidentified writer (netlink port 0: IPv6 address notifications name no sender)"


def event_kinds(subsystem: Subsystem) -> set[str]:
    """The notification kinds that can explain drift in `subsystem`: what it watches.

    Its rtnetlink kinds (`link`, `address`, `route`), plus `file` for a
    `files()` watch and `command` for a `command()` watch. A subsystem that
    watches nothing that notifies (only a periodic look) is explained by none.
    """
    kinds = set(subsystem.watch_kinds)
    for watch in subsystem.watches:
        if watch.kind in ("file", "command"):
            kinds.add(watch.kind)
    return kinds


class EventLog:
    """The most recent notifications, numbered in arrival order.

    The event source's thread appends; passes read a copy. Sequence numbers
    let a pass (and a drift record) consider each notification once.
    """

    def __init__(self, size: int = 512) -> None:
        self._recent: deque[tuple[int, NetlinkEvent]] = deque(maxlen=size)
        self.last_seq = 0  # only the event thread writes it

    def append(self, event: NetlinkEvent) -> int:
        self.last_seq += 1
        self._recent.append((self.last_seq, event))
        return self.last_seq

    def after(self, seq: int) -> list[tuple[int, NetlinkEvent]]:
        """Notifications numbered above `seq`, oldest first."""
        return [(s, e) for s, e in list(self._recent) if s > seq]

    def complete_after(self, seq: int) -> list[tuple[int, NetlinkEvent]] | None:
        """Every notification numbered above `seq`; None when some were already dropped."""
        events = self.after(seq)
        if events and events[0][0] != seq + 1:
            return None
        return events


def identifiers(diffs: Iterable[Difference], scope: Scope) -> set[str]:
    """Interface names and destinations a drift's paths talk about."""
    out: set[str] = set()
    for diff in diffs:
        path = diff.path
        if path.startswith("spec.management"):
            out |= {scope.management_interface, "0.0.0.0/0", "::/0"}
        elif "[" in path:
            inner = path.split("[", 1)[1].split("]", 1)[0]
            if "to=" in inner:
                fields = dict(p.split("=", 1) for p in inner.split(",") if "=" in p)
                out.add(fields["to"])
            else:
                out.add(inner)
    return out


def _subjects(event: NetlinkEvent) -> set[str | None]:
    return {event.ifname, event.destination, event.address, event.detail.get("path")}


def item_label(item: Any) -> str:
    """How an item of a list is named in its item path (`item_paths`)."""
    return item if isinstance(item, str) else canonical_json(item).decode()


def _items(diffs: Iterable[Difference]) -> list[tuple[str, Any, str, str | None]]:
    """(path, observed, parent path, item label or None) for `item_paths` and `writers`."""
    out: list[tuple[str, Any, str, str | None]] = []
    for diff in diffs:
        if not diff.missing and not diff.extra:
            out.append((diff.path, diff.observed, diff.path, None))
            continue
        for marker, items in (("absent", diff.missing), ("present", diff.extra)):
            for item in items:
                label = item_label(item)
                out.append((f"{diff.path}[{label}]", marker, diff.path, label))
    return out


def item_paths(diffs: Iterable[Difference]) -> dict[str, object]:
    """Differing paths for flap detection: one per missing or extra item of a list.

    `spec.interfaces[lan0].addresses` missing `2001:db8::1/64` becomes
    `spec.interfaces[lan0].addresses[2001:db8::1/64]` → `"absent"` (an extra
    item: `"present"`); any other difference keeps its path and observed value.
    """
    return {path: observed for path, observed, _parent, _label in _items(diffs)}


def _is_prefix(text: str) -> bool:
    try:
        ipaddress.ip_interface(text)
    except ValueError:
        return False
    return True


def outside_writer(event: NetlinkEvent, events: Sequence[NetlinkEvent] = ()) -> str | None:
    """Who other than the kernel sent `event`, or None when it is the kernel's own.

    A port other than 0 is a writer (its command name when still running),
    unless it is one of this agent's own sockets (`event.own`).
    Port 0 is the kernel's — except for IPv6 addresses: the kernel announces
    every IPv6 address change with port 0, whoever asked for it. A permanent
    one (only a writer assigns those) that did not fail DAD, is not
    link-local (the kernel's addrconf makes those) and is not the kernel
    announcing the end of its DAD (an earlier `tentative` announcement in
    `events`), with no change of its link within `LINK_GRACE` seconds in
    `events` (a link going down flushes its IPv6 addresses), was removed or
    added by someone: an unidentified writer.
    """
    if event.own:
        return None  # trueup's own write (one of this agent's netlink sockets)
    if event.sender_port:
        return event.sender or f"netlink port {event.sender_port}"
    if event.sender_port is None or event.kind != "address" or not event.address:
        return None
    if ":" not in event.address:
        return None
    flags = event.detail.get("address_flags") or []
    if "permanent" not in flags or "dadfailed" in flags:
        return None
    if _link_local(event.address):
        return None  # the kernel's addrconf makes, re-announces and flushes these itself
    if event.message == "RTM_NEWADDR" and _dad_completed(event, events):
        return None  # the kernel announcing the end of duplicate address detection
    for other in events:
        if (
            other.kind == "link"
            and other.ifname == event.ifname
            and abs(other.received_at - event.received_at) <= LINK_GRACE
        ):
            return None
    return UNIDENTIFIED


def _link_local(address: str) -> bool:
    try:
        return ipaddress.ip_interface(address).ip.is_link_local
    except ValueError:
        return False


def _dad_completed(event: NetlinkEvent, events: Sequence[NetlinkEvent]) -> bool:
    """Whether `event` re-announces an address last announced `tentative` (DAD is over)."""
    earlier = [
        other
        for other in events
        if other is not event
        and other.kind == "address"
        and other.ifname == event.ifname
        and other.address == event.address
        and other.received_at <= event.received_at
    ]
    if not earlier or earlier[-1].message != "RTM_NEWADDR":
        return False
    return "tentative" in (earlier[-1].detail.get("address_flags") or [])


def _names(parent: str, item: str | None, event: NetlinkEvent, scope: Scope) -> bool:
    """Whether `event` is about `parent` (or its item): an address item, that address only.

    An address notification names addresses only: the routes and the state
    that go with an address are the kernel's doing, not another write.
    """
    if item is not None and _is_prefix(item):
        return event.address is not None and (
            event.address == item or event.address.split("/")[0] == item.split("/")[0]
        )
    if event.kind == "address" and not parent.endswith("addresses"):
        return False  # an address going takes its routes with it: the kernel's doing
    probe = Difference("", parent, None, None)
    return bool(identifiers([probe], scope) & _subjects(event))


def writers(
    diffs: Sequence[Difference],
    scope: Scope,
    kinds: set[str],
    events: Iterable[tuple[int, NetlinkEvent]],
) -> dict[str, str]:
    """Per differing item path (`item_paths`), the last writer other than the kernel naming it."""
    seen = [e for _, e in events]
    candidates = []
    for event in seen:
        if event.kind not in kinds:
            continue
        who = outside_writer(event, seen)
        if who is not None:
            candidates.append((event, who))
    out: dict[str, str] = {}
    for path, _observed, parent, item in _items(diffs):
        for event, who in candidates:
            if _names(parent, item, event, scope):
                port = f"port {event.sender_port}"
                out[path] = f"{event.message} from {who}" + ("" if port in who else f" ({port})")
    return out


def notification(event: NetlinkEvent) -> Attribution:
    """`event.to_json()` as a drift record's attribution holds it."""
    return cast(Attribution, event.to_json())


def event_json(event: NetlinkEvent, events: Sequence[NetlinkEvent] = ()) -> Attribution:
    """`event.to_json()`, naming an unidentified writer instead of "kernel" (`outside_writer`)."""
    out = notification(event)
    if event.sender_port == 0:
        who = outside_writer(event, events)
        if who is not None:
            out["sender"] = who
    return out


def attribute(
    record: DriftRecord,
    diffs: Sequence[Difference],
    scope: Scope,
    kinds: set[str],
    events: Iterable[tuple[int, NetlinkEvent]],
    window: float,
) -> None:
    """Attach to `record` the notifications that explain it (kind and object match).

    `events` are numbered notifications; those the record has already
    considered are skipped, and so are those older than `window` seconds
    before the drift began.
    """
    wanted = identifiers(diffs, scope)
    horizon = record.since - window
    newest = record.seen_events
    related: list[Attribution] = []
    events = list(events)
    context = [e for _, e in events]
    for seq, event in events:
        if seq <= record.seen_events:
            continue
        newest = max(newest, seq)
        if event.kind not in kinds or event.received_at < horizon:
            continue
        if wanted & _subjects(event) or (event.address and event.address.split("/")[0] in wanted):
            record.attribution.append(event_json(event, context))
        else:
            related.append({**event_json(event, context), "match": "related"})
    record.seen_events = newest
    if not record.attribution and related:
        record.attribution.extend(related[-MAX_RELATED:])
    if not record.attribution:
        record.attribution.append(
            {
                "message": None,
                "source": record.detected_by,
                "detail": "no notification arrived for it; found by "
                + ("a full resync" if record.detected_by == DetectedBy.RESYNC else "observation"),
                "received_at": iso_time(record.since),
            }
        )
    del record.attribution[:-MAX_ATTRIBUTION]
