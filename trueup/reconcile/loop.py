"""The reconcile loop: event-driven, level-based observation and bounded healing.

Who calls this: the agent (`trueup.agent.process.Agent.start_loop`, wired in
`trueup.agent.wiring`). The agent delegates `apply`, `confirm`, `reconcile`,
`ack`, status inputs and metrics here once the loop runs.

How a pass works (controller-runtime style: the event names nothing):

1. netlink notifications (`trueup.system.events`) and a periodic full resync
   (`resync_seconds`, default 60 s) only *wake* the loop;
2. every pass re-reads the kernel for every subsystem and diffs it against
   the applied document — detection never depends on the event's content and
   can never be switched off;
3. each subsystem with drift gets a drift record (since, paths, attribution
   from the netlink messages that arrived around it) and flap bookkeeping;
4. healing runs per subsystem only when its policy is `auto`, no
   acknowledgement holds it, its breaker is closed (or half-open), its
   back-off has passed and its retry budget allows; contested paths are left
   as they are. A heal is one journaled `reconcile` transaction under the
   writer lock, audited.

Confirm-or-rollback (`apply --confirm-within`) keeps its timer here too; the
pending record lives in the journal layer (`trueup.journal.confirm`) so a
restart finds it (see `trueup.reconcile.confirm.settle_at_startup`).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from trueup.journal.confirm import clear_pending, read_pending, write_pending
from trueup.journal.lock import lock_holder
from trueup.model.document import DeviceState, DocumentError
from trueup.reconcile.confirm import decide, roll_back_unconfirmed
from trueup.reconcile.healing import Governor, HealingOptions
from trueup.reconcile.transaction import (
    ApplyResult,
    Change,
    Engine,
    NeedsConfirmation,
    Origin,
    Refused,
    StorageError,
)
from trueup.subsystems.base import Difference, Scope
from trueup.subsystems.registry import scope_for
from trueup.system.events import EventSource, NetlinkEvent, iso_time

__all__ = ["RECONCILE_FILE", "DriftRecord", "PassReport", "ReconcileLoop"]

log = logging.getLogger("trueup.reconcile")

RECONCILE_FILE = "reconcile.json"
ACTOR = "reconciler"
_MAX_ATTRIBUTION = 20
# Which kinds of kernel notification can explain drift in which subsystem.
_EVENT_KINDS = {
    "management": {"link", "address", "route"},
    "links": {"link"},
    "addresses": {"address", "link"},
    "routes": {"route", "link", "address"},
}
_ALL_KINDS = {"link", "address", "route"}


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


@dataclass
class PassReport:
    """What one pass saw and did; `reconcile_now` turns it into the API's answer."""

    drift: dict[str, list[str]] = field(default_factory=dict)
    healed: dict[str, list[str]] = field(default_factory=dict)  # subsystem → step descriptions
    failed: dict[str, str] = field(default_factory=dict)
    held: dict[str, str] = field(default_factory=dict)  # subsystem → why not healed
    waiting: dict[str, str] = field(default_factory=dict)  # subsystem → the dependency it awaits
    txns: list[str] = field(default_factory=list)
    skipped: str | None = None


def _identifiers(diffs: list[Difference], scope: Scope) -> set[str]:
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
        self.governor.load(self.state.read(RECONCILE_FILE, {}))
        self._pending = read_pending(self.state)
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._recent: deque[tuple[int, NetlinkEvent]] = deque(maxlen=512)
        self._event_seq = 0
        self._pass_from_seq = 0  # events up to this one were seen by an earlier pass
        self._events_since_pass = 0
        self._applying = 0
        self._drift: dict[str, DriftRecord] = {}
        self._last_drift: dict[str, dict[str, Any]] = {}
        self._last_pass_at: float | None = None
        self._last_resync_at: float | None = None
        self._retry_soon = False
        self._retry_after: float | None = None
        self._waiting: dict[str, str] = {}  # subsystem → the dependency it waits on (last pass)
        self.counters: dict[str, int] = {
            "passes": 0,
            "events": 0,
            "heals_ok": 0,
            "heals_failed": 0,
            "overflows": 0,
        }
        self._view: dict[str, Any] = {}
        self._document_cache: tuple[Any, DeviceState | None] = (None, None)
        self._refresh_view()

    @classmethod
    def from_env(cls, engine: Engine) -> ReconcileLoop:
        """The agent's loop: kernel events, options from `TRUEUP_*` variables."""
        from trueup.system.events import KernelEventSource

        return cls(engine, options=HealingOptions.from_env(), events=KernelEventSource())

    # -- lifecycle ----------------------------------------------------------
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
        self._event_seq += 1  # only the event thread writes it
        self._recent.append((self._event_seq, event))
        self.counters["events"] += 1
        if event.kind == "overflow":
            self.counters["overflows"] += 1
        self._events_since_pass += 1
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._timeout())
            self._wake.clear()
            if self._stop.is_set():
                return
            self._await_writers()
            try:
                self.run_pass()
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
            if self._applying or self.engine.active:
                self.engine.idle.wait(1.0)
                with self._lock:
                    pass  # an API apply finishes its bookkeeping under the lock
                continue
            if lock_holder(self.state.root / "lock"):
                # Another process writes (a CLI apply without the agent): poll gently.
                self._stop.wait(delay)
                delay = min(1.0, delay * 2)
                continue
            return

    def _timeout(self) -> float:
        now = self.clock()
        last = self._last_pass_at if self._last_pass_at is not None else now - 1e9
        moments = [last + self.options.resync_seconds]
        due = self.governor.next_due(now)
        if due is not None:
            moments.append(due)
        if self._pending is not None and self._pending.get("state") == "pending":
            moments.append(float(self._pending["deadline"]))
        if self._retry_soon:
            moments.append(now + 0.1)
        if self._retry_after is not None:
            moments.append(self._retry_after)
        return max(0.0, min(self.options.resync_seconds, min(moments) - now)) + 0.001

    # -- the pass -----------------------------------------------------------
    def _document(self) -> DeviceState | None:
        applied = self.state.applied()
        key = (applied.get("version"), applied.get("txn"), applied.get("digest"))
        if self._document_cache[0] != key:
            try:
                self._document_cache = (key, self.engine.applied_document())
            except DocumentError:
                log.exception("applied revision unreadable; nothing to reconcile against")
                self._document_cache = (key, None)
        return self._document_cache[1]

    def run_pass(
        self, *, force: list[str] | None = None, actor: str = ACTOR, lock_wait: float = 0.0
    ) -> PassReport:
        """Observe everything, record drift, heal what policy and bounds allow.

        `force` names subsystems to heal regardless of policy, acknowledgement
        and bounds (an explicit `trueup reconcile`).
        """
        with self._lock:
            report = PassReport()
            now = self.clock()
            self.counters["passes"] += 1
            triggered_by_events = self._events_since_pass > 0
            self._events_since_pass = 0
            since_seq, self._pass_from_seq = self._pass_from_seq, self._event_seq
            self._retry_soon = False
            self._retry_after = None
            self._expire_acks(now)
            self._check_confirmation(now)
            if self._applying or (force is None and lock_holder(self.state.root / "lock")):
                # Someone is writing: what we would see is half-applied. Look again soon.
                self._retry_soon = True
                report.skipped = "a writer holds the device"
                self._refresh_view()
                return report
            document = self._document()
            self._last_pass_at = now
            if not triggered_by_events:
                self._last_resync_at = now
            if document is None:
                self._drift.clear()
                self._refresh_view()
                report.skipped = "nothing applied"
                return report
            scope = scope_for(document)
            detected_by = "request" if force else ("event" if triggered_by_events else "resync")
            with self.engine.netlink() as net:
                differences: dict[str, list[Difference]] = {}
                for sub in self.engine.subsystems:
                    desired = sub.desired(document, scope)
                    observed = sub.observe(net, scope)
                    differences[sub.name] = sub.diff(desired, observed)
                    self._record_drift(
                        sub.name, differences[sub.name], scope, now, detected_by, since_seq
                    )
                    report.drift[sub.name] = [d.path for d in differences[sub.name]]
            self._heal(document, differences, report, actor, lock_wait, force or [])
            self._waiting = dict(report.waiting)
            self._persist()
            self._refresh_view()
            return report

    def _held(self, name: str, document: DeviceState, now: float, forced: bool) -> str | None:
        if forced:
            return None
        policy = document.spec.convergence.policy_for(name)
        if policy != "auto":
            return f"policy {policy}: drift is reported, not healed"
        return self.governor.blocked(name, now)

    def _writers(
        self, name: str, diffs: list[Difference], scope: Scope, since_seq: int
    ) -> dict[str, str]:
        """Paths that a notification from a writer other than the kernel touched since `since_seq`."""
        kinds = _EVENT_KINDS.get(name, _ALL_KINDS)
        events = [
            e
            for seq, e in list(self._recent)
            if seq > since_seq and e.kind in kinds and e.sender_port
        ]
        out: dict[str, str] = {}
        for diff in diffs:
            wanted = _identifiers([diff], scope)
            for event in events:
                subjects = {event.ifname, event.destination, event.address}
                if wanted & subjects:
                    who = event.sender or f"netlink port {event.sender_port}"
                    out[diff.path] = f"{event.message} from {who} (port {event.sender_port})"
        return out

    def _record_drift(
        self,
        name: str,
        diffs: list[Difference],
        scope: Scope,
        now: float,
        detected_by: str,
        since_seq: int,
    ) -> None:
        differing = {d.path: d.observed for d in diffs}
        written = self._writers(name, diffs, scope, since_seq)
        for path, contested in self.governor.observe(name, differing, now, written):
            log.warning("%s: %s", name, contested["reason"])
            self.state.audit.append(
                "contested",
                ACTOR,
                subsystem=name,
                path=path,
                **{k: v for k, v in contested.items() if k != "value"},
            )
        record = self._drift.get(name)
        if not diffs:
            # In sync again, whoever fixed it: failures against it are over.
            self.governor.record_resolved(name)
            if record is not None:
                self._last_drift[name] = {**record.to_json(), "ended_at": iso_time(now)}
                del self._drift[name]
            return
        if record is None:
            # Stamped after this subsystem's observation: when the drift was known.
            record = DriftRecord(since=self.clock(), paths=[], detected_by=detected_by)
            self._drift[name] = record
        record.paths = [d.path for d in diffs]
        self._attribute(name, record, diffs, scope, now)

    def _attribute(
        self, name: str, record: DriftRecord, diffs: list[Difference], scope: Scope, now: float
    ) -> None:
        """Attach the kernel's notifications that explain this drift (kind and object match)."""
        kinds = _EVENT_KINDS.get(name, _ALL_KINDS)
        wanted = _identifiers(diffs, scope)
        horizon = record.since - self.options.attribution_window
        newest = record.seen_events
        related: list[dict[str, Any]] = []
        for seq, event in list(self._recent):
            if seq <= record.seen_events:
                continue
            newest = max(newest, seq)
            if event.kind not in kinds or event.received_at < horizon:
                continue
            subjects = {event.ifname, event.destination, event.address}
            if wanted & subjects or (event.address and event.address.split("/")[0] in wanted):
                record.attribution.append(event.to_json())
            else:
                related.append({**event.to_json(), "match": "related"})
        record.seen_events = newest
        if not record.attribution and related:
            # The kernel flushes routes (and IPv6 addresses) without a notification
            # of their own when their address or link goes: show what did arrive.
            record.attribution.extend(related[-5:])
        if not record.attribution:
            record.attribution.append(
                {
                    "message": None,
                    "source": record.detected_by,
                    "detail": "no netlink notification arrived for it; found by "
                    + ("a full resync" if record.detected_by == "resync" else "observation"),
                    "received_at": iso_time(record.since),
                }
            )
        del record.attribution[:-_MAX_ATTRIBUTION]

    def _heal(
        self,
        document: DeviceState,
        differences: dict[str, list[Difference]],
        report: PassReport,
        actor: str,
        lock_wait: float,
        force: list[str],
    ) -> None:
        """Heal what policy, bounds and dependencies allow, as one `reconcile` transaction.

        A subsystem whose dependency differs and is not being healed (policy,
        acknowledgement, breaker, contested paths) waits: it is reported as
        `waiting on DEPENDENCY`, and its breaker does not count it.
        """
        now = self.clock()
        healable: list[str] = []
        unsettled: dict[str, str] = {}  # differs and will not be healed now → why
        contested: dict[str, frozenset[str]] = {}
        for sub in self.engine.subsystems:
            name = sub.name
            diffs = differences[name]
            if not diffs:
                continue
            forced = name in force
            paths = ", ".join(d.path for d in diffs[:3]) + (" …" if len(diffs) > 3 else "")
            held = self._held(name, document, now, forced)
            if held is not None:
                report.held[name] = held
                unsettled[name] = f"{held} ({paths})"
                continue
            blocker = next((d for d in sub.depends_on if d in unsettled), None)
            if blocker is not None and not forced:
                why = f"waiting on {blocker}: {unsettled[blocker]}"
                report.held[name] = report.waiting[name] = why
                unsettled[name] = why
                continue
            pinned = frozenset() if forced else frozenset(self.governor.contested(name))
            contested[name] = pinned
            differing_contested = pinned & {d.path for d in diffs}
            if differing_contested:
                unsettled[name] = "contested: " + ", ".join(sorted(differing_contested))
                if differing_contested == {d.path for d in diffs}:
                    report.held[name] = "only contested paths differ: " + ", ".join(
                        sorted(differing_contested)
                    )
                    continue
            healable.append(name)
        if not healable:
            return
        attempted: list[str] = []

        def audit_lines(
            txn: str,
            failed: dict[str, str],
            waiting: dict[str, str],
            healed: dict[str, list[str]],
        ) -> list[tuple[str, dict[str, Any]]]:
            return self._heal_outcome(
                txn, document, differences, failed, waiting, healed, attempted, actor
            )

        change = Change(
            document,
            kind="reconcile",
            origin="reconcile",
            actor=actor,
            mode="best-effort",
            only=frozenset(healable),
            contested=contested,
            lock_wait=lock_wait,
            audit=audit_lines,
        )
        try:
            result = self.engine.transact(change)
        except Refused as exc:
            self._retry_soon = True
            for name in healable:
                report.held[name] = f"deferred: {exc}"
            return
        except StorageError as exc:
            # Not the subsystem's failure: the state directory is full or read-only.
            log.warning("heal deferred: %s", exc)
            self._retry_after = self.clock() + 2.0
            for name in healable:
                report.held[name] = f"deferred: {exc}"
            return
        if result.txn:
            report.txns.append(result.txn)
        for name in healable:
            if name in result.failed:
                report.failed[name] = result.failed[name]
            elif name in result.waiting:
                report.held[name] = report.waiting[name] = result.waiting[name]
            elif name in result.healed:
                report.healed[name] = result.healed[name]

    def _heal_outcome(
        self,
        txn: str,
        document: DeviceState,
        differences: dict[str, list[Difference]],
        failed: dict[str, str],
        waiting: dict[str, str],
        healed: dict[str, list[str]],
        attempted: list[str],
        actor: str,
    ) -> list[tuple[str, dict[str, Any]]]:
        """Governor bookkeeping for a heal's outcome, and its audit lines (written with the commit)."""
        del document
        now = self.clock()
        version = int(self.state.applied().get("version", 0))
        lines: list[tuple[str, dict[str, Any]]] = []
        for name in [*healed, *failed]:
            if name in attempted or name in waiting:
                continue
            attempted.append(name)
            paths = sorted({d.path for d in differences.get(name, [])})
            self.governor.record_attempt(name, now)
            if name in failed:
                error = failed[name]
                opened = self.governor.record_failure(name, now, error, paths)
                self.counters["heals_failed"] += 1
                heal = self.governor.of(name)
                lines.append(
                    (
                        "reconcile",
                        {
                            "subsystem": name,
                            "outcome": "failed",
                            "error": error,
                            "paths": paths,
                            "txn": txn,
                            "version": version,
                            "breaker": heal.breaker,
                            "failures": heal.failures,
                            "backoff_seconds": heal.backoff_seconds,
                        },
                    )
                )
                if opened:
                    lines.append(
                        (
                            "breaker_opened",
                            {"subsystem": name, "failures": heal.failures, "last_error": error},
                        )
                    )
                log.warning("heal of %s failed: %s", name, error)
                continue
            self.governor.record_success(name, now)
            self.counters["heals_ok"] += 1
            record = self._drift.get(name)
            lines.append(
                (
                    "reconcile",
                    {
                        "subsystem": name,
                        "outcome": "healed",
                        "paths": paths,
                        "steps": healed[name],
                        "txn": txn,
                        "version": version,
                        "attribution": record.attribution[-3:] if record else [],
                    },
                )
            )
        for name, why in waiting.items():
            lines.append(
                ("reconcile", {"subsystem": name, "outcome": "waiting", "why": why, "txn": txn})
            )
        del actor
        return lines

    # -- acknowledgements and confirmations --------------------------------
    def _expire_acks(self, now: float) -> None:
        for name, ack in self.governor.expire_acks(now):
            self.state.audit.append(
                "ack_expired", ACTOR, subsystem=name, until=ack["until_at"], reason=ack["reason"]
            )

    def _check_confirmation(self, now: float) -> None:
        pending = self._pending
        if pending is None or self._applying:
            return
        applied_version = int(self.state.applied().get("version", 0))
        decision = decide(pending, applied_version, now)
        if decision in ("stale", "superseded"):
            clear_pending(self.state, decision, applied_version=applied_version)
            self._pending = None
        elif decision == "expired":
            try:
                result = roll_back_unconfirmed(self.engine, pending, actor="confirm-timeout")
            except Refused:
                self._retry_soon = True
                return
            except Exception:
                log.exception("rolling back an unconfirmed version failed")
                self._retry_soon = True
                return
            if result.ok:
                self._pending = None
                self.governor.reset(s.name for s in self.engine.subsystems)
                self._drift.clear()
                log.warning(
                    "confirmation of version %s missed; rolled back to revision %s (version %s)",
                    pending.get("version"),
                    pending.get("confirmed_version"),
                    result.version,
                )
            else:
                log.error("rollback of unconfirmed version failed: %s", result.failed)
                self._retry_soon = True

    @contextmanager
    def _applying_guard(self) -> Iterator[None]:
        with self._lock:
            self._applying += 1
        try:
            yield
        finally:
            with self._lock:
                self._applying -= 1

    def apply(
        self,
        document: DeviceState,
        *,
        mode: str = "atomic",
        expect_version: int | None = None,
        actor: str = "api",
        confirm_within: float | None = None,
        origin: Origin = "local-cli",
        override: str | None = None,
    ) -> dict[str, Any]:
        """Apply through the engine; guard it with a pending confirmation when asked."""
        change = Change(
            document,
            kind="apply",
            origin=origin,
            actor=actor,
            mode="best-effort" if mode == "best-effort" else "atomic",
            expect_version=expect_version,
            override=override,
        )
        return self.write(change, confirm_within)

    def rollback(
        self,
        to: int | None,
        *,
        expect_version: int | None = None,
        actor: str = "api",
        confirm_within: float | None = None,
        override: str | None = None,
    ) -> dict[str, Any]:
        """`trueup rollback`: an earlier revision as a new version, guarded like an apply."""
        applied_version = int(self.state.applied().get("version", 0))
        target, document = self.engine.revision_document(to)
        change = Change(
            document,
            kind="rollback",
            origin="rollback",
            actor=actor,
            expect_version=applied_version if expect_version is None else expect_version,
            new_version=True,
            override=override,
            source=f"revision {target}",
        )
        return self.write(change, confirm_within)

    def _refusal(self, actor: str, message: str) -> dict[str, Any]:
        return {
            "ok": False,
            "version": int(self.state.applied().get("version", 0)),
            "outcome": "refused",
            "txn": None,
            "steps": [],
            "failed": {"management": message},
            "rollback_errors": [],
            "message": message,
        }

    def write(self, change: Change, confirm_within: float | None) -> dict[str, Any]:
        """Run an operator's change (apply or rollback), with confirm-or-rollback when asked."""
        state = self.state
        actor = change.actor
        applied_version = int(state.applied().get("version", 0))
        refusal: str | None = None
        if confirm_within is not None and confirm_within <= 0:
            refusal = "--confirm-within must be a positive number of seconds"
        pending_before = self._pending
        confirmed_version = (
            int(pending_before["confirmed_version"]) if pending_before else applied_version
        )
        if refusal is None and confirm_within is not None and confirmed_version == 0:
            refusal = (
                "--confirm-within needs a confirmed version to return to; apply a first "
                "version without it"
            )
        if refusal is not None:
            state.audit.append("apply_refused", actor, message=refusal)
            return self._refusal(actor, refusal)
        change = replace(change, management_confirmed=confirm_within is not None, lock_wait=5.0)
        with self._applying_guard():
            pending: dict[str, Any] | None = None
            if confirm_within is not None:
                now = self.clock()
                pending = {
                    "state": "applying",
                    "version": None,
                    "confirmed_version": confirmed_version,
                    "deadline": now + confirm_within,
                    "deadline_at": iso_time(now + confirm_within),
                    "actor": actor,
                    "created_at": iso_time(now),
                }
                write_pending(state, pending)  # before the apply: a crash mid-way still rolls back
                self._pending = pending
            try:
                result: ApplyResult = self.engine.transact(change)
            except NeedsConfirmation as exc:
                return self._refusal(actor, str(exc))
            except Exception:
                if pending is not None:
                    self._restore_pending(pending_before)
                raise
            out = result.to_json()
            changed = result.outcome in ("committed", "partial")
            with self._lock:
                if pending is not None:
                    if changed and result.version != confirmed_version:
                        pending.update(state="pending", version=result.version, txn=result.txn)
                        write_pending(state, pending)
                        self._pending = pending
                        state.audit.append(
                            "confirm_pending",
                            actor,
                            version=result.version,
                            deadline=pending["deadline_at"],
                            rollback_to=confirmed_version,
                        )
                    else:
                        self._restore_pending(pending_before)
                elif pending_before is not None and changed:
                    # A plain apply on top of an unconfirmed one confirms it (commit semantics).
                    clear_pending(state, "confirmed", by="apply", version=result.version)
                    state.audit.append(
                        "confirmed", actor, version=result.version, via="apply without a deadline"
                    )
                    self._pending = None
                if self._pending is not None and self._pending.get("state") == "pending":
                    out["pending_confirmation"] = {
                        "version": self._pending["version"],
                        "deadline": self._pending["deadline_at"],
                    }
                if changed:
                    self.governor.reset(s.name for s in self.engine.subsystems)
                    self._drift.clear()
                    self._persist()
                self._refresh_view()
        self.wake()
        return out

    def _restore_pending(self, previous: dict[str, Any] | None) -> None:
        if previous is None:
            clear_pending(self.state, "apply_not_changed")
        else:
            write_pending(self.state, previous)
        self._pending = previous

    def confirm(self, *, actor: str = "api") -> dict[str, Any]:
        with self._lock:
            pending = self._pending
            if pending is None or pending.get("state") != "pending":
                return {
                    "ok": False,
                    "message": "nothing to confirm: no apply with --confirm-within is pending",
                }
            now = self.clock()
            if now >= float(pending["deadline"]):
                self._check_confirmation(now)
                return {
                    "ok": False,
                    "message": f"too late: the deadline {pending['deadline_at']} passed; "
                    f"version {pending['version']} was rolled back to revision "
                    f"{pending['confirmed_version']}",
                }
            clear_pending(self.state, "confirmed", by=actor)
            self.state.audit.append(
                "confirmed", actor, version=pending["version"], deadline=pending["deadline_at"]
            )
            self._pending = None
            self._refresh_view()
            return {
                "ok": True,
                "version": pending["version"],
                "message": f"version {pending['version']} confirmed; it stays applied",
            }

    def reconcile_now(self, subsystem: str | None, *, actor: str = "api") -> dict[str, Any]:
        """Explicit `trueup reconcile`: close breakers, forget flaps, heal now."""
        names = [subsystem] if subsystem else [s.name for s in self.engine.subsystems]
        with self._lock:
            closed = [n for n in names if self.governor.of(n).breaker != "closed"]
            self.governor.reset(names)
            for name in names:
                self._drift.pop(name, None)
            self.state.audit.append(
                "reconcile_requested", actor, subsystems=names, breakers_closed=closed
            )
            report = self.run_pass(force=names, actor=actor, lock_wait=5.0)
        applied_version = int(self.state.applied().get("version", 0))
        if report.skipped == "nothing applied":
            return {"ok": True, "version": 0, "outcome": "nothing applied", "steps": []}
        deferred = {n: why for n, why in report.held.items() if n in names}
        failed = {**report.failed, **deferred}
        return {
            "ok": not failed,
            "version": applied_version,
            "outcome": "failed" if failed else ("reconciled" if report.healed else "in sync"),
            "txn": report.txns[-1] if report.txns else None,
            "steps": [s for steps in report.healed.values() for s in steps],
            "failed": failed,
            "rollback_errors": [],
            "breakers_closed": closed,
        }

    def acknowledge(
        self, subsystem: str, seconds: float, reason: str, *, actor: str = "api"
    ) -> dict[str, Any]:
        if seconds <= 0:
            return {"ok": False, "message": "--for must be a positive duration"}
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

    # -- reporting ----------------------------------------------------------
    def _persist(self) -> None:
        if self.governor.dirty:
            self.state.write(RECONCILE_FILE, self.governor.to_json())
            self.governor.dirty = False

    def _refresh_view(self) -> None:
        """Rebuild what status shows; read without locks by API threads."""
        now = self.clock()
        document = self._document_cache[1]
        failures: dict[str, dict[str, Any]] = {}
        policies: dict[str, dict[str, Any]] = {}
        for sub in self.engine.subsystems:
            name = sub.name
            heal = self.governor.of(name)
            ack = self.governor.acks.get(name)
            policy = document.spec.convergence.policy_for(name) if document else None
            blocked = None
            if policy == "auto" and name in self._drift:
                blocked = self.governor.blocked(name, now) or self._waiting.get(name)
            entry: dict[str, Any] = {
                "policy": policy,
                "healing": "notify: detection only"
                if policy == "notify"
                else (blocked or "active"),
                "breaker": heal.breaker,
                "consecutive_failures": heal.failures,
                "backoff_seconds": heal.backoff_seconds,
                "next_attempt_at": iso_time(heal.next_attempt_at) if heal.next_attempt_at else None,
                "retry_budget": {
                    "used": len([t for t in heal.attempts if t > now - self.options.retry_window]),
                    "limit": self.options.retry_budget,
                    "window_seconds": self.options.retry_window,
                },
                "contested": sorted(heal.contested),
                "contested_detail": heal.contested,
                "acknowledged_until": ack["until_at"] if ack else None,
                "acknowledgement": ack,
                "last_heal_at": iso_time(heal.last_heal_at) if heal.last_heal_at else None,
            }
            record = self._drift.get(name)
            if record is not None:
                entry["drift"] = record.to_json()
            if name in self._last_drift:
                entry["last_drift"] = self._last_drift[name]
            if heal.contested and not heal.failures and heal.breaker == "closed":
                entry["reason"] = "; ".join(c["reason"] for c in heal.contested.values())
            if name in self._waiting and name in self._drift:
                entry["waiting"] = self._waiting[name]
                entry.setdefault("reason", self._waiting[name])
            policies[name] = entry
            if heal.failures or heal.breaker != "closed":
                failures[name] = {
                    "detail": f"{heal.failures} consecutive heal failure(s); breaker "
                    f"{heal.breaker}: {heal.last_error}",
                    "since": iso_time(heal.failing_since) if heal.failing_since else None,
                    "paths": heal.failing_paths,
                    "breaker": heal.breaker,
                    "failures": heal.failures,
                    "backoff_seconds": heal.backoff_seconds,
                    "next_attempt_at": entry["next_attempt_at"],
                    "open_until": iso_time(heal.open_until) if heal.open_until else None,
                }
        pending = self._pending
        self._view = {
            "reconcile_failures": failures,
            "drift_since": {n: iso_time(r.since) for n, r in self._drift.items()},
            "attribution": {n: list(r.attribution) for n, r in self._drift.items()},
            "policies": policies,
            "extra": {
                "pending_confirmation": {
                    "version": pending["version"],
                    "deadline": pending["deadline_at"],
                    "rollback_to": pending["confirmed_version"],
                }
                if pending is not None and pending.get("state") == "pending"
                else None,
                "reconcile_loop": {
                    "event_source": self.events.name if self.events else None,
                    "resync_seconds": self.options.resync_seconds,
                    "last_pass_at": iso_time(self._last_pass_at) if self._last_pass_at else None,
                    "last_resync_at": iso_time(self._last_resync_at)
                    if self._last_resync_at
                    else None,
                    **self.counters,
                },
            },
        }

    def status_inputs(self) -> dict[str, Any]:
        return dict(self._view)

    def metrics_lines(self) -> list[str]:
        view = self._view
        c = self.counters
        lines = [
            "# HELP trueup_reconcile_passes_total Reconcile passes run.",
            "# TYPE trueup_reconcile_passes_total counter",
            f"trueup_reconcile_passes_total {c['passes']}",
            "# HELP trueup_netlink_events_total Kernel notifications received.",
            "# TYPE trueup_netlink_events_total counter",
            f"trueup_netlink_events_total {c['events']}",
            "# HELP trueup_heals_total Heal attempts by outcome.",
            "# TYPE trueup_heals_total counter",
            f'trueup_heals_total{{outcome="healed"}} {c["heals_ok"]}',
            f'trueup_heals_total{{outcome="failed"}} {c["heals_failed"]}',
            "# HELP trueup_breaker_open 1 while a subsystem's circuit breaker is open.",
            "# TYPE trueup_breaker_open gauge",
        ]
        policies = view.get("policies", {})
        for name, entry in policies.items():
            lines.append(
                f'trueup_breaker_open{{subsystem="{name}"}} {int(entry["breaker"] != "closed")}'
            )
        lines += [
            "# HELP trueup_contested_paths Paths another writer keeps changing.",
            "# TYPE trueup_contested_paths gauge",
        ]
        for name, entry in policies.items():
            lines.append(f'trueup_contested_paths{{subsystem="{name}"}} {len(entry["contested"])}')
        lines += [
            "# HELP trueup_acknowledged 1 while healing is paused by an acknowledgement.",
            "# TYPE trueup_acknowledged gauge",
        ]
        for name, entry in policies.items():
            lines.append(
                f'trueup_acknowledged{{subsystem="{name}"}} {int(bool(entry["acknowledged_until"]))}'
            )
        pending = view.get("extra", {}).get("pending_confirmation")
        lines += [
            "# HELP trueup_pending_confirmation 1 while an apply awaits `trueup confirm`.",
            "# TYPE trueup_pending_confirmation gauge",
            f"trueup_pending_confirmation {int(pending is not None)}",
        ]
        return lines
