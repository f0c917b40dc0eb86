"""One transaction from its checks to its commit or rollback, under the writer lock.

`run_transaction` is the walk: `check` (a `TransactionRun`), observe and
plan, `begin`, `execute`, `verify`, then `commit` or `roll_back`. Each step
is a function over the run (`trueup.reconcile.engine.checks`, `.execute`,
`.commit`); this module only orders them and turns a state-directory failure
mid-way into a `StorageError` with the system put back.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from trueup.reconcile.changes import ApplyResult, Change, Kind, Outcome, StorageError, own_label
from trueup.reconcile.engine.checks import Preparation, check
from trueup.reconcile.engine.commit import (
    audit_records,
    begin,
    commit,
    settle_recovered,
)
from trueup.reconcile.engine.execute import (
    execute,
    observe_and_plan,
    roll_back_images,
    verify,
)
from trueup.reconcile.engine.override import settle_override
from trueup.reconcile.engine.run import TransactionRun, hit
from trueup.system import ownwrites
from trueup.system.sources import Sources

if TYPE_CHECKING:
    from trueup.reconcile.engine.core import Engine

log = logging.getLogger("trueup.reconcile")

__all__ = ["run_transaction"]


def _unchanged(run: TransactionRun) -> bool:
    """Nothing to do: no step planned, nothing skipped, the applied revision again."""
    return (
        not run.skipped
        and not any(p.changes for p in run.plans.values())
        and run.same_version
        and (run.heal or run.applied.outcome == Outcome.COMMITTED)
    )


def _storage_error(engine: Engine, exc: OSError) -> StorageError:
    return StorageError(
        f"{engine.state.root}: cannot write the journal ({exc}); nothing was changed"
    )


def run_transaction(
    engine: Engine,
    change: Change,
    names: list[str],
    skipped: dict[str, str],
    preparation: Preparation | None,
) -> ApplyResult:
    """`change` as one journaled, verified transaction; the caller holds the writer lock."""
    run = check(engine, change, names, skipped, preparation)
    engine.running = run
    try:
        with engine.sources() as net:
            observe_and_plan(engine, net, run)
            if _unchanged(run):
                try:
                    cleared = settle_recovered(engine, run)
                except OSError as exc:
                    raise _storage_error(engine, exc) from exc
                return run.result(Outcome.UNCHANGED, cleared=cleared)
            try:
                begin(engine, run)
            except OSError as exc:
                raise _storage_error(engine, exc) from exc
            with ownwrites.writing(own_label(run.kind, run.txn)):
                try:
                    undone = _converge_and_commit(engine, net, run)
                except OSError as exc:
                    raise _storage_failure(engine, net, run, exc) from exc
            if undone is not None:
                return undone
    finally:
        engine.running = None
    _audit(engine, run)
    if not run.heal:
        settle_override(engine.state, run.change, run.document, run.version)
    return run.result(run.outcome)


def _converge_and_commit(engine: Engine, net: Sources, run: TransactionRun) -> ApplyResult | None:
    """Execute and verify, then commit (None) or roll back (its answer)."""
    hit(run.kind, "begin")
    change = run.change
    if change.only is not None and run.same_version and not run.heal:
        # Subsystems outside this transaction keep the failures they had.
        run.failed.update(
            (name, error)
            for name, error in dict(run.applied.failed).items()
            if name not in change.only
        )
    for name, reason in run.skipped.items():
        run.failed[name] = reason
        engine.state.journal.record(run.txn, "failed", subsystem=name, error=reason)
    execute(engine, net, run)
    if not (run.failed and run.atomic):
        verify(engine, net, run)
    if run.failed and run.atomic:
        return _rolled_back(engine, net, run)
    hit(run.kind, "before-commit")
    run.audit_lines = audit_records(run)
    commit(engine, run, run.audit_lines)
    hit(run.kind, "after-commit")
    return None


def _rolled_back(engine: Engine, net: Sources, run: TransactionRun) -> ApplyResult:
    """Undo an atomic run to its before-images, journaled and audited; its answer."""
    change = run.change
    errors = roll_back_images(engine, net, run.before, run.scope, run.touched)
    engine.state.journal.record(
        run.txn,
        "rolled_back",
        recovered=False,
        reason="step failed",
        errors=errors,
        failed=run.failed,
    )
    engine.state.audit.append(
        f"{change.kind}_rolled_back",
        change.actor,
        version=run.version,
        txn=run.txn,
        failed=run.failed,
        rollback_errors=errors,
        source=change.source,
        origin=change.origin,
    )
    return run.result(Outcome.ROLLED_BACK, rollback_errors=errors)


def _audit(engine: Engine, run: TransactionRun) -> None:
    try:
        for event, details in run.audit_lines:
            engine.state.audit.append(event, run.change.actor, **details)
    except OSError:
        # Committed; the lines travel with the journal's commit and are
        # written by the next transaction (see `complete_audit`).
        engine.audit_checked = False


def _storage_failure(
    engine: Engine, net: Sources, run: TransactionRun, exc: OSError
) -> StorageError:
    """The state directory refused a write mid-transaction: put the system back.

    A heal converges to the committed revision: what it did is kept (its
    before-image is the drift — for a flushed management interface, no
    management at all). Anything else goes back to its before-images.
    """
    heal = run.kind == Kind.RECONCILE
    errors = [] if heal else roll_back_images(engine, net, run.before, run.scope, run.touched)
    closed = True
    try:
        engine.state.set_applied(run.applied)
        engine.state.journal.record(
            run.txn, "rolled_back", recovered=False, reason=f"state directory: {exc}", errors=errors
        )
    except OSError:
        closed = False  # still open: the next write recovers it to the committed revision
    done = (
        "the heal's changes (towards the committed revision) were kept"
        if heal
        else "the system was put back as it was"
    )
    return StorageError(
        f"{engine.state.root}: a state write failed ({exc}); {done}"
        + (
            ""
            if closed
            else " and the transaction stays open until the directory takes writes again "
            "(the agent then closes it by itself; without an agent, the next write does)"
        )
        + (f" (with errors: {'; '.join(errors)})" if errors else "")
        + ". Free space or make the directory writable, then retry"
    )
