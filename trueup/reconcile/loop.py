"""The reconcile loop: scheduling and passes — event-driven, level-based, bounded healing.

Who calls this: the agent (`trueup.agent.process.Agent.start_loop`, wired in
`trueup.agent.wiring`). Once it runs, the agent's requests
(`trueup.reconcile.requests`) come here: `write` (an apply or a rollback),
`confirm`, `reconcile_now`, `acknowledge`, `clear_acknowledgement`.

How a pass works (controller-runtime style: the event names nothing):

1. kernel notifications (`trueup.system.events`) and a periodic full resync
   (`resync_seconds`, default 60 s) only *wake* the loop;
2. every pass re-reads the system for every subsystem and diffs it against
   the applied document — detection never depends on the event's content and
   can never be switched off (`trueup.reconcile.driftwatch`);
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

The other parts, each in its own module: confirm-or-rollback
(`trueup.reconcile.confirmwait`), acknowledgements (`trueup.reconcile.acks`),
closing a transaction a storage fault left open
(`trueup.reconcile.interrupted`), the governor's file
(`trueup.reconcile.reconcilefile`), what status shows
(`trueup.reconcile.view`, read lock-free by API threads).

Why this module is over 400 lines: scheduling (the thread, waiting for
writers, drift proven between passes), the pass and the operator's requests
share one lock and the state it guards (what is applied, which subsystems
the start left unfinished, when to look again); each part here is the few
lines that take that lock and hand the work to the modules above.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from trueup.journal.atomic import StateFileError
from trueup.journal.lock import lock_holder
from trueup.model.document import DeviceState, DocumentError
from trueup.reconcile import reconcilefile
from trueup.reconcile.acks import AckAnswer, Acknowledgements
from trueup.reconcile.answers import ConfirmAnswer, WriteAnswer
from trueup.reconcile.changes import Change
from trueup.reconcile.confirmwait import ConfirmWait
from trueup.reconcile.driftbook import DetectedBy, DriftRecord
from trueup.reconcile.driftwatch import ACTOR, DriftWatch, Look
from trueup.reconcile.engine import Engine
from trueup.reconcile.engine.run import PREEMPTED
from trueup.reconcile.healer import Healer, PassReport
from trueup.reconcile.healing import Breaker, HealingOptions
from trueup.reconcile.interrupted import InterruptedCloser
from trueup.reconcile.reconcilefile import RECONCILE_FILE
from trueup.reconcile.view import Counters, LoopActivity, LoopView, Shown, StatusInputs, build_view
from trueup.subsystems.base import Difference, Scope
from trueup.subsystems.registry import scope_for
from trueup.system.events import EventSource, NetlinkEvent

__all__ = ["RECONCILE_FILE", "DriftRecord", "PassReport", "ReconcileLoop"]

log = logging.getLogger("trueup.reconcile")

RETRY_SOON = 0.1  # after a pass skipped for a writer, or a deferred rollback
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
        self.governor = reconcilefile.load(engine, self.options, rng)
        self.counters = Counters(
            passes=0, events=0, heals_ok=0, heals_failed=0, overflows=0, ticks=0
        )
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.drifts = DriftWatch(engine, self.governor, clock, self.options.attribution_window)
        self.acks = Acknowledgements(self.governor, self.state, clock)
        self._events_since_pass = 0
        self._applying = 0
        # Never the pass's lock: a write never waits on a pass.
        self._applying_lock = threading.Lock()
        self._waiting: dict[str, str] = {}  # subsystem → the dependency it waits on (last pass)
        # What the agent's start left unfinished (pending on a late link, or failed): healed
        # under every policy until a pass sees it in sync (`finish_start`).
        self._starting: set[str] = set()
        self._last_pass_at: float | None = None
        self._last_resync_at: float | None = None
        self._retry_soon = False
        self._tick_due = False
        self._retry_after: float | None = None
        self.closer = InterruptedCloser(engine)
        self._document_cache: tuple[Any, DeviceState | None] = (None, None)
        self.healer = Healer(engine, self.governor, clock, self.counters)
        self.healer.evidence = self.drifts.evidence
        self.healer.disturbance = self.drifts.disturbance
        # Called (without arguments, on the loop's thread) when a writer is found fighting
        # management: the agent sends a report to the control plane at once.
        self.on_fought: list[Callable[[], None]] = []
        # What API threads read; its `on_change` is called (under the loop's lock: it must
        # only signal) when what an operator sees of the loop changed, and when an
        # operator's write begins: the agent reports to the control plane.
        self.shown = Shown()
        self.on_change = self.shown.on_change
        self.confirmation = ConfirmWait(
            engine, clock=clock, lock=self._lock, on_converged=self._start_over
        )
        self._refresh_view()

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
        self.drifts.events.append(event)
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
            if self._events_since_pass and self.drifts.in_sync:
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
        the notifications since prove a change (`proven_change`,
        `DriftWatch.prove`): only a proof counts, never a guess, so the record
        is true when it is written — a change trueup made itself is never
        proven (the firewall's own loads delete and re-create the table, which
        proves nothing). Nothing is proven while a trueup transaction runs.
        The pass that follows observes, fills in the paths, heals per policy,
        and ends the record if the system is in sync again.
        """
        deadline: float | None = None
        while not self._stop.is_set():
            with self._lock:
                if self._applying or self.engine.active or lock_holder(self.state.root / "lock"):
                    return
                self._document()
                recorded, pending = self.drifts.prove(
                    self.engine.subsystems, self._document_cache[0]
                )
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
            applied.version,
            applied.txn,
            applied.digest,
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
        if not self.drifts.links_appeared(since_seq, scope):
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
        and bounds (an explicit `trueup reconcile`); `names` limits the pass to
        those subsystems (a periodic look).
        """
        with self._lock:
            report = PassReport()
            now = self.clock()
            triggered_by_events, since_seq = self._begin_pass(now, names)
            if self._writer_busy(force is not None):
                # Someone is writing: what we would see is half-applied. Look again soon.
                return self._skip(report, "a writer holds the device")
            self._close_interrupted(now)
            document = self._document()
            self._last_pass_at = now
            if not triggered_by_events and names is None:
                self._last_resync_at = now
            if document is None:
                self.drifts.forget()
                return self._skip(report, "nothing applied", retry=False)
            scope = scope_for(document)
            by_events = DetectedBy.EVENT if triggered_by_events else DetectedBy.RESYNC
            detected_by = DetectedBy.REQUEST if force else by_events
            look = Look(
                scope, names, now, detected_by, since_seq, bool(force), self._document_cache[0]
            )
            differences = self._observe(document, look, report, actor)
            if differences is None:
                return self._skip(report, "a writer is waiting")
            self._retry_for_new_links(since_seq, scope)
            self.drifts.pass_context = (scope, since_seq)
            self.drifts.heal_seq = self.drifts.events.last_seq
            retry_in = self.healer.heal(
                document,
                differences,
                self.drifts.book.current,
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
            if PREEMPTED in report.waiting.values():
                # Yielded to an operator's write, which may not wake the loop when done
                # (a restore through the agent): look again soon, not at the next resync.
                self._retry_soon = True
            self._persist()
            self._refresh_view()
            return report

    def _begin_pass(self, now: float, names: list[str] | None) -> tuple[bool, int]:
        """A pass's bookkeeping: whether notifications (not a resync) triggered it, and the
        last notification an earlier pass saw."""
        self.counters["passes"] += 1
        triggered_by_events = self._events_since_pass > 0 and names is None
        self._events_since_pass = 0
        drifts = self.drifts
        since_seq, drifts.pass_from_seq = drifts.pass_from_seq, drifts.events.last_seq
        self._retry_soon = False
        self._retry_after = None
        self.acks.expire(now)
        self.drifts.expire_contested(now, self.options.flap_window)
        if not self._applying and self.confirmation.check(now):
            self._retry_soon = True
        return triggered_by_events, since_seq

    def _writer_busy(self, forced: bool) -> bool:
        """Whether a writer holds or wants the device (a forced pass waits only for ours)."""
        if self._applying:
            return True
        if forced:
            return False
        return self.engine.writer_wanted() or bool(lock_holder(self.state.root / "lock"))

    def _skip(self, report: PassReport, why: str, *, retry: bool = True) -> PassReport:
        if retry:
            self._retry_soon = True
        report.skipped = why
        self._refresh_view()
        return report

    def _observe(
        self, document: DeviceState, look: Look, report: PassReport, actor: str
    ) -> dict[str, list[Difference]] | None:
        """Observe and diff each subsystem, recording drift; None when a writer came first."""
        failing = self._recorded_failing()
        seen = self.drifts.look(document, look, report, self._starting | failing)
        if seen is None:
            return None
        if seen.fought:
            self._fought()
        for name in seen.settled:
            if name in self._starting:
                self._starting.discard(name)
                log.info("%s: at the committed revision since the start", name)
        recovered = [name for name in seen.settled if name in failing]
        if recovered:
            # Failing no more although nothing healed it (a daemon restarted by its
            # supervisor): a later write must not carry the old failure.
            settled = self.engine.settle_in_sync(recovered, actor)
            if settled:
                log.info("%s: in sync again, its recorded failure cleared", ", ".join(settled))
        return seen.differences

    def _close_interrupted(self, now: float) -> None:
        """A transaction a storage fault left open: closed once the directory takes writes."""
        closing = self.closer.close(now)
        if closing.retry_soon:
            self._retry_soon = True
        if closing.retry_at is not None:
            self._retry_after = closing.retry_at
        if closing.closed:
            self._start_over()

    def _fought(self) -> None:
        """A writer fights management: reported upstream at once, not at the heartbeat."""
        for callback in self.on_fought:
            try:
                callback()
            except Exception:  # a report that cannot go out must not stop the pass
                log.exception("management fight not reported upstream")

    def _start_over(self) -> None:
        """What is applied changed (an apply, a rollback): bounds and drift records start over."""
        self.governor.reset(s.name for s in self.engine.subsystems)
        self.drifts.forget()
        self._persist()

    def _recorded_failing(self) -> set[str]:
        """What a transaction recorded as failing (what a later write would carry)."""
        try:
            applied = self.state.applied()
        except (StateFileError, OSError, ValueError):  # damaged: reported elsewhere
            return set(self.engine.failing)
        return set(self.engine.failing) | set(applied.failed) | set(applied.carried)

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

    def write(self, change: Change, confirm_within: float | None) -> WriteAnswer:
        """Run an operator's change (apply or rollback), with confirm-or-rollback when asked.

        Passes wait while it runs (`_applying`), then one pass sees its result.
        """
        with self._applying_guard():
            self.shown.changed()  # a transaction begins: shown upstream while it runs
            out = self.confirmation.write(change, confirm_within)
            with self._lock:
                self._refresh_view()
        self.wake()
        return out

    def confirm(
        self, *, actor: str = "api", version: int | None = None, reason: str | None = None
    ) -> ConfirmAnswer:
        with self._lock:
            answer = self.confirmation.confirm(actor, version=version, reason=reason)
            self._refresh_view()
        return answer

    def note_confirmation_waiting(self, version: int, waiting_for: str) -> None:
        """What the agent's own confirmation of `version` still waits for (status, reports)."""
        with self._lock:
            if self.confirmation.note_waiting(version, waiting_for):
                self._refresh_view()

    def reconcile_now(self, subsystem: str | None, *, actor: str = "api") -> WriteAnswer:
        """Explicit `trueup reconcile`: close breakers, forget flaps, heal now.

        Refused (`DamagedState`) while a state file it depends on is damaged:
        "nothing applied" would be a guess.
        """
        self.engine.refuse_if_damaged()
        names = [subsystem] if subsystem else [s.name for s in self.engine.subsystems]
        with self._lock:
            closed = [n for n in names if self.governor.of(n).breaker != Breaker.CLOSED]
            self.governor.reset(names)
            # Drift records stay: the heal below names itself on them, and they end
            # as the last drift ("healed … by trueup heal TXN"), not forgotten.
            for name in names:
                self.drifts.in_sync.pop(name, None)
            self.state.audit.append(
                "reconcile_requested", actor, subsystems=names, breakers_closed=closed
            )
            report = self.run_pass(force=names, actor=actor, lock_wait=5.0)
        applied_version = self.state.applied().version
        return report.reconcile_answer(names, applied_version, breakers_closed=closed)

    def acknowledge(
        self, subsystem: str, seconds: float, reason: str, *, actor: str = "api"
    ) -> AckAnswer:
        """`trueup ack`: pause `subsystem`'s healing, never its detection, for `seconds`."""
        refused = self.acks.refusal(subsystem, seconds)
        if refused is not None:
            return refused
        with self._lock:
            answer = self.acks.give(subsystem, seconds, reason, actor)
            self._persist()
            self._refresh_view()
        self.wake()
        return answer

    def clear_acknowledgement(self, subsystem: str, *, actor: str = "api") -> AckAnswer:
        """Withdraw `subsystem`'s acknowledgement now (audited `ack_cleared`); healing resumes."""
        with self._lock:
            answer = self.acks.withdraw(subsystem, actor)
            if not answer.get("cleared"):
                return answer
            self._persist()
            self._refresh_view()
        self.wake()
        return answer

    # -- reporting ----------------------------------------------------------
    def _persist(self) -> None:
        reconcilefile.save(self.engine, self.governor)

    def _refresh_view(self) -> None:
        """Rebuild what status shows; read without locks by API threads."""
        self.shown.show(replace(self._built_view(), ended_acks=self.acks.ended_json()))

    def _built_view(self) -> LoopView:
        return build_view(
            [s.name for s in self.engine.subsystems],
            document=self._document_cache[1],
            governor=self.governor,
            options=self.options,
            drift=self.drifts.book,
            waiting=self._waiting,
            pending_confirmation=self.confirmation.summary(),
            confirmation=self.confirmation.record(),
            activity=self._activity(),
            now=self.clock(),
        )

    def _activity(self) -> LoopActivity:
        return LoopActivity(
            event_source=self.events.name if self.events else None,
            resync_seconds=self.options.resync_seconds,
            last_pass_at=self._last_pass_at,
            last_resync_at=self._last_resync_at,
            counters=self.counters.copy(),
        )

    def view(self) -> LoopView:
        """What status and metrics show, with the counters as they are now."""
        return self.shown.now(self.counters)

    def status_inputs(self) -> StatusInputs:
        """The view as one dict (`policies`, `reconcile_failures`, …, `extra`)."""
        return self.view().status_inputs()
