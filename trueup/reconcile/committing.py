"""Committing a transaction and recovering one a crash left open.

Part of the engine (`trueup.reconcile.transaction.Engine` inherits it): the
revision, the applied record, the journal's `commit` with its audit lines,
and the recovery rule (forward to the last committed revision), and what
answers a recovery: the transaction status reports (`last_reported_transaction`)
and the unchanged write that settles it (`Committing._settle_recovered`).

Why this module is over 400 lines: a commit and a recovery write the same
records (the applied record, the journal's terminal line with its audit
lines), and what ends a recovery's report is decided beside the recovery
itself; apart, the two would have to agree on the journal's shape by hand.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from trueup.journal.audit import now_iso
from trueup.journal.journal import Transaction
from trueup.journal.management import management_facts, write_management
from trueup.model.document import DeviceState, DocumentError, parse_document
from trueup.model.records import Applied, Override
from trueup.model.virtual import virtual_addresses
from trueup.reconcile import faults
from trueup.reconcile.changes import (
    _LOCAL_ORIGINS,
    _STEP_ERRORS,
    Change,
)
from trueup.reconcile.checking import Preparation, _prepares
from trueup.reconcile.converging import Converging
from trueup.subsystems.base import Scope
from trueup.subsystems.registry import ordered, scope_for
from trueup.system import ownwrites

log = logging.getLogger("trueup.reconcile")

__all__ = ["Committing"]


class Committing(Converging):
    """Commit and recovery; the engine supplies the lock, overrides and the control plane."""

    _carrying: dict[str, str] = {}  # the running transaction's carried failures

    if TYPE_CHECKING:
        _audit_checked: bool

        def managed_by(self) -> str | None: ...

        def refuse_if_damaged(self) -> None: ...

        def with_override(self, document: DeviceState) -> DeviceState: ...

        def _keep_parsed(self, document: DeviceState) -> None: ...

        def writer(
            self, purpose: str, actor: str, wait: float = 0.0, *, quiet: bool = False
        ) -> AbstractContextManager[None]: ...

    def _commit(
        self,
        change: Change,
        txn: str,
        document: DeviceState,
        version: int,
        digest: str,
        applied: Applied,
        failed: dict[str, str],
        settled: list[str],
        records: list[tuple[str, dict[str, Any]]],
    ) -> None:
        state = self.state
        outcome = "partial" if failed else "committed"
        if change.kind == "reconcile":
            # A heal converges to the applied revision; the applied record changes
            # only when a subsystem that had failed is now in place.
            before_failed = dict(applied.failed)
            now_failed = {n: e for n, e in before_failed.items() if n not in settled}
            before_carried = dict(applied.carried)
            now_carried = {n: e for n, e in before_carried.items() if n not in settled}
            changed = now_failed != before_failed or now_carried != before_carried
            if changed and applied.version:
                record = applied.model_copy(update={"failed": now_failed, "carried": now_carried})
                if applied.outcome == "partial" and not now_failed:
                    record.outcome = "committed"
                state.set_applied(record)
            outcome = "failed" if failed else "committed"
        else:
            state.save_revision(
                version,
                document.canonical(),
                accepted_at=now_iso(),
                actor=change.actor,
                source=change.source,
                origin=change.origin,
                txn=txn,
                applied_digest=digest,
            )
            state.set_applied(self._applied_record(change, txn, version, digest, applied, failed))
            self._keep_parsed(document)
            write_management(
                state.root,
                management_facts(
                    document.spec.management.model_dump(mode="json"),
                    version=version,
                    digest=digest,
                    virtual=sorted(virtual_addresses(document)),
                ),
            )
        # The audit lines travel with the commit: a crash before they are
        # appended cannot lose them (see `_complete_audit`).
        self.state.journal.record(
            txn,
            "commit",
            outcome=outcome,
            version=version,
            failed=failed,
            audit=[{"event": e, "details": d} for e, d in records],
        )

    def _applied_record(
        self,
        change: Change,
        txn: str,
        version: int,
        digest: str,
        previous: Applied,
        failed: dict[str, str],
    ) -> Applied:
        cp_version, override = previous.cp_version, previous.override
        if change.origin == "control-plane":
            cp_version, override = version, None
        elif change.override is not None and self.managed_by() is not None:
            override = Override(
                version=version,
                actor=change.actor,
                at=now_iso(),
                reason=change.override,
                digest=digest,
            )
        elif change.origin in _LOCAL_ORIGINS or change.replaces_override:
            # A local write, or a restore, replaces the revision a local override applied:
            # the override is over (status, the control-plane report and the dashboard).
            override = None
        return Applied(
            version=version,
            digest=digest,
            origin=change.origin,
            cp_version=cp_version,
            override=override,
            outcome="partial" if failed else "committed",
            txn=txn,
            applied_at=now_iso(),
            mode=change.mode,
            failed=failed,
            carried=dict(self._carrying),
            actor=change.actor,
            source=change.source,
        )

    def _audit_records(
        self,
        change: Change,
        txn: str,
        version: int,
        outcome: str,
        failed: dict[str, str],
        waiting: dict[str, str],
        healed: dict[str, list[str]],
    ) -> list[tuple[str, dict[str, Any]]]:
        if change.audit is not None:
            return change.audit(txn, failed, waiting, healed)
        details: dict[str, Any] = {
            "version": version,
            "txn": txn,
            "outcome": outcome,
            "failed": failed,
            "source": change.source,
            "origin": change.origin,
        }
        if waiting:
            details["waiting"] = waiting
        if healed:
            details["subsystems"] = sorted(healed)
            details["steps"] = sum(len(v) for v in healed.values())
        if change.override is not None:
            details["override"] = change.override
        return [(change.kind, details)]

    # -- crash recovery -------------------------------------------------------

    def recover(
        self, actor: str = "local", *, wait: float = 30.0, quiet: bool = False
    ) -> Transaction | None:
        """Recover an open transaction left by a crash (takes the lock when not held).

        Refused with `DamagedState` while a file recovery depends on is damaged;
        `quiet`: a busy lock is refused without an audit line (the loop retries).
        """
        self.refuse_if_damaged()
        with self.writer("recovery", actor, wait=wait, quiet=quiet):
            return self._recover_locked(actor)

    def _recover_locked(self, actor: str) -> Transaction | None:
        journal = self.state.journal
        if not self._audit_checked:
            self._audit_checked = True
            self._complete_audit()
        open_txn = journal.open_transaction()
        if open_txn is None:
            return None
        begin = open_txn.begin
        scope = Scope.from_json(begin["scope"])
        previous = begin.get("previous_applied") or {"version": 0}
        recorded = set(begin.get("all_subsystems") or begin.get("subsystems") or [])
        journal.record(open_txn.txn, "recovering", to_version=previous.get("version", 0))
        target = self._committed_document(previous)
        errors: list[str] = []
        naming = ownwrites.writing(f"trueup recovery rollback of {open_txn.txn}")
        with naming, self.sources() as net:
            if target is not None:
                # Forward to the last committed revision: never to a before-image
                # that may hold drift, never away from its management addresses.
                # Its scope widened by the transaction's: what either manages (the
                # firewall's table, sysctl names, WireGuard interfaces, …) is put back.
                target_scope = scope_for(target).union(scope)
                names = self._recovery_names(target, target_scope, recorded)
                # Preparation (a lookup, nft's canonical form) runs beside recovery, each
                # joined at its turn within its deadline: one that hangs or raises fails
                # its own subsystem, never the earlier tiers nor the recovery itself.
                preparation = Preparation(
                    target,
                    [self.by_name[n] for n in names if _prepares(self.by_name[n])],
                    {n: target.spec.convergence.deadline_for(n) for n in names},
                )
                for name in names:
                    sub = self.by_name[name]
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
                        self._converge_bounded(
                            net,
                            sub,
                            desired,
                            target_scope,
                            None,
                            target.spec.convergence.deadline_for(name),
                        )
                        journal.record(open_txn.txn, "recovered", subsystem=name)
                    except _STEP_ERRORS as exc:
                        errors.append(str(exc))
                        journal.record(open_txn.txn, "recovered", subsystem=name, error=str(exc))
                    faults.hit(f"recovery:{name}")
            else:
                # Nothing was ever committed: restore what was there before, except
                # management, which phase 1 brought up and nothing takes away.
                touched = [n for n in begin.get("subsystems", []) if n != "management"]
                errors = self._rollback(net, begin["before"], scope, touched)
        self.state.set_applied(previous)
        journal.record(
            open_txn.txn,
            "rolled_back",
            recovered=True,
            reason="interrupted before commit",
            to_version=previous.get("version", 0),
            errors=errors,
        )
        self.state.audit.append(
            "recovered",
            actor,
            txn=open_txn.txn,
            kind=open_txn.kind,
            version=begin.get("version"),
            restored_version=previous.get("version", 0),
            rollback_errors=errors,
        )
        return open_txn

    def _recovery_names(
        self, target: DeviceState, target_scope: Scope, recorded: set[str]
    ) -> list[str]:
        """What recovery converges to `target`: every subsystem the interrupted transaction
        could change or the committed revision manages.

        Tier order, whatever order the journal holds: management, network (links,
        addresses, firewall, sysctl), services, then optional ones (proxies,
        WireGuard) — never before what they depend on, each within its own deadline.
        """
        return [
            sub.name
            for sub in ordered(self.by_name.values())
            if sub.name in recorded or sub.configured(target) or target_scope.keys_for(sub.name)
        ]

    def _committed_document(self, applied: dict[str, Any]) -> DeviceState | None:
        version = int(applied.get("version", 0))
        if not version:
            return None
        record = self.state.revision(version, applied.get("digest"))
        if record is None:
            return None
        try:
            return self.with_override(parse_document(record["document"], f"revision {version}"))
        except DocumentError:
            return None

    def _settle_recovered(
        self, change: Change, version: int, digest: str, scope: Scope
    ) -> str | None:
        """Close what crash recovery left reported, once an unchanged write proves it moot.

        A write answered `unchanged` (observed equals desired, nothing to do)
        right after recovery rolled a transaction back: the system holds what
        it should, so `STATE_APPLY_NOT_COMPLETED` is over. The write leaves a
        transaction of its own in the journal (begin, commit `unchanged`,
        naming the recovered one), which status reports instead. Returns what
        was cleared, or None when recovery left nothing to report.
        """
        if change.kind == "reconcile":
            return None  # heals never answer an apply's interruption (`last_reported_transaction`)
        recovered = last_reported_transaction(self.state.journal.transactions())
        if recovered is None or not (recovered.terminal or {}).get("recovered"):
            return None
        cleared = (
            f"STATE_APPLY_NOT_COMPLETED cleared: transaction {recovered.txn} (version "
            f"{recovered.begin.get('version')}), rolled back at recovery, is answered: "
            f"observed equals version {version}"
        )
        journal = self.state.journal
        txn = journal.begin(
            kind=change.kind,
            origin=change.origin,
            version=version,
            mode=change.mode,
            digest=digest,
            actor=change.actor,
            subsystems=[],
            all_subsystems=[],
            scope=scope.to_json(),
            before={},
            previous_applied=self.state.applied().to_json(),
            steps={},
        )
        details = {
            "version": version,
            "txn": txn,
            "outcome": "unchanged",
            "source": change.source,
            "origin": change.origin,
            "settles": recovered.txn,
            "cleared": cleared,
        }
        journal.record(
            txn,
            "commit",
            outcome="unchanged",
            version=version,
            failed={},
            settles=recovered.txn,
            audit=[{"event": change.kind, "details": details}],
        )
        self.state.audit.append(change.kind, change.actor, **details)
        return cleared

    def _complete_audit(self) -> None:
        """Write the audit line of a transaction committed right before a crash."""
        last = self.state.journal.last()
        if last is None or last.terminal is None or last.terminal["type"] != "commit":
            return
        payload = last.terminal.get("audit")
        if not isinstance(payload, list) or not payload:
            return
        for record in reversed(self.state.audit.tail(max_bytes=1 << 20)):
            if record.get("details", {}).get("txn") == last.txn:
                return
        actor = str(last.begin.get("actor", "local"))
        for entry in payload:
            details = dict(entry.get("details", {}))
            details.setdefault("txn", last.txn)
            details["written_after_restart"] = True
            self.state.audit.append(str(entry.get("event", last.kind)), actor, **details)


def last_reported_transaction(transactions: Sequence[Transaction]) -> Transaction | None:
    """The transaction whose outcome status reports: the last one but ordinary heals.

    Heals converge to the applied version; they do not clear what the last
    apply (or its crash recovery) left to report. A heal a crash interrupted
    is reported itself (recovery closed it), until a later heal commits. Any
    later write that commits — an unchanged one after recovery included
    (`Committing._settle_recovered`) — is reported instead.
    """
    healed_since = False
    for transaction in reversed(transactions):
        if transaction.kind != "reconcile":
            return transaction
        terminal = transaction.terminal or {}
        if terminal.get("recovered") and not healed_since:
            return transaction
        if terminal.get("type") == "commit":
            healed_since = True
    return None
