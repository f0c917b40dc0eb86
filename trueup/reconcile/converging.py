"""Converging subsystems inside a transaction: execute, verify, roll back, survive storage errors.

Part of the engine (`trueup.reconcile.transaction.Engine` inherits it); read
with the write path in docs/architecture.md.

Why this module is over 400 lines: executing, verifying and undoing share one
transaction's bookkeeping per subsystem (applied, failed, waiting on a link,
deferred for an operator's write); split apart, every part would pass it along.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from trueup.journal.state import StateDir
from trueup.model.records import Applied
from trueup.reconcile import faults
from trueup.reconcile.changes import (
    _CONVERGE_PASSES,
    _STEP_ERRORS,
    _UNDO_SECONDS,
    _VERIFY_ROUNDS,
    Change,
    StorageError,
)
from trueup.subsystems.base import Facts, Plan, Scope, Step, StepError, StepWaits, Subsystem
from trueup.system.sources import Sources

log = logging.getLogger("trueup.reconcile")

__all__ = ["Converging"]


# Why a heal left a subsystem: an operator's write waits (waiting, never a failure).
PREEMPTED = "deferred: an operator's write is waiting for the writer; the next pass heals it"


# What an atomic apply that met a missing link says (it rolls back; nothing goes on by itself).
ATOMIC_WAIT = (
    "nothing of this revision was kept; create the link, or apply with --mode best-effort "
    "to converge the rest now and the link's part once it appears"
)


class Preempted(StepError):
    """A heal abandoned a subsystem's convergence for an operator's write."""


def _paths_text(paths: list[str]) -> str:
    """The differing paths, for a failure that has no evidence of another writer."""
    if not paths:
        return "the plan is not empty"
    return ", ".join(paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")


class Converging:
    """Steps and their checks for one transaction; the engine supplies state and subsystems."""

    if TYPE_CHECKING:
        state: StateDir
        by_name: dict[str, Subsystem]
        _current_kind: str | None

        def _deadline(self, change: Change, name: str) -> float: ...

        def _preempted(self) -> bool: ...

        _abandoned: dict[str, threading.Thread]

        @staticmethod
        def _hit(kind: str, point: str) -> None: ...

        def sources(
            self, memo: dict[str, Any] | None = None
        ) -> AbstractContextManager[Sources]: ...

    def _storage_failure(
        self,
        net: Sources,
        txn: str,
        before: dict[str, Facts],
        scope: Scope,
        touched: list[str],
        applied: Applied,
        exc: OSError,
    ) -> StorageError:
        """The state directory refused a write mid-transaction: put the system back.

        A heal converges to the committed revision: what it did is kept (its
        before-image is the drift — for a flushed management interface, no
        management at all). Anything else goes back to its before-images.
        """
        heal = bool(self._current_kind == "reconcile")
        errors = [] if heal else self._rollback(net, before, scope, touched)
        closed = True
        try:
            self.state.set_applied(applied)
            self.state.journal.record(
                txn, "rolled_back", recovered=False, reason=f"state directory: {exc}", errors=errors
            )
        except OSError:
            closed = False  # still open: the next write recovers it to the committed revision
        done = (
            "the heal's changes (towards the committed revision) were kept"
            if heal
            else "the system was put back as it was"
        )
        return StorageError(
            f"{self.state.root}: a state write failed ({exc}); {done}"
            + (
                ""
                if closed
                else " and the transaction stays open until the directory takes writes again "
                "(the agent then closes it by itself; without an agent, the next write does)"
            )
            + (f" (with errors: {'; '.join(errors)})" if errors else "")
            + ". Free space or make the directory writable, then retry"
        )

    def _execute(
        self,
        net: Sources,
        change: Change,
        txn: str,
        plans: dict[str, Plan],
        targets: dict[str, Facts],
        scope: Scope,
        failed: dict[str, str],
        waiting: dict[str, str],
        touched: list[str],
        healed: dict[str, list[str]],
        turn: Callable[[str], bool] | None = None,
    ) -> None:
        """Converge every subsystem with a plan, in order; dependents of a failure wait.

        `turn(name)`, when given, is called as a subsystem's turn comes (it
        joins a preparation still running and may replace the plan); False:
        the subsystem failed there and is not converged.
        """
        journal = self.state.journal
        for name in list(plans):
            if plans[name].changes and self._preempted():
                # An operator's write waits: what is left goes to the next pass.
                waiting[name] = PREEMPTED
                journal.record(txn, "waiting", subsystem=name, on="writer")
                continue
            if turn is not None and not turn(name):
                if change.mode == "atomic":
                    break
                continue
            plan = plans[name]
            if not plan.changes:
                continue
            subsystem = self.by_name[name]
            blocker = next((d for d in subsystem.depends_on if d in failed or d in waiting), None)
            if blocker is not None and change.mode != "atomic":
                why = failed.get(blocker) or waiting.get(blocker)
                waiting[name] = f"waiting on {blocker}: {why}"
                journal.record(txn, "waiting", subsystem=name, on=blocker)
                continue
            touched.append(name)
            try:
                self._converge_bounded(
                    net,
                    subsystem,
                    targets[name],
                    scope,
                    plan,
                    self._deadline(change, name),
                    (change.kind, f"step:{name}"),
                )
            except StepWaits as exc:
                if change.mode == "atomic":
                    # Nothing waits for it here: the whole revision is undone.
                    failed[name] = f"{exc}; an atomic apply cannot wait for it: {ATOMIC_WAIT}"
                    journal.record(txn, "failed", subsystem=name, error=str(exc))
                    break
                # Not a failure: what it needs does not exist yet (a late link).
                waiting[name] = exc.reason
                journal.record(txn, "waiting", subsystem=name, on=exc.reason)
                continue
            except Preempted:
                waiting[name] = PREEMPTED
                journal.record(txn, "waiting", subsystem=name, on="writer")
                continue
            except _STEP_ERRORS as exc:
                failed[name] = str(exc)
                journal.record(txn, "failed", subsystem=name, error=str(exc))
                if change.mode == "atomic":
                    break
                continue
            healed[name] = [s.describe() for s in plan.steps]
            journal.record(txn, "applied", subsystem=name, steps=len(plan.steps))
            self._hit(change.kind, f"applied:{name}")

    def _verify(
        self,
        net: Sources,
        change: Change,
        txn: str,
        names: list[str],
        skipped: dict[str, str],
        targets: dict[str, Facts],
        scope: Scope,
        failed: dict[str, str],
        waiting: dict[str, str],
        touched: list[str],
        healed: dict[str, list[str]],
    ) -> None:
        """Observe every subsystem again; converge what a later step disturbed.

        A subsystem that still differs after the rounds fails the transaction
        (atomic) or is reported failed (best-effort): committed means observed
        equals desired.
        """
        journal = self.state.journal
        candidates = [n for n in names if n not in skipped and n not in failed and n not in waiting]
        still: dict[str, list[str]] = {}  # subsystem → the paths that still differ
        for round_ in range(_VERIFY_ROUNDS + 1):
            differing = []
            if self._preempted():
                # Converged but not verified: the next pass looks again.
                for name in candidates:
                    waiting[name] = PREEMPTED
                return
            for name in list(candidates):
                sub = self.by_name[name]
                try:
                    observed = sub.observe(net, scope)
                except _STEP_ERRORS as exc:
                    failed[name] = f"verification: cannot observe {name}: {exc}"
                    journal.record(txn, "failed", subsystem=name, error=failed[name])
                    candidates.remove(name)
                    if change.mode == "atomic":
                        return
                    continue
                left = sub.plan(targets[name], observed, scope)
                if left.changes:
                    differing.append(name)
                    still[name] = sorted({step.path for step in left.steps})
            if not differing:
                return
            if round_ == _VERIFY_ROUNDS:
                break
            for name in differing:
                sub = self.by_name[name]
                if name not in touched:
                    touched.append(name)
                try:
                    self._converge_bounded(
                        net, sub, targets[name], scope, None, self._deadline(change, name)
                    )
                except StepWaits as exc:
                    if change.mode == "atomic":
                        failed[name] = f"verification: {exc}; {ATOMIC_WAIT}"
                        journal.record(txn, "failed", subsystem=name, error=failed[name])
                        return
                    waiting[name] = exc.reason
                    journal.record(txn, "waiting", subsystem=name, on=exc.reason)
                    candidates.remove(name)
                    continue
                except Preempted:
                    waiting[name] = PREEMPTED
                    candidates.remove(name)
                    continue
                except _STEP_ERRORS as exc:
                    failed[name] = f"verification: {exc}"
                    journal.record(txn, "failed", subsystem=name, error=failed[name])
                    candidates.remove(name)
                    if change.mode == "atomic":
                        return
                    continue
                journal.record(txn, "verified", subsystem=name, reconverged=True)
                healed.setdefault(name, []).append("re-converged after a later step's effect")
        for name in differing:
            failed[name] = (
                "verification: observed state still differs from the document after "
                f"{_VERIFY_ROUNDS} rounds: {_paths_text(still.get(name, []))}"
            )
            journal.record(txn, "failed", subsystem=name, error=failed[name])

    def _converge_bounded(
        self,
        net: Sources,
        subsystem: Subsystem,
        desired: Facts,
        scope: Scope,
        plan: Plan | None,
        seconds: float,
        fault_point: tuple[str, str] | None = None,
    ) -> None:
        """Converge within the subsystem's deadline.

        Netlink subsystems answer at kernel speed and run inline, checking the
        deadline between steps. Others (daemons, plugins) run on a worker with
        a netlink handle of their own; at the deadline the worker is told to
        stop before its next step and the transaction moves on.
        """
        if not subsystem.may_block:
            deadline = time.monotonic() + seconds
            self._converge(net, subsystem, desired, scope, plan, fault_point, None, deadline)
            return
        ends = time.monotonic() + seconds
        left_behind = self._abandoned.get(subsystem.name)
        if left_behind is not None and left_behind.is_alive():
            # A convergence abandoned earlier (a deadline, a heal yielding) stops before
            # its next step: its step in progress ends before another one starts.
            left_behind.join(max(0.0, ends - time.monotonic()))
            if left_behind.is_alive():
                raise StepError(
                    Step(subsystem.name, "converge", f"subsystem {subsystem.name}"),
                    "an earlier convergence of it is still finishing its step",
                )
        cancel = threading.Event()
        outcome: list[BaseException | None] = []

        def work() -> None:
            try:
                with self.sources(net.memo) as own:
                    self._converge(own, subsystem, desired, scope, plan, fault_point, cancel)
                outcome.append(None)
            except BaseException as exc:  # reported to the waiting thread
                outcome.append(exc)

        worker = threading.Thread(target=work, name=f"trueup-{subsystem.name}", daemon=True)
        worker.start()
        self._abandoned[subsystem.name] = worker  # until it ends
        while worker.is_alive() and time.monotonic() < ends:
            worker.join(min(0.05, max(0.0, ends - time.monotonic())))
            if worker.is_alive() and self._preempted():
                # A heal gives the writer up to an operator's write: the worker stops
                # before its next step, and its subsystem waits for the next pass.
                cancel.set()
                raise Preempted(Step(subsystem.name, "converge", f"subsystem {subsystem.name}"),
                                PREEMPTED)  # fmt: skip
        # The worker changed the kernel through its own handle (an HA subsystem releasing
        # an address): what this handle cached before is stale.
        forget = getattr(net.netlink, "forget", None)
        if callable(forget):
            forget()
        if worker.is_alive():
            cancel.set()
            raise StepError(
                Step(subsystem.name, "converge", f"subsystem {subsystem.name}"),
                f"deadline of {seconds:g}s exceeded",
            )
        if outcome and outcome[0] is not None:
            raise outcome[0]

    def _converge(
        self,
        net: Sources,
        subsystem: Subsystem,
        desired: Facts,
        scope: Scope,
        plan: Plan | None = None,
        fault_point: tuple[str, str] | None = None,
        cancel: threading.Event | None = None,
        deadline: float | None = None,
    ) -> None:
        """Execute a plan, then re-observe and re-plan until no steps remain.

        The kernel has side effects (removing an address flushes the routes
        through it; removing a primary IPv4 address removes its secondaries),
        so a subsystem is done only when a fresh observation agrees, not when
        its first plan ran.
        """
        if plan is None:
            plan = subsystem.plan(desired, subsystem.observe(net, scope), scope)
        for attempt in range(_CONVERGE_PASSES):
            for index, step in enumerate(plan.steps):
                if (cancel is not None and cancel.is_set()) or (
                    deadline is not None and time.monotonic() > deadline
                ):
                    raise StepError(step, "cancelled: the subsystem's deadline passed")
                subsystem.execute(net, step)
                if index == 0 and attempt == 0 and fault_point:
                    self._hit(*fault_point)
            plan = subsystem.plan(desired, subsystem.observe(net, scope), scope)
            if not plan.changes:
                return
        raise StepError(
            plan.steps[0],
            f"still differs after {_CONVERGE_PASSES} passes: "
            + _paths_text(sorted({step.path for step in plan.steps})),
        )

    def _rollback(
        self, net: Sources, before: dict[str, Facts], scope: Scope, touched: list[str]
    ) -> list[str]:
        """Converge each touched subsystem back to its before-image, last touched first."""
        errors: list[str] = []
        exact = scope.for_rollback()
        for name in reversed(touched):
            subsystem = self.by_name.get(name)
            if subsystem is None or name not in before:
                errors.append(f"{name}: no before-image to restore")
                continue
            try:
                self._converge_bounded(net, subsystem, before[name], exact, None, _UNDO_SECONDS)
            except _STEP_ERRORS as exc:
                errors.append(str(exc))
            faults.hit(f"rollback:{name}")
        # Restoring a later subsystem can disturb an earlier one (a link brought
        # down flushes its IPv6 addresses); one more pass in order settles it.
        for name in touched:
            subsystem = self.by_name.get(name)
            if subsystem is not None and name in before:
                try:
                    self._converge_bounded(net, subsystem, before[name], exact, None, _UNDO_SECONDS)
                except _STEP_ERRORS as exc:
                    errors.append(str(exc))
        return errors
