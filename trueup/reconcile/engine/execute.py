"""A transaction's middle: observe and plan, execute, verify, and undo to the before-images.

Each function reads the `TransactionRun` and records on it what it did
(`failed`, `waiting`, `healed`, `touched`); the subsystems are converged
through `trueup.reconcile.engine.converge` (policy `JOURNALED`), and every
subsystem's outcome is a line in the journal.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING

from trueup.model.reasons import ReasonCode
from trueup.reconcile import faults
from trueup.reconcile.attribution import item_label
from trueup.reconcile.changes import Refused
from trueup.reconcile.engine.checks import deadline_for, unchanged_of
from trueup.reconcile.engine.converge import converge_bounded
from trueup.reconcile.engine.observe import observe_bounded
from trueup.reconcile.engine.run import (
    ATOMIC_WAIT,
    PREEMPTED,
    STEP_ERRORS,
    Preempted,
    TransactionRun,
    hit,
    paths_text,
)
from trueup.subsystems.base import Facts, Plan, Scope, StepWaits
from trueup.system.sources import Sources

if TYPE_CHECKING:
    from trueup.reconcile.engine.core import Engine

__all__ = ["execute", "observe_and_plan", "pinned", "roll_back_images", "verify"]

# Rounds of re-convergence verification allows for what a later step disturbed.
VERIFY_ROUNDS = 2
# Bound on restoring one subsystem's before-image (no document deadline applies).
UNDO_SECONDS = 90.0


def pinned(desired: Facts, observed: Facts, contested: Collection[str]) -> Facts:
    """Desired facts with contested paths pinned to what is observed (left alone).

    A contested item of a list (`spec.interfaces[lan0].addresses[2001:db8::1/64]`,
    `trueup.reconcile.attribution.item_paths`) pins that item only: the
    other items of the list are still converged.
    """
    target = {k: v for k, v in desired.items() if k not in contested}
    for path in contested:
        if path in observed:
            target[path] = observed[path]
            continue
        parent, _, rest = path.rpartition("[")
        if not rest.endswith("]") or not isinstance(target.get(parent), list):
            continue
        label = rest[:-1]
        have = [v for v in observed.get(parent) or [] if item_label(v) == label]
        want = [v for v in target[parent] if item_label(v) != label]
        target[parent] = [*want, *have[:1]]
        if all(isinstance(v, str) for v in target[parent]):
            target[parent] = sorted(target[parent])
    return target


def _target(engine: Engine, run: TransactionRun, name: str) -> Facts:
    return pinned(
        engine.by_name[name].desired(run.document, run.scope),
        run.before[name],
        run.change.contested.get(name, ()),
    )


def observe_and_plan(engine: Engine, net: Sources, run: TransactionRun) -> None:
    """The before-images, the targets and the plans of the run's subsystems.

    A daemon that does not answer, its section unchanged by this write, is
    carried like a failing one (never a reason to refuse or roll back the
    write); one whose section changes is skipped (failed). A heal that an
    operator's write preempts is refused (`CONCURRENT_MODIFICATION`).
    """
    unobservable: dict[str, str] = {}
    seen = observe_bounded(
        engine, net, run.scope, run.names, errors=unobservable, give_up=engine.preempted
    )
    if seen is None:
        raise Refused(
            ReasonCode.CONCURRENT_MODIFICATION,
            "heal deferred: an operator's write is waiting for the writer",
        )
    run.before = seen
    for name, error in unchanged_of(engine, run, dict(unobservable), "not observable").items():
        unobservable.pop(name)
        run.carried[name] = error
    run.skipped.update(unobservable)
    run.names = [n for n in run.names if n in run.before]
    run.targets = {n: _target(engine, run, n) for n in run.names}
    # A preparation still running (a lookup that hangs) is joined at its
    # subsystem's turn in `execute`: earlier tiers converge meanwhile.
    preparation = run.preparation
    run.late = preparation.running() & set(run.names) if preparation is not None else set()
    if preparation is not None:
        run.skipped.update(
            (n, e)
            for n, e in preparation.finished_failures().items()
            if n in run.names and n not in run.late
        )
    active = [n for n in run.names if n not in run.skipped]
    run.plans = {
        n: (
            Plan(n, [], [])
            if n in run.late
            else engine.by_name[n].plan(run.targets[n], run.before[n], run.scope)
        )
        for n in active
    }
    if run.late and not any(p.changes for p in run.plans.values()):
        # Nothing earlier to converge: waiting holds nothing back.
        for name in [n for n in active if n in run.late]:
            settle(engine, run, name)


def settle(engine: Engine, run: TransactionRun, name: str) -> bool:
    """Join `name`'s preparation if it was still running; False when it failed."""
    if name not in run.late:
        return True
    run.late.discard(name)
    error = run.preparation.wait(name) if run.preparation is not None else None
    if error:
        run.skipped[name] = error
        run.plans.pop(name, None)
        return False
    run.targets[name] = _target(engine, run, name)
    run.plans[name] = engine.by_name[name].plan(run.targets[name], run.before[name], run.scope)
    return True


def _record(engine: Engine, run: TransactionRun, kind: str, name: str, **fields: object) -> None:
    engine.state.journal.record(run.txn, kind, subsystem=name, **fields)


def _fail(engine: Engine, run: TransactionRun, name: str, error: str) -> None:
    run.failed[name] = error
    _record(engine, run, "failed", name, error=error)


def _wait(engine: Engine, run: TransactionRun, name: str, on: str, why: str) -> None:
    run.waiting[name] = why
    _record(engine, run, "waiting", name, on=on)


def execute(engine: Engine, net: Sources, run: TransactionRun) -> None:
    """Converge every subsystem with a plan, in order; dependents of a failure wait.

    A subsystem whose preparation was still running is joined at its turn
    (`settle`); one whose preparation failed fails there and is not converged.
    """
    for name in list(run.plans):
        if run.plans[name].changes and engine.preempted():
            # An operator's write waits: what is left goes to the next pass.
            _wait(engine, run, name, "writer", PREEMPTED)
            continue
        if not settle(engine, run, name):
            _fail(engine, run, name, run.skipped[name])
            if run.atomic:
                break
            continue
        plan = run.plans[name]
        if not plan.changes:
            continue
        subsystem = engine.by_name[name]
        blocker = next(
            (d for d in subsystem.depends_on if d in run.failed or d in run.waiting), None
        )
        if blocker is not None and not run.atomic:
            why = run.failed.get(blocker) or run.waiting.get(blocker)
            _wait(engine, run, name, blocker, f"waiting on {blocker}: {why}")
            continue
        run.touched.append(name)
        try:
            converge_bounded(
                engine,
                net,
                subsystem,
                run.targets[name],
                run.scope,
                plan,
                deadline_for(run.change, name),
                (run.kind, f"step:{name}"),
            )
        except StepWaits as exc:
            if run.atomic:
                # Nothing waits for it here: the whole revision is undone.
                run.failed[name] = f"{exc}; an atomic apply cannot wait for it: {ATOMIC_WAIT}"
                _record(engine, run, "failed", name, error=str(exc))
                break
            # Not a failure: what it needs does not exist yet (a late link).
            _wait(engine, run, name, exc.reason, exc.reason)
            continue
        except Preempted:
            _wait(engine, run, name, "writer", PREEMPTED)
            continue
        except STEP_ERRORS as exc:
            _fail(engine, run, name, str(exc))
            if run.atomic:
                break
            continue
        run.healed[name] = [s.describe() for s in plan.steps]
        _record(engine, run, "applied", name, steps=len(plan.steps))
        hit(run.kind, f"applied:{name}")


def _differing(engine: Engine, net: Sources, run: TransactionRun, candidates: list[str],
               still: dict[str, list[str]]) -> list[str] | None:  # fmt: skip
    """The candidates still differing from their targets; None: an atomic run failed."""
    differing = []
    for name in list(candidates):
        sub = engine.by_name[name]
        try:
            observed = sub.observe(net, run.scope)
        except STEP_ERRORS as exc:
            _fail(engine, run, name, f"verification: cannot observe {name}: {exc}")
            candidates.remove(name)
            if run.atomic:
                return None
            continue
        left = sub.plan(run.targets[name], observed, run.scope)
        if left.changes:
            differing.append(name)
            still[name] = sorted({step.path for step in left.steps})
    return differing


def _reconverge(engine: Engine, net: Sources, run: TransactionRun, name: str,
                candidates: list[str]) -> bool:  # fmt: skip
    """Converge `name` again in verification; False: an atomic run failed."""
    if name not in run.touched:
        run.touched.append(name)
    try:
        converge_bounded(
            engine,
            net,
            engine.by_name[name],
            run.targets[name],
            run.scope,
            None,
            deadline_for(run.change, name),
        )
    except StepWaits as exc:
        if run.atomic:
            _fail(engine, run, name, f"verification: {exc}; {ATOMIC_WAIT}")
            return False
        _wait(engine, run, name, exc.reason, exc.reason)
        candidates.remove(name)
        return True
    except Preempted:
        run.waiting[name] = PREEMPTED
        candidates.remove(name)
        return True
    except STEP_ERRORS as exc:
        _fail(engine, run, name, f"verification: {exc}")
        candidates.remove(name)
        return not run.atomic
    _record(engine, run, "verified", name, reconverged=True)
    run.healed.setdefault(name, []).append("re-converged after a later step's effect")
    return True


def verify(engine: Engine, net: Sources, run: TransactionRun) -> None:
    """Observe every subsystem again; converge what a later step disturbed.

    A subsystem that still differs after the rounds fails the transaction
    (atomic) or is reported failed (best-effort): committed means observed
    equals desired.
    """
    candidates = [
        n
        for n in run.names
        if n not in run.skipped and n not in run.failed and n not in run.waiting
    ]
    still: dict[str, list[str]] = {}  # subsystem → the paths that still differ
    differing: list[str] = []
    for round_ in range(VERIFY_ROUNDS + 1):
        if engine.preempted():
            # Converged but not verified: the next pass looks again.
            for name in candidates:
                run.waiting[name] = PREEMPTED
            return
        found = _differing(engine, net, run, candidates, still)
        if found is None:
            return
        differing = found
        if not differing:
            return
        if round_ == VERIFY_ROUNDS:
            break
        for name in differing:
            if not _reconverge(engine, net, run, name, candidates):
                return
    for name in differing:
        _fail(
            engine,
            run,
            name,
            "verification: observed state still differs from the document after "
            f"{VERIFY_ROUNDS} rounds: {paths_text(still.get(name, []))}",
        )


def roll_back_images(
    engine: Engine, net: Sources, before: Mapping[str, Facts], scope: Scope, touched: list[str]
) -> list[str]:
    """Converge each touched subsystem back to its before-image, last touched first."""
    errors: list[str] = []
    exact = scope.for_rollback()
    for name in reversed(touched):
        subsystem = engine.by_name.get(name)
        if subsystem is None or name not in before:
            errors.append(f"{name}: no before-image to restore")
            continue
        try:
            converge_bounded(engine, net, subsystem, before[name], exact, None, UNDO_SECONDS)
        except STEP_ERRORS as exc:
            errors.append(str(exc))
        faults.hit(f"rollback:{name}")
    # Restoring a later subsystem can disturb an earlier one (a link brought
    # down flushes its IPv6 addresses); one more pass in order settles it.
    for name in touched:
        subsystem = engine.by_name.get(name)
        if subsystem is not None and name in before:
            try:
                converge_bounded(engine, net, subsystem, before[name], exact, None, UNDO_SECONDS)
            except STEP_ERRORS as exc:
                errors.append(str(exc))
    return errors
