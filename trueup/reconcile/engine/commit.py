"""A transaction's records: its `begin`, its commit, and the write that settles a recovery.

`begin` writes the journal's first line with the before-images; `commit`
writes the revision, the applied record, the management facts and the
journal's `commit` (which carries the audit lines, so a crash right after
it cannot lose them: `complete_audit` writes them in the next process).
`settle_recovered` closes what crash recovery left reported once an
unchanged write proves it moot; `last_reported_transaction` is what status
reports.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from trueup.journal.audit import now_iso
from trueup.journal.journal import Transaction
from trueup.journal.management import management_facts, write_management
from trueup.model.records import Applied, Override
from trueup.model.virtual import virtual_addresses
from trueup.reconcile.changes import Kind, Outcome
from trueup.reconcile.engine.run import LOCAL_ORIGINS, TransactionRun

if TYPE_CHECKING:
    from trueup.reconcile.engine.core import Engine

__all__ = [
    "AuditLines",
    "audit_records",
    "begin",
    "commit",
    "complete_audit",
    "last_reported_transaction",
    "settle_recovered",
]

AuditLines = list[tuple[str, dict[str, Any]]]


def begin(engine: Engine, run: TransactionRun) -> None:
    """The journal's `begin` with every before-image; sets `run.txn`. Raises `OSError`."""
    run.txn = engine.state.journal.begin(
        kind=run.kind,
        origin=run.change.origin,
        version=run.version,
        mode=run.mode,
        digest=run.digest,
        actor=run.change.actor,
        subsystems=[n for n, p in run.plans.items() if p.changes or n in run.late],
        all_subsystems=run.names,
        scope=run.scope.to_json(),
        before=run.before,
        previous_applied=run.applied.to_json(),
        steps={n: len(p.steps) for n, p in run.plans.items() if p.changes},
    )


def audit_records(run: TransactionRun) -> AuditLines:
    """The audit lines the commit carries: the caller's (`Change.audit`), else one of `kind`."""
    change = run.change
    if change.audit is not None:
        return change.audit(run.txn, run.failed, run.waiting, run.healed)
    details: dict[str, Any] = {
        "version": run.version,
        "txn": run.txn,
        "outcome": run.outcome.value,
        "failed": run.failed,
        "source": change.source,
        "origin": change.origin,
    }
    if run.waiting:
        details["waiting"] = run.waiting
    if run.healed:
        details["subsystems"] = sorted(run.healed)
        details["steps"] = sum(len(v) for v in run.healed.values())
    if change.override is not None:
        details["override"] = change.override
    return [(change.kind.value, details)]


def commit(engine: Engine, run: TransactionRun, records: AuditLines) -> None:
    """Write what the run committed, then the journal's `commit` carrying `records`."""
    state = engine.state
    settled = [n for n in run.names if n not in run.failed and n not in run.waiting]
    if run.heal:
        # A heal converges to the applied revision; the applied record changes
        # only when a subsystem that had failed is now in place.
        applied = run.applied
        before_failed = dict(applied.failed)
        now_failed = {n: e for n, e in before_failed.items() if n not in settled}
        before_carried = dict(applied.carried)
        now_carried = {n: e for n, e in before_carried.items() if n not in settled}
        changed = now_failed != before_failed or now_carried != before_carried
        if changed and applied.version:
            record = applied.model_copy(update={"failed": now_failed, "carried": now_carried})
            if applied.outcome == Outcome.PARTIAL and not now_failed:
                record.outcome = Outcome.COMMITTED.value
            state.set_applied(record)
    else:
        document = run.document
        state.save_revision(
            run.version,
            document.canonical(),
            accepted_at=now_iso(),
            actor=run.change.actor,
            source=run.change.source,
            origin=run.change.origin,
            txn=run.txn,
            applied_digest=run.digest,
        )
        state.set_applied(_applied_record(engine, run))
        engine.keep_parsed(document)
        write_management(
            state.root,
            management_facts(
                document.spec.management.model_dump(mode="json"),
                version=run.version,
                digest=run.digest,
                virtual=sorted(virtual_addresses(document)),
            ),
        )
    # The audit lines travel with the commit: a crash before they are
    # appended cannot lose them (see `complete_audit`).
    state.journal.record(
        run.txn,
        "commit",
        outcome=run.outcome.value,
        version=run.version,
        failed=run.failed,
        audit=[{"event": e, "details": d} for e, d in records],
    )


def _applied_record(engine: Engine, run: TransactionRun) -> Applied:
    change = run.change
    previous = run.applied
    cp_version, override = previous.cp_version, previous.override
    if change.origin == "control-plane":
        cp_version, override = run.version, None
    elif change.override is not None and engine.managed_by() is not None:
        override = Override(
            version=run.version,
            actor=change.actor,
            at=now_iso(),
            reason=change.override,
            digest=run.digest,
        )
    elif change.origin in LOCAL_ORIGINS or change.replaces_override:
        # A local write, or a restore, replaces the revision a local override applied:
        # the override is over (status, the control-plane report and the dashboard).
        override = None
    return Applied(
        version=run.version,
        digest=run.digest,
        origin=change.origin,
        cp_version=cp_version,
        override=override,
        outcome=(Outcome.PARTIAL if run.failed else Outcome.COMMITTED).value,
        txn=run.txn,
        applied_at=now_iso(),
        mode=change.mode,
        failed=run.failed,
        carried=dict(run.carried),
        actor=change.actor,
        source=change.source,
    )


def settle_recovered(engine: Engine, run: TransactionRun) -> str | None:
    """Close what crash recovery left reported, once an unchanged write proves it moot.

    A write answered `unchanged` (observed equals desired, nothing to do)
    right after recovery rolled a transaction back: the system holds what
    it should, so `STATE_APPLY_NOT_COMPLETED` is over. The write leaves a
    transaction of its own in the journal (begin, commit `unchanged`,
    naming the recovered one), which status reports instead. Returns what
    was cleared, or None when recovery left nothing to report.
    """
    if run.heal:
        return None  # heals never answer an apply's interruption (`last_reported_transaction`)
    state = engine.state
    recovered = last_reported_transaction(state.journal.transactions())
    if recovered is None or not (recovered.terminal or {}).get("recovered"):
        return None
    change = run.change
    cleared = (
        f"STATE_APPLY_NOT_COMPLETED cleared: transaction {recovered.txn} (version "
        f"{recovered.begin.get('version')}), rolled back at recovery, is answered: "
        f"observed equals version {run.version}"
    )
    txn = state.journal.begin(
        kind=change.kind,
        origin=change.origin,
        version=run.version,
        mode=change.mode,
        digest=run.digest,
        actor=change.actor,
        subsystems=[],
        all_subsystems=[],
        scope=run.scope.to_json(),
        before={},
        previous_applied=state.applied().to_json(),
        steps={},
    )
    details = {
        "version": run.version,
        "txn": txn,
        "outcome": Outcome.UNCHANGED.value,
        "source": change.source,
        "origin": change.origin,
        "settles": recovered.txn,
        "cleared": cleared,
    }
    state.journal.record(
        txn,
        "commit",
        outcome=Outcome.UNCHANGED.value,
        version=run.version,
        failed={},
        settles=recovered.txn,
        audit=[{"event": change.kind.value, "details": details}],
    )
    state.audit.append(change.kind.value, change.actor, **details)
    return cleared


def complete_audit(engine: Engine) -> None:
    """Write the audit line of a transaction committed right before a crash."""
    state = engine.state
    last = state.journal.last()
    if last is None or last.terminal is None or last.terminal["type"] != "commit":
        return
    payload = last.terminal.get("audit")
    if not isinstance(payload, list) or not payload:
        return
    for record in reversed(state.audit.tail(max_bytes=1 << 20)):
        if record.get("details", {}).get("txn") == last.txn:
            return
    actor = str(last.begin.get("actor", "local"))
    for entry in payload:
        details = dict(entry.get("details", {}))
        details.setdefault("txn", last.txn)
        details["written_after_restart"] = True
        state.audit.append(str(entry.get("event", last.kind)), actor, **details)


def last_reported_transaction(transactions: Sequence[Transaction]) -> Transaction | None:
    """The transaction whose outcome status reports: the last one but ordinary heals.

    Heals converge to the applied version; they do not clear what the last
    apply (or its crash recovery) left to report. A heal a crash interrupted
    is reported itself (recovery closed it), until a later heal commits. Any
    later write that commits — an unchanged one after recovery included
    (`settle_recovered`) — is reported instead.
    """
    healed_since = False
    for transaction in reversed(transactions):
        if transaction.kind != Kind.RECONCILE:
            return transaction
        terminal = transaction.terminal or {}
        if terminal.get("recovered") and not healed_since:
            return transaction
        if terminal.get("type") == "commit":
            healed_since = True
    return None
