"""Crash recovery: an open transaction is converged to the last committed revision and closed.

An open transaction (a `begin` without `commit` or `rolled_back`) is never
resumed forward. The subsystems it could change are converged to the last
*committed* revision — never to a before-image that may hold drift, and never
away from its management addresses — and it is closed as `rolled_back` with
`recovered: true`. Converging to a recorded revision is idempotent, so a
crash during recovery is recovered the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from trueup.journal.journal import Transaction
from trueup.model.document import DeviceState, DocumentError, parse_document
from trueup.reconcile import faults
from trueup.reconcile.engine.checks import Preparation, prepares
from trueup.reconcile.engine.commit import complete_audit
from trueup.reconcile.engine.converge import converge_bounded
from trueup.reconcile.engine.execute import roll_back_images
from trueup.reconcile.engine.override import with_override
from trueup.reconcile.engine.run import STEP_ERRORS
from trueup.subsystems.base import Scope
from trueup.subsystems.registry import ordered, scope_for
from trueup.system import ownwrites
from trueup.system.sources import Sources

if TYPE_CHECKING:
    from trueup.reconcile.engine.core import Engine

__all__ = ["recover_locked"]


def recover_locked(engine: Engine, actor: str) -> Transaction | None:
    """Recover the transaction a crash left open; the caller holds the writer lock."""
    journal = engine.state.journal
    if not engine.audit_checked:
        engine.audit_checked = True
        complete_audit(engine)
    open_txn = journal.open_transaction()
    if open_txn is None:
        return None
    begin = open_txn.begin
    scope = Scope.from_json(begin["scope"])
    previous = begin.get("previous_applied") or {"version": 0}
    journal.record(open_txn.txn, "recovering", to_version=previous.get("version", 0))
    target = _committed_document(engine, previous)
    naming = ownwrites.writing(f"trueup recovery rollback of {open_txn.txn}")
    with naming, engine.sources() as net:
        if target is not None:
            errors = _forward(engine, net, open_txn, target, scope)
        else:
            # Nothing was ever committed: restore what was there before, except
            # management, which phase 1 brought up and nothing takes away.
            touched = [n for n in begin.get("subsystems", []) if n != "management"]
            errors = roll_back_images(engine, net, begin["before"], scope, touched)
    engine.state.set_applied(previous)
    journal.record(
        open_txn.txn,
        "rolled_back",
        recovered=True,
        reason="interrupted before commit",
        to_version=previous.get("version", 0),
        errors=errors,
    )
    engine.state.audit.append(
        "recovered",
        actor,
        txn=open_txn.txn,
        kind=open_txn.kind,
        version=begin.get("version"),
        restored_version=previous.get("version", 0),
        rollback_errors=errors,
    )
    return open_txn


def _forward(
    engine: Engine, net: Sources, open_txn: Transaction, target: DeviceState, scope: Scope
) -> list[str]:
    """Converge what the open transaction could change to the committed `target`; the errors.

    Its scope widened by the transaction's: what either manages (the
    firewall's table, sysctl names, WireGuard interfaces, …) is put back.
    """
    journal = engine.state.journal
    begin = open_txn.begin
    recorded = set(begin.get("all_subsystems") or begin.get("subsystems") or [])
    target_scope = scope_for(target).union(scope)
    names = _recovery_names(engine, target, target_scope, recorded)
    # Preparation (a lookup, nft's canonical form) runs beside recovery, each
    # joined at its turn within its deadline: one that hangs or raises fails
    # its own subsystem, never the earlier tiers nor the recovery itself.
    preparation = Preparation(
        target,
        [engine.by_name[n] for n in names if prepares(engine.by_name[n])],
        {n: target.spec.convergence.deadline_for(n) for n in names},
    )
    errors: list[str] = []
    for name in names:
        sub = engine.by_name[name]
        prepared = preparation.wait(name)
        if prepared is not None:
            error = f"{name}: {prepared}"
            errors.append(error)
            journal.record(open_txn.txn, "recovered", subsystem=name, error=error)
            faults.hit(f"recovery:{name}")
            continue
        try:
            desired = sub.desired(target, target_scope)
            if sub.releases_unmanaged:
                # A key the committed revision does not manage is left as it
                # was before the transaction (a sysctl it set is put back).
                desired = {**begin.get("before", {}).get(name, {}), **desired}
            converge_bounded(
                engine,
                net,
                sub,
                desired,
                target_scope,
                None,
                target.spec.convergence.deadline_for(name),
            )
            journal.record(open_txn.txn, "recovered", subsystem=name)
        except STEP_ERRORS as exc:
            errors.append(str(exc))
            journal.record(open_txn.txn, "recovered", subsystem=name, error=str(exc))
        faults.hit(f"recovery:{name}")
    return errors


def _recovery_names(
    engine: Engine, target: DeviceState, target_scope: Scope, recorded: set[str]
) -> list[str]:
    """What recovery converges to `target`: every subsystem the interrupted transaction
    could change or the committed revision manages.

    Tier order, whatever order the journal holds: management, network (links,
    addresses, firewall, sysctl), services, then optional ones (proxies,
    WireGuard) — never before what they depend on, each within its own deadline.
    """
    return [
        sub.name
        for sub in ordered(engine.by_name.values())
        if sub.name in recorded or sub.configured(target) or target_scope.keys_for(sub.name)
    ]


def _committed_document(engine: Engine, applied: Mapping[str, Any]) -> DeviceState | None:
    """The revision `applied` (the journal's `previous_applied`, as written) names."""
    version = int(applied.get("version", 0))
    if not version:
        return None
    record = engine.state.revision(version, applied.get("digest"))
    if record is None:
        return None
    try:
        return with_override(
            engine.state, parse_document(record["document"], f"revision {version}")
        )
    except DocumentError:
        return None
