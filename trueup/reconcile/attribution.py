"""Drift records, and the kernel notifications that explain them.

Who calls this: the reconcile loop (`trueup.reconcile.loop`), once per
subsystem per pass, and its status view (`trueup.reconcile.view`).

An event only wakes the loop; the pass re-reads everything. What an event
adds is *who*: each drift record carries the notifications whose object
(interface, address, route destination) the differing paths name, of the
kinds that can explain drift in that subsystem (`event_kinds`). The kernel
flushes routes and IPv6 addresses without a notification of their own when
their address or link goes, so when nothing matches, the notifications of
those kinds that did arrive are shown as `"match": "related"`; when none
arrived the record says which look found the drift (a resync, a request).

The same matching names the writer of a path for flap detection
(`writers`): only notifications from a port other than the kernel's count.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from trueup.subsystems.base import Difference, Scope, Subsystem
from trueup.system.events import NetlinkEvent, iso_time

__all__ = [
    "ALL_KINDS",
    "DriftBook",
    "DriftRecord",
    "EventLog",
    "attribute",
    "event_kinds",
    "identifiers",
    "writers",
]

MAX_ATTRIBUTION = 20  # notifications kept per drift record
MAX_RELATED = 5  # related (unmatched) notifications shown when nothing matched
ALL_KINDS = frozenset({"link", "address", "route"})


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


@dataclass
class DriftRecord:
    since: float
    paths: list[str]
    detected_by: str  # event | resync | request
    attribution: list[dict[str, Any]] = field(default_factory=list)
    seen_events: int = 0  # events already considered, by sequence number

    def to_json(self) -> dict[str, Any]:
        return {
            "since": iso_time(self.since),
            "paths": self.paths,
            "detected_by": self.detected_by,
            "attribution": self.attribution,
        }


class DriftBook:
    """Per subsystem, the drift going on now and the last one that ended."""

    def __init__(self) -> None:
        self.current: dict[str, DriftRecord] = {}
        self.last: dict[str, dict[str, Any]] = {}  # the ended record's JSON, with `ended_at`

    def get(self, name: str) -> DriftRecord | None:
        return self.current.get(name)

    def start(self, name: str, since: float, detected_by: str) -> DriftRecord:
        """The record of `name`'s drift: the open one, or a new one from `since`."""
        record = self.current.get(name)
        if record is None:
            record = DriftRecord(since=since, paths=[], detected_by=detected_by)
            self.current[name] = record
        return record

    def end(self, name: str, now: float) -> None:
        """`name` is in sync again, whoever fixed it: keep the record as the last drift."""
        record = self.current.pop(name, None)
        if record is not None:
            self.last[name] = {**record.to_json(), "ended_at": iso_time(now)}

    def forget(self, names: Iterable[str] | None = None) -> None:
        """Drop open records without ending them (a new apply, an explicit reconcile)."""
        if names is None:
            self.current.clear()
            return
        for name in names:
            self.current.pop(name, None)


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


def writers(
    diffs: Sequence[Difference],
    scope: Scope,
    kinds: set[str],
    events: Iterable[tuple[int, NetlinkEvent]],
) -> dict[str, str]:
    """Per differing path, the last writer other than the kernel whose notification names it."""
    candidates = [e for _, e in events if e.kind in kinds and e.sender_port]
    out: dict[str, str] = {}
    for diff in diffs:
        wanted = identifiers([diff], scope)
        for event in candidates:
            if wanted & _subjects(event):
                who = event.sender or f"netlink port {event.sender_port}"
                out[diff.path] = f"{event.message} from {who} (port {event.sender_port})"
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
    related: list[dict[str, Any]] = []
    for seq, event in events:
        if seq <= record.seen_events:
            continue
        newest = max(newest, seq)
        if event.kind not in kinds or event.received_at < horizon:
            continue
        if wanted & _subjects(event) or (event.address and event.address.split("/")[0] in wanted):
            record.attribution.append(event.to_json())
        else:
            related.append({**event.to_json(), "match": "related"})
    record.seen_events = newest
    if not record.attribution and related:
        record.attribution.extend(related[-MAX_RELATED:])
    if not record.attribution:
        record.attribution.append(
            {
                "message": None,
                "source": record.detected_by,
                "detail": "no notification arrived for it; found by "
                + ("a full resync" if record.detected_by == "resync" else "observation"),
                "received_at": iso_time(record.since),
            }
        )
    del record.attribution[:-MAX_ATTRIBUTION]
