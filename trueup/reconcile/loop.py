"""The reconcile loop: scheduling and passes — event-driven, level-based, bounded healing.

Who calls this: the agent (`trueup.agent.process.Agent.start_loop`, wired in
`trueup.agent.wiring`). The agent delegates `apply`, `rollback`, `confirm`,
`reconcile`, `ack`, status and metrics here once the loop runs.

How a pass works (controller-runtime style: the event names nothing):

1. kernel notifications (`trueup.system.events`) and a periodic full resync
   (`resync_seconds`, default 60 s) only *wake* the loop;
2. every pass re-reads the system for every subsystem and diffs it against
   the applied document — detection never depends on the event's content and
   can never be switched off;
3. each subsystem with drift gets a drift record (since, paths, the
   notifications that explain it: `trueup.reconcile.attribution`) and flap
   bookkeeping (`trueup.reconcile.healing.Governor`);
4. what policy and bounds allow is healed as one journaled `reconcile`
   transaction (`trueup.reconcile.healer`); contested paths are left alone.

One exception to "the event names nothing": before its pass the loop asks a
subsystem it last saw in sync whether the notifications since *prove* a
change (`_record_proven_drift`; the firewall's `nft monitor` lines can). A
proof is recorded as drift at once, so detection does not wait for a
listing of thousands of rules; the pass still observes, confirms and heals.

The other parts, each in its own module:

* confirm-or-rollback (`apply --confirm-within`): `trueup.reconcile.confirmwait`
  (the pending record survives restarts: `trueup.reconcile.confirm`);
* what status shows: `trueup.reconcile.view` (read lock-free by API threads).

Why this module is over 400 lines: besides scheduling and passes it is the
agent's one entry for operator requests (apply, rollback, confirm, reconcile,
ack). Each is a few lines that delegate to the modules above; they stay here
because they take the loop's lock, hold passes off while they write, and
wake the loop afterwards. Drift proven by notifications is recorded here
too, because it must see the same drift book, writers and event log as the
pass under the same lock.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from trueup.journal.atomic import StateFileError
from trueup.journal.lock import lock_holder
from trueup.model.document import DeviceState, DocumentError
from trueup.model.health import SubsystemHealth
from trueup.reconcile.attribution import (
    MAX_ATTRIBUTION,
    DriftBook,
    DriftRecord,
    EventLog,
    attribute,
    event_kinds,
    item_paths,
    writers,
)
from trueup.reconcile.confirmwait import ConfirmWait
from trueup.reconcile.healer import Healer, PassReport
from trueup.reconcile.healing import MANAGEMENT, Governor, HealingOptions
from trueup.reconcile.transaction import (
    Change,
    DamagedState,
    Engine,
    Refused,
    StorageError,
)
from trueup.reconcile.view import LoopActivity, LoopView, build_view
from trueup.subsystems.base import Difference, Scope, Subsystem
from trueup.subsystems.registry import scope_for
from trueup.system.events import EventSource, NetlinkEvent, iso_time

__all__ = ["RECONCILE_FILE", "DriftRecord", "PassReport", "ReconcileLoop"]

log = logging.getLogger("trueup.reconcile")

RECONCILE_FILE = "reconcile.json"
ACTOR = "reconciler"
RETRY_SOON = 0.1  # after a pass skipped for a writer, or a deferred rollback
# Closing a transaction a full or read-only state directory left open: retried
# after 0.5 s, doubling up to 2 s, until the directory takes writes again.
CLOSE_RETRY_FIRST = 0.5
CLOSE_RETRY_CAP = 2.0
ENDED_ACKS = 10  # expired or withdrawn acknowledgements shown (status, reports)
PROOF_WAIT = 0.1  # longest wait for the rest of a change being reported (`_record_proven_drift`)


class ReconcileLoop:
    def __init__(
        self,
        engine: Engine,
        *,
        options: HealingOptions | None = None,
        events: EventSource | None = None,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        self.engine = engine
        self.state = engine.state
        self.options = options or HealingOptions()
        self.events = events
        self.clock = clock
        self.governor = Governor(self.options, rng)
        try:
            self.governor.load(self.state.read(RECONCILE_FILE, {}))
        except (ValueError, TypeError, AttributeError, KeyError, OSError) as exc:
            # Reported as damage (automatic heals wait until it is repaired); the
            # loop itself must run: detection never stops.
            log.error(
                "%s/%s: %s; acknowledgements and breakers start empty",
                self.state.root,
                RECONCILE_FILE,
                exc,
            )
            self.governor.load({})
        self.counters: dict[str, int] = {
            "passes": 0,
            "events": 0,
            "heals_ok": 0,
            "heals_failed": 0,
            "overflows": 0,
            "ticks": 0,
        }
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._events = EventLog()
        self._pass_from_seq = 0  # events up to this one were seen by an earlier pass
        self._events_since_pass = 0
        self._applying = 0
        self._applying_lock = (
            threading.Lock()
        )  # never the pass's lock: a write never waits on a pass
        self._drift = DriftBook()
        self._waiting: dict[str, str] = {}  # subsystem → the dependency it waits on (last pass)
        # What the agent's start left unfinished (pending on a late link, or failed): healed
        # under every policy until a pass sees it in sync (`finish_start`).
        self._starting: set[str] = set()
        self._last_pass_at: float | None = None
        self._last_resync_at: float | None = None
        self._retry_soon = False
        self._tick_due = False
        self._retry_after: float | None = None
        self._close_delay = CLOSE_RETRY_FIRST
        self._document_cache: tuple[Any, DeviceState | None] = (None, None)
        # subsystem → (its observation mark, the event seq its pass started at, the
        # applied document's key), kept while its last pass found it in sync.
        self._in_sync: dict[str, tuple[object, int, Any]] = {}
        self.healer = Healer(engine, self.governor, clock, self.counters)
        self.healer.evidence = self._evidence
        self.healer.disturbance = self._disturbance
        self._pass_context: tuple[Scope, int] | None = None  # the running pass's scope, first event
        self._heal_seq = 0  # the last event before the running heal began
        # Called (without arguments, on the loop's thread) when a writer is found fighting
        # management: the agent sends a report to the control plane at once.
        self.on_fought: list[Callable[[], None]] = []
        # Called (without arguments, under the loop's lock: it must only signal) when what
        # an operator sees of the loop changed (`LoopView.operator_digest`), and when an
        # operator's write begins: the agent reports to the control plane.
        self.on_change: list[Callable[[], None]] = []
        self._shown_digest: str | None = None
        self._ended_acks: deque[dict[str, Any]] = deque(maxlen=ENDED_ACKS)
        self.confirmation = ConfirmWait(
            engine, clock=clock, lock=self._lock, on_converged=self._start_over
        )
        self._view = LoopView()
        self._refresh_view()

    @classmethod
    def from_env(cls, engine: Engine) -> ReconcileLoop:
        """The agent's loop: the subsystems' watches, options from `TRUEUP_*` variables."""
        from trueup.system.watches import event_source_for

        events = event_source_for(
            (w for sub in engine.subsystems for w in sub.watches), engine.state.root
        )
        return cls(engine, options=HealingOptions.from_env(), events=events)

    # -- lifecycle ----------------------------------------------------------
    def finish_start(self, names: Collection[str]) -> None:
        """Subsystems the start did not bring to the committed revision: the loop does.

        A start converges every subsystem under every policy (a reboot is not
        drift); what could not converge then — a link not there yet, a daemon
        that failed — is healed by the passes that follow as if its policy
        were `auto`, within the governor's bounds, until a pass finds it in
        sync. From then on its policy governs.
        """
        with self._lock:
            self._starting |= set(names)
        self.wake()

    def start(self) -> None:
        if self.events is not None:
            self.events.start(self._on_event)
        self._thread = threading.Thread(target=self._run, name="trueup-reconcile", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self.events is not None:
            self.events.stop()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def wake(self) -> None:
        self._wake.set()

    def _on_event(self, event: NetlinkEvent) -> None:
        if event.kind == "tick":
            # A periodic look asked for by a subsystem (`every(...)`), not a change.
            self.counters["ticks"] += 1
            self._tick_due = True
            self._wake.set()
            return
        self._events.append(event)
        self.counters["events"] += 1
        if event.kind == "overflow":
            self.counters["overflows"] += 1
        self._events_since_pass += 1
        self._wake.set()

    # -- scheduling ---------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            woken = self._wake.wait(self._timeout())
            self._wake.clear()
            if self._stop.is_set():
                return
            if self._events_since_pass and self._in_sync:
                self._record_proven_drift()
            self._await_writers()
            names: list[str] | None = None
            if woken and self._tick_due and not self._events_since_pass and not self._retry_soon:
                # Only a tick: look at the subsystems that asked for it, if the
                # document configures them; nothing else needs a pass.
                names = self._ticking()
                self._tick_due = False
                if not names:
                    continue
            self._tick_due = False
            try:
                self.run_pass(names=names)
            except Exception:  # the loop must outlive any one pass
                log.exception("reconcile pass failed")
                self._stop.wait(1.0)

    def _await_writers(self) -> None:
        """While a transaction runs, events are only counted: wait for it to end.

        What a pass would see mid-transaction is half-applied, and an apply of
        thousands of addresses sends thousands of notifications; passing on each
        would spin. One pass follows the transaction and sees its result.
        """
        delay = 0.05
        while not self._stop.is_set():
            if self._applying or self.engine.active or self.engine.writer_wanted():
                if self.engine.active:
                    self.engine.idle.wait(0.05 if self.engine.writer_wanted() else 1.0)
                else:
                    # Wanted, or an apply not holding the writer yet (it waits for another
                    # process, or checks first): `idle` is set, so wait on time, not on it.
                    self._stop.wait(0.05)
                with self._lock:
                    pass  # an API apply finishes its bookkeeping under the lock
                continue
            if lock_holder(self.state.root / "lock"):
                # Another process writes (a CLI apply without the agent): poll gently.
                self._stop.wait(delay)
                delay = min(1.0, delay * 2)
                continue
            return

    def _record_proven_drift(self) -> None:
        """Drift that notifications alone prove, recorded before the pass that confirms it.

        Listing a large table takes hundreds of milliseconds; the notification
        that names the change arrives in a few. A subsystem whose last pass
        found it in sync at an exact state (`observation_mark`) is asked whether
        the notifications since prove a change (`proven_change`): only a proof
        counts, never a guess, so the record is true when it is written — a
        change trueup made itself is never proven (the firewall's own loads
        delete and re-create the table, which proves nothing). Nothing is
        proven while a trueup transaction runs, after notifications were lost,
        or against a document other than the one the pass compared with. The
        pass that follows observes, fills in the paths, heals per policy, and
        ends the record if the system is in sync again.
        """
        deadline: float | None = None
        while not self._stop.is_set():
            pending = False
            with self._lock:
                if self._applying or self.engine.active or lock_holder(self.state.root / "lock"):
                    return
                self._document()
                key = self._document_cache[0]
                recorded = False
                for sub in self.engine.subsystems:
                    entry = self._in_sync.get(sub.name)
                    if entry is None or self._drift.get(sub.name) is not None:
                        continue
                    mark, seq, document_key = entry
                    events = self._events.complete_after(seq)
                    if document_key != key or events is None:
                        continue
                    if any(event.kind == "overflow" for _, event in events):
                        continue  # a watch restarted: what it missed proves nothing
                    verdict = sub.proven_change(mark, events)
                    pending = pending or verdict.pending
                    if verdict.paths:
                        self._record_proof(sub.name, verdict.paths, verdict.lines, events)
                        recorded = True
                if recorded:
                    self._refresh_view()
            if not pending:
                return
            # A change is being reported and its last line is due at once (the end
            # of an nftables transaction): wait for it, briefly, then let the pass decide.
            now = time.monotonic()
            deadline = now + PROOF_WAIT if deadline is None else deadline
            if now >= deadline or not self._wake.wait(deadline - now):
                return
            self._wake.clear()

    def _record_proof(
        self,
        name: str,
        paths: tuple[str, ...],
        lines: tuple[int, ...],
        events: list[tuple[int, NetlinkEvent]],
    ) -> None:
        del self._in_sync[name]
        record = self._drift.start(name, self.clock(), "event")
        record.paths = list(paths)
        proving = set(lines)
        record.attribution = [
            {**event.to_json(), "match": "proves the change"}
            for seq, event in events
            if seq in proving
        ][-MAX_ATTRIBUTION:]
        record.seen_events = max(proving, default=record.seen_events)
        log.warning("%s: drift proven by notifications: %s", name, ", ".join(paths))

    def _timeout(self) -> float:
        """Seconds until the next pass is due, whatever wakes the loop before."""
        now = self.clock()
        last = self._last_pass_at if self._last_pass_at is not None else now - 1e9
        moments = [last + self.options.resync_seconds]
        for moment in (
            self.governor.next_due(now),  # back-off over, cool-down over, an ack expiring
            self.confirmation.deadline(),
            now + RETRY_SOON if self._retry_soon else None,
            self._retry_after,
        ):
            if moment is not None:
                moments.append(moment)
        return max(0.0, min(self.options.resync_seconds, min(moments) - now)) + 0.001

    # -- the pass -----------------------------------------------------------
    def _document(self) -> DeviceState | None:
        applied = self.state.applied()
        key = (
            applied.get("version"),
            applied.get("txn"),
            applied.get("digest"),
            self.engine.override_signature(),  # a console override is adopted at once
        )
        if self._document_cache[0] != key:
            try:
                self._document_cache = (key, self.engine.applied_document())
            except (DocumentError, StateFileError):
                log.exception("applied revision unreadable; nothing to reconcile against")
                self._document_cache = (key, None)
        return self._document_cache[1]

    def _retry_for_new_links(self, since_seq: int, scope: Scope) -> None:
        """A managed link (re)appeared: subsystems backing off may try again at once.

        A management NIC that shows up late at boot must not wait out a
        back-off grown while it was absent.
        """
        appeared = {
            event.ifname
            for _seq, event in self._events.after(since_seq)
            if event.kind == "link" and event.message == "RTM_NEWLINK"
        }
        if not appeared & (scope.interfaces | {scope.management_interface}):
            return
        now = self.clock()
        for sub in self.engine.subsystems:
            if "link" in sub.watch_kinds and self.governor.link_returned(sub.name, now):
                log.info("%s: a managed link appeared; retrying without waiting", sub.name)

    def _ticking(self) -> list[str]:
        document = self._document()
        if document is None:
            return []
        return [
            sub.name
            for sub in self.engine.subsystems
            if any(w.kind == "periodic" for w in sub.watches) and sub.configured(document)
        ]

    def run_pass(
        self,
        *,
        force: list[str] | None = None,
        actor: str = ACTOR,
        lock_wait: float = 0.0,
        names: list[str] | None = None,
    ) -> PassReport:
        """Observe everything, record drift, heal what policy and bounds allow.

        `force` names subsystems to heal regardless of policy, acknowledgement
        and bounds (an explicit `trueup reconcile`).
        """
        with self._lock:
            report = PassReport()
            now = self.clock()
            self.counters["passes"] += 1
            triggered_by_events = self._events_since_pass > 0 and names is None
            self._events_since_pass = 0
            since_seq, self._pass_from_seq = self._pass_from_seq, self._events.last_seq
            self._retry_soon = False
            self._retry_after = None
            self._expire_acks(now)
            self._expire_contested(now)
            if not self._applying and self.confirmation.check(now):
                self._retry_soon = True
            writer_waits = self.engine.writer_wanted()
            if (
                self._applying
                or (writer_waits and force is None)
                or (force is None and lock_holder(self.state.root / "lock"))
            ):
                # Someone is writing: what we would see is half-applied. Look again soon.
                self._retry_soon = True
                report.skipped = "a writer holds the device"
                self._refresh_view()
                return report
            self._close_interrupted(now)
            document = self._document()
            self._last_pass_at = now
            if not triggered_by_events and names is None:
                self._last_resync_at = now
            if document is None:
                self._drift.forget()
                self._in_sync.clear()
                self._refresh_view()
                report.skipped = "nothing applied"
                return report
            scope = scope_for(document)
            detected_by = "request" if force else ("event" if triggered_by_events else "resync")
            differences: dict[str, list[Difference]] = {}
            recovered: list[str] = []  # recorded as failing, seen in sync now
            failing = self._recorded_failing()
            with self.engine.sources() as net:
                seen = self.engine.observe_bounded(
                    net,
                    scope,
                    names,
                    errors=report.unobservable,
                    # An operator's write waits: a daemon that does not answer must not
                    # keep the pass (and its lock) from yielding to it.
                    give_up=(lambda: False) if force else self.engine.writer_wanted,
                )
                if seen is None:
                    self._retry_soon = True
                    report.skipped = "a writer is waiting"
                    self._refresh_view()
                    return report
                observed_all = seen
                for sub in self.engine.subsystems:
                    if sub.name not in observed_all:
                        if sub.name not in report.unobservable:
                            continue  # not looked at in this pass (a periodic look)
                        # Cannot be seen now (a daemon that does not answer): reported, and
                        # what depends on it waits; the other subsystems carry on.
                        log.warning("%s", report.unobservable[sub.name])
                        continue
                    desired = sub.desired(document, scope)
                    differences[sub.name] = diffs = sub.diff(desired, observed_all[sub.name])
                    self._note_sync(sub, diffs, observed_all[sub.name])
                    self._record_drift(sub, diffs, scope, now, detected_by, since_seq)
                    report.drift[sub.name] = [d.path for d in diffs]
                    if (
                        not diffs
                        and sub.name in self._starting
                        and not _pending(sub, net, document)
                    ):
                        self._starting.discard(sub.name)
                        log.info("%s: at the committed revision since the start", sub.name)
                    if not diffs and sub.name in failing and not _pending(sub, net, document):
                        recovered.append(sub.name)
            if recovered:
                # Failing no more although nothing healed it (a daemon restarted by its
                # supervisor): a later write must not carry the old failure.
                settled = self.engine.settle_in_sync(recovered, actor)
                if settled:
                    log.info("%s: in sync again, its recorded failure cleared", ", ".join(settled))
            self._retry_for_new_links(since_seq, scope)
            self._pass_context = (scope, since_seq)
            self._heal_seq = self._events.last_seq
            retry_in = self.healer.heal(
                document,
                differences,
                self._drift.current,
                report,
                actor=actor,
                lock_wait=lock_wait,
                force=force or [],
                starting=self._starting,
            )
            if retry_in is not None:
                due = self.clock() + retry_in
                self._retry_after = min(due, self._retry_after or due)
            self._waiting = dict(report.waiting)
            self._persist()
            self._refresh_view()
            return report

    def _close_interrupted(self, now: float) -> None:
        """Close a transaction a storage fault left open, as soon as the directory takes writes.

        A full or read-only state directory can refuse the very record that
        would close a transaction (`_storage_failure`): it stays open, and
        `STATE_APPLY_NOT_COMPLETED` is reported from it. Each pass — and a
        timer with back-off while it stays open — tries the recovery again
        (converge to the committed revision, close it `rolled_back`), so it is
        closed without waiting for the next write.
        """
        try:
            if self.state.journal.open_transaction() is None:
                self._close_delay = CLOSE_RETRY_FIRST
                return
            recovered = self.engine.recover(actor=ACTOR, wait=0.0, quiet=True)
        except DamagedState:
            return  # reported as damage; recovery waits for the repair
        except Refused:
            self._retry_soon = True  # a writer took the lock meanwhile: it recovers, or we do
            return
        except (OSError, StorageError, StateFileError) as exc:
            log.warning("an interrupted transaction stays open: %s", exc)
            self._retry_after = now + self._close_delay
            self._close_delay = min(CLOSE_RETRY_CAP, self._close_delay * 2)
            return
        except Exception:  # the pass goes on: management is restored whatever recovery does
            log.exception("an interrupted transaction stays open: its recovery failed")
            self._retry_after = now + self._close_delay
            self._close_delay = min(CLOSE_RETRY_CAP, self._close_delay * 2)
            return
        self._close_delay = CLOSE_RETRY_FIRST
        if recovered is not None:
            log.warning("closed transaction %s left open by a storage fault", recovered.txn)
            self._start_over()

    def _note_sync(self, sub: Subsystem, diffs: list[Difference], observed: Any) -> None:
        """In sync at an exact state: notifications from here on may prove drift."""
        mark = None if diffs else sub.observation_mark(observed)
        if mark is None:
            self._in_sync.pop(sub.name, None)
        else:
            self._in_sync[sub.name] = (mark, self._pass_from_seq, self._document_cache[0])

    def _record_drift(
        self,
        sub: Subsystem,
        diffs: list[Difference],
        scope: Scope,
        now: float,
        detected_by: str,
        since_seq: int,
    ) -> None:
        """Flap bookkeeping for what differs, and the drift record with its attribution."""
        name = sub.name
        kinds = event_kinds(sub)
        differing = item_paths(diffs)
        written = writers(diffs, scope, kinds, self._events.after(since_seq))
        fought = False
        for path, marked in self.governor.observe(name, differing, now, written):
            kind = marked.pop("kind")
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
                **{k: v for k, v in marked.items() if k not in ("value", "last_written_at")},
            )
        if fought:
            for callback in self.on_fought:
                try:
                    callback()
                except Exception:  # a report that cannot go out must not stop the pass
                    log.exception("management fight not reported upstream")
        if not diffs:
            # In sync again, whoever fixed it: failures against it are over.
            self.governor.record_resolved(name)
            self._drift.end(name, now)
            return
        # Stamped after this subsystem's observation: when the drift was known.
        record = self._drift.start(name, self.clock(), detected_by)
        record.paths = [d.path for d in diffs]
        events = self._events.after(record.seen_events)
        attribute(record, diffs, scope, kinds, events, self.options.attribution_window)

    def _evidence(self, name: str, diffs: list[Difference]) -> dict[str, str]:
        """Who other than the kernel wrote `diffs` since the running pass began (path → who)."""
        sub = self.engine.by_name.get(name)
        if sub is None or self._pass_context is None:
            return {}
        scope, since_seq = self._pass_context
        return writers(diffs, scope, event_kinds(sub), self._events.after(since_seq))

    def _disturbance(self, name: str) -> str | None:
        """Why `name`'s failed heal was a link's doing: a managed link changed while it ran.

        Only for subsystems that depend on links (addresses, routes): a route
        cannot be added through a link that just went down. They wait on
        `links`; the breaker does not count it, and the link's return retries.
        """
        sub = self.engine.by_name.get(name)
        if sub is None or "links" not in sub.depends_on or self._pass_context is None:
            return None
        scope = self._pass_context[0]
        managed = scope.interfaces | {scope.management_interface}
        for _seq, event in self._events.after(self._heal_seq):
            if event.kind == "link" and event.ifname in managed:
                state = event.detail.get("admin_state") or event.message
                return f"waiting on links: {event.ifname} changed ({event.message}, {state}) during the heal"
        return None

    def _expire_contested(self, now: float) -> None:
        """Contested (and fought) paths no writer touched for the flap window: healed again."""
        for name, path, record in self.governor.expire_contested(now):
            log.warning(
                "%s: %s: no writer seen for %gs; healing resumes",
                name,
                path,
                self.options.flap_window,
            )
            self.state.audit.append(
                "contested_cleared",
                ACTOR,
                subsystem=name,
                path=path,
                writer=record.get("writer"),
                quiet_seconds=self.options.flap_window,
            )

    def _expire_acks(self, now: float) -> None:
        for name, ack in self.governor.expire_acks(now):
            self.state.audit.append(
                "ack_expired", ACTOR, subsystem=name, until=ack["until_at"], reason=ack["reason"]
            )
            self._ack_ended(name, ack, "expired", now)

    def _ack_ended(self, name: str, ack: dict[str, Any], how: str, now: float) -> None:
        self._ended_acks.appendleft(
            {
                "subsystem": name,
                "until": ack.get("until_at"),
                "by": ack.get("actor"),
                "reason": ack.get("reason"),
                "at": ack.get("at"),
                "ended": how,
                "ended_at": iso_time(now),
            }
        )

    def _start_over(self) -> None:
        """What is applied changed (an apply, a rollback): bounds and drift records start over."""
        self.governor.reset(s.name for s in self.engine.subsystems)
        self._drift.forget()
        self._in_sync.clear()
        self._persist()

    def _recorded_failing(self) -> set[str]:
        """What a transaction recorded as failing (what a later write would carry)."""
        try:
            applied = self.state.applied()
        except (StateFileError, OSError, ValueError):  # damaged: reported elsewhere
            return set(self.engine.failing)
        return (
            set(self.engine.failing)
            | set(applied.get("failed") or {})
            | set(applied.get("carried") or {})
        )

    # -- operator writes ----------------------------------------------------
    @contextmanager
    def _applying_guard(self) -> Iterator[None]:
        # Marked at once, without waiting for a pass: the running heal yields to it.
        with self.engine.wanting():
            with self._applying_lock:
                self._applying += 1
            try:
                yield
            finally:
                with self._applying_lock:
                    self._applying -= 1

    def write(self, change: Change, confirm_within: float | None) -> dict[str, Any]:
        """Run an operator's change (apply or rollback), with confirm-or-rollback when asked.

        Passes wait while it runs (`_applying`), then one pass sees its result.
        """
        with self._applying_guard():
            self._changed()  # a transaction begins: shown upstream while it runs
            out = self.confirmation.write(change, confirm_within)
            with self._lock:
                self._refresh_view()
        self.wake()
        return out

    def confirm(
        self, *, actor: str = "api", version: int | None = None, reason: str | None = None
    ) -> dict[str, Any]:
        with self._lock:
            answer = self.confirmation.confirm(actor, version=version, reason=reason)
            self._refresh_view()
        return answer

    def note_confirmation_waiting(self, version: int, waiting_for: str) -> None:
        """What the agent's own confirmation of `version` still waits for (status, reports)."""
        with self._lock:
            if self.confirmation.note_waiting(version, waiting_for):
                self._refresh_view()

    def reconcile_now(self, subsystem: str | None, *, actor: str = "api") -> dict[str, Any]:
        """Explicit `trueup reconcile`: close breakers, forget flaps, heal now.

        Refused (`DamagedState`) while a state file it depends on is damaged:
        "nothing applied" would be a guess.
        """
        self.engine.refuse_if_damaged()
        names = [subsystem] if subsystem else [s.name for s in self.engine.subsystems]
        with self._lock:
            closed = [n for n in names if self.governor.of(n).breaker != "closed"]
            self.governor.reset(names)
            # Drift records stay: the heal below names itself on them, and they end
            # as the last drift ("healed … by trueup heal TXN"), not forgotten.
            for name in names:
                self._in_sync.pop(name, None)
            self.state.audit.append(
                "reconcile_requested", actor, subsystems=names, breakers_closed=closed
            )
            report = self.run_pass(force=names, actor=actor, lock_wait=5.0)
        applied_version = int(self.state.applied().get("version", 0))
        return report.reconcile_answer(names, applied_version, breakers_closed=closed)

    def acknowledge(
        self, subsystem: str, seconds: float, reason: str, *, actor: str = "api"
    ) -> dict[str, Any]:
        if seconds <= 0:
            return {"ok": False, "message": "--for must be a positive duration"}
        if subsystem == MANAGEMENT:
            return {
                "ok": False,
                "message": "management cannot be acknowledged: trueup always restores the "
                "management address and route (use `trueup management set` to change them)",
            }
        with self._lock:
            ack = self.governor.acknowledge(subsystem, self.clock(), seconds, reason, actor)
            self.state.audit.append(
                "acknowledged", actor, subsystem=subsystem, until=ack["until_at"], reason=reason
            )
            self._persist()
            self._refresh_view()
        self.wake()
        return {
            "ok": True,
            "subsystem": subsystem,
            "until": ack["until_at"],
            "message": f"{subsystem}: healing paused until {ack['until_at']} ({reason}); "
            "drift is still detected and reported",
        }

    def clear_acknowledgement(self, subsystem: str, *, actor: str = "api") -> dict[str, Any]:
        """Withdraw `subsystem`'s acknowledgement now (audited `ack_cleared`); healing resumes."""
        with self._lock:
            ack = self.governor.acks.pop(subsystem, None)
            if ack is None:
                return {
                    "ok": True,
                    "subsystem": subsystem,
                    "cleared": False,
                    "message": f"{subsystem}: no acknowledgement to withdraw",
                }
            self.governor.dirty = True
            self._ack_ended(subsystem, ack, "withdrawn", self.clock())
            self.state.audit.append(
                "ack_cleared",
                actor,
                subsystem=subsystem,
                until=ack["until_at"],
                reason=ack["reason"],
            )
            self._persist()
            self._refresh_view()
        self.wake()
        return {
            "ok": True,
            "subsystem": subsystem,
            "cleared": True,
            "message": f"{subsystem}: acknowledgement until {ack['until_at']} withdrawn; "
            "healing follows the policy again",
        }

    # -- reporting ----------------------------------------------------------
    def _persist(self) -> None:
        if not self.governor.dirty:
            return
        if any(d.file == RECONCILE_FILE for d in self.engine.check.blocking("heals")):
            return  # the damaged file stays as evidence until it is repaired
        try:
            self.state.write(RECONCILE_FILE, self.governor.to_json())
        except OSError as exc:  # a read-only or full state directory: kept in memory
            log.warning("%s: not saved: %s", RECONCILE_FILE, exc)
            return
        self.governor.dirty = False

    def _refresh_view(self) -> None:
        """Rebuild what status shows; read without locks by API threads."""
        self._view = replace(self._built_view(), ended_acks=[dict(a) for a in self._ended_acks])
        digest = self._view.operator_digest()
        if digest != self._shown_digest:
            self._shown_digest = digest
            self._changed()

    def _built_view(self) -> LoopView:
        return build_view(
            [s.name for s in self.engine.subsystems],
            document=self._document_cache[1],
            governor=self.governor,
            options=self.options,
            drift=self._drift,
            waiting=self._waiting,
            pending_confirmation=self.confirmation.summary(),
            confirmation=self.confirmation.record(),
            activity=self._activity(),
            now=self.clock(),
        )

    def _changed(self) -> None:
        for callback in self.on_change:
            try:
                callback()
            except Exception:  # a report that cannot be asked for must not stop the loop
                log.exception("a change of status not reported upstream")

    def _activity(self) -> LoopActivity:
        return LoopActivity(
            event_source=self.events.name if self.events else None,
            resync_seconds=self.options.resync_seconds,
            last_pass_at=self._last_pass_at,
            last_resync_at=self._last_resync_at,
            counters=dict(self.counters),
        )

    def view(self) -> LoopView:
        """What status and metrics show, with the counters as they are now."""
        view = self._view
        return replace(view, activity=replace(view.activity, counters=dict(self.counters)))

    def status_inputs(self) -> dict[str, Any]:
        """The view as one dict (`policies`, `reconcile_failures`, …, `extra`)."""
        return self.view().status_inputs()


def _pending(sub: Subsystem, net: Any, document: DeviceState) -> bool:
    """Whether `sub` says it waits (a link not there yet) although its facts agree."""
    try:
        condition = sub.condition(net, document)
    except Exception:  # a condition that cannot be read proves nothing
        return False
    return condition is not None and condition[0] == SubsystemHealth.PENDING
