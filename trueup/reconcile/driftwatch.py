"""What the reconcile loop knows of drift between its passes.

Who calls this: the reconcile loop (`trueup.reconcile.loop.ReconcileLoop`),
under its lock. A `DriftWatch` keeps

* the notifications the loop was woken by (`events`, an `EventLog`);
* the drift records going on and ended (`book`, a `DriftBook`), each with
  the paths and the notifications that explain it
  (`trueup.reconcile.attribution`);
* which subsystems the last pass found in sync, and at which observation
  mark (`in_sync`): only those can have drift *proven* by notifications
  before the next pass (`prove`);
* the running pass's scope and first notification (`pass_context`), so a
  failed heal can name another writer (`evidence`) or a link that changed
  under it (`disturbance`).

A pass's look (`look`) observes every subsystem (or those a periodic look
names), diffs it against the applied document and records what differs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

from trueup.model.document import DeviceState
from trueup.model.health import SubsystemHealth
from trueup.reconcile.attribution import (
    MAX_ATTRIBUTION,
    EventLog,
    attribute,
    event_kinds,
    item_paths,
    notification,
    writers,
)
from trueup.reconcile.driftbook import Attribution, DetectedBy, DriftBook
from trueup.reconcile.engine import Engine
from trueup.reconcile.engine import observe as observing
from trueup.reconcile.healer import PassReport
from trueup.reconcile.healing import Governor
from trueup.subsystems.base import Difference, Scope, Subsystem
from trueup.system.events import NetlinkEvent

__all__ = ["ACTOR", "DriftWatch", "Look", "Seen"]

log = logging.getLogger("trueup.reconcile")

ACTOR = "reconciler"


@dataclass(frozen=True)
class Look:
    """What one pass looks at, since when, and why."""

    scope: Scope
    names: list[str] | None  # None: every subsystem
    now: float
    detected_by: DetectedBy
    since_seq: int  # the last notification an earlier pass saw
    forced: bool  # an explicit `trueup reconcile`: a waiting writer does not end the look
    document_key: Any  # which applied document the pass compares with


@dataclass(frozen=True)
class Seen:
    """What a look found."""

    differences: dict[str, list[Difference]]
    settled: list[str]  # of the subsystems asked about: in sync, and waiting on nothing
    fought: bool  # a writer fights management: reported upstream at once


class DriftWatch:
    def __init__(
        self,
        engine: Engine,
        governor: Governor,
        clock: Callable[[], float],
        attribution_window: float,
    ) -> None:
        self.governor = governor
        self.engine = engine
        self.state = engine.state
        self.clock = clock
        self.attribution_window = attribution_window
        self.events = EventLog()
        self.book = DriftBook()
        # subsystem → (its observation mark, the event seq its pass started at, the
        # applied document's key), kept while its last pass found it in sync.
        self.in_sync: dict[str, tuple[object, int, Any]] = {}
        self.pass_from_seq = 0  # events up to this one were seen by an earlier pass
        self.pass_context: tuple[Scope, int] | None = None  # the running pass's scope, first event
        self.heal_seq = 0  # the last event before the running heal began

    def forget(self) -> None:
        """What is applied changed, or nothing is: no drift record and no mark holds."""
        self.book.forget()
        self.in_sync.clear()

    # -- before a pass: drift that notifications prove ------------------------
    def prove(self, subsystems: Iterable[Subsystem], document_key: Any) -> tuple[bool, bool]:
        """Record the drift the notifications since each in-sync mark prove.

        Returns (recorded, pending): whether a record was written, and whether
        a subsystem waits for the rest of a change being reported. Nothing is
        proven after notifications were lost (an overflow), or against a
        document other than the one the pass compared with.
        """
        recorded = pending = False
        for sub in subsystems:
            entry = self.in_sync.get(sub.name)
            if entry is None or self.book.get(sub.name) is not None:
                continue
            mark, seq, key = entry
            events = self.events.complete_after(seq)
            if key != document_key or events is None:
                continue
            if any(event.kind == "overflow" for _, event in events):
                continue  # a watch restarted: what it missed proves nothing
            verdict = sub.proven_change(mark, events)
            pending = pending or verdict.pending
            if verdict.paths:
                self._record_proof(sub.name, verdict.paths, verdict.lines, events)
                recorded = True
        return recorded, pending

    def _record_proof(
        self,
        name: str,
        paths: tuple[str, ...],
        lines: tuple[int, ...],
        events: list[tuple[int, NetlinkEvent]],
    ) -> None:
        del self.in_sync[name]
        record = self.book.start(name, self.clock(), DetectedBy.EVENT)
        record.paths = list(paths)
        proving = set(lines)
        proof: list[Attribution] = [
            {**notification(event), "match": "proves the change"}
            for seq, event in events
            if seq in proving
        ]
        record.attribution = proof[-MAX_ATTRIBUTION:]
        record.seen_events = max(proving, default=record.seen_events)
        log.warning("%s: drift proven by notifications: %s", name, ", ".join(paths))

    # -- during a pass ----------------------------------------------------------
    def look(
        self,
        document: DeviceState,
        look: Look,
        report: PassReport,
        settling: Collection[str],
    ) -> Seen | None:
        """Observe and diff each subsystem, recording drift; None when a writer came first.

        `settling` names subsystems whose return to sync matters (the start left
        them unfinished, or a transaction recorded them failing).
        """
        differences: dict[str, list[Difference]] = {}
        settled: list[str] = []
        fought = False
        scope = look.scope
        engine = self.engine
        with engine.sources() as net:
            observed_all = observing.observe_bounded(
                engine,
                net,
                scope,
                look.names,
                errors=report.unobservable,
                # An operator's write waits: a daemon that does not answer must not
                # keep the pass (and its lock) from yielding to it.
                give_up=(lambda: False) if look.forced else engine.writer_wanted,
            )
            if observed_all is None:
                return None
            for sub in engine.subsystems:
                if sub.name not in observed_all:
                    if sub.name in report.unobservable:
                        # Cannot be seen now (a daemon that does not answer): reported, and
                        # what depends on it waits; the other subsystems carry on.
                        log.warning("%s", report.unobservable[sub.name])
                    continue  # else not looked at in this pass (a periodic look)
                observed = observed_all[sub.name]
                differences[sub.name] = diffs = sub.diff(sub.desired(document, scope), observed)
                self.note_sync(sub, diffs, observed, look.document_key)
                if self.record(sub, diffs, scope, look.now, look.detected_by, look.since_seq):
                    fought = True
                report.drift[sub.name] = [d.path for d in diffs]
                if not diffs and sub.name in settling and not _pending(sub, net, document):
                    settled.append(sub.name)
        return Seen(differences, settled, fought)

    def links_appeared(self, since_seq: int, scope: Scope) -> bool:
        """Whether a managed link (re)appeared since event `since_seq`."""
        appeared = {
            event.ifname
            for _seq, event in self.events.after(since_seq)
            if event.kind == "link" and event.message == "RTM_NEWLINK"
        }
        return bool(appeared & (scope.interfaces | {scope.management_interface}))

    def note_sync(
        self, sub: Subsystem, diffs: list[Difference], observed: Any, document_key: Any
    ) -> None:
        """In sync at an exact state: notifications from here on may prove drift."""
        mark = None if diffs else sub.observation_mark(observed)
        if mark is None:
            self.in_sync.pop(sub.name, None)
        else:
            self.in_sync[sub.name] = (mark, self.pass_from_seq, document_key)

    def record(
        self,
        sub: Subsystem,
        diffs: list[Difference],
        scope: Scope,
        now: float,
        detected_by: DetectedBy,
        since_seq: int,
    ) -> bool:
        """Flap bookkeeping for what differs, and the drift record with its attribution.

        True when a writer was found fighting management (reported upstream at once).
        """
        name = sub.name
        kinds = event_kinds(sub)
        written = writers(diffs, scope, kinds, self.events.after(since_seq))
        fought = False
        for path, marked in self.governor.observe(name, item_paths(diffs), now, written):
            kind = marked["kind"]
            fought = fought or kind == "fought"
            if kind == "fought":
                log.error("%s: %s", name, marked["reason"])
            else:
                log.warning("%s: %s", name, marked["reason"])
            self.state.audit.append(
                "management_fought" if kind == "fought" else "contested",
                ACTOR,
                subsystem=name,
                path=path,
                **{
                    k: v for k, v in marked.items() if k not in ("value", "last_written_at", "kind")
                },
            )
        if not diffs:
            # In sync again, whoever fixed it: failures against it are over.
            self.governor.record_resolved(name)
            self.book.end(name, now)
            return fought
        # Stamped after this subsystem's observation: when the drift was known.
        record = self.book.start(name, self.clock(), detected_by)
        record.paths = [d.path for d in diffs]
        events = self.events.after(record.seen_events)
        attribute(record, diffs, scope, kinds, events, self.attribution_window)
        return fought

    def expire_contested(self, now: float, flap_window: float) -> None:
        """Contested (and fought) paths no writer touched for the flap window: healed again."""
        for name, path, record in self.governor.expire_contested(now):
            log.warning("%s: %s: no writer seen for %gs; healing resumes", name, path, flap_window)
            self.state.audit.append(
                "contested_cleared",
                ACTOR,
                subsystem=name,
                path=path,
                writer=record.get("writer"),
                quiet_seconds=flap_window,
            )

    # -- what a failed heal is told -----------------------------------------------
    def evidence(self, name: str, diffs: list[Difference]) -> dict[str, str]:
        """Who other than the kernel wrote `diffs` since the running pass began (path → who)."""
        sub = self.engine.by_name.get(name)
        if sub is None or self.pass_context is None:
            return {}
        scope, since_seq = self.pass_context
        return writers(diffs, scope, event_kinds(sub), self.events.after(since_seq))

    def disturbance(self, name: str) -> str | None:
        """Why `name`'s failed heal was a link's doing: a managed link changed while it ran.

        Only for subsystems that depend on links (addresses, routes): a route
        cannot be added through a link that just went down. They wait on
        `links`; the breaker does not count it, and the link's return retries.
        """
        sub = self.engine.by_name.get(name)
        if sub is None or "links" not in sub.depends_on or self.pass_context is None:
            return None
        scope = self.pass_context[0]
        managed = scope.interfaces | {scope.management_interface}
        for _seq, event in self.events.after(self.heal_seq):
            if event.kind == "link" and event.ifname in managed:
                state = event.detail.get("admin_state") or event.message
                return f"waiting on links: {event.ifname} changed ({event.message}, {state}) during the heal"
        return None


def _pending(sub: Subsystem, net: Any, document: DeviceState) -> bool:
    """Whether `sub` says it waits (a link not there yet) although its facts agree."""
    try:
        condition = sub.condition(net, document)
    except Exception:  # a condition that cannot be read proves nothing
        return False
    return condition is not None and condition[0] == SubsystemHealth.PENDING
