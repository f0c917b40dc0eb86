"""One transaction from begin to commit, under the writer lock.

Part of the engine (`trueup.reconcile.transaction.Engine`): after the
checks, `begin` with the before-images, execution, verification, then the
commit or the rollback. docs/architecture.md "The write path" walks through it.

Why this module is over 400 lines: one transaction from begin to commit is
one method on purpose (every step reads the same before-images, plans and
failures; split, each piece would pass all of them around), and its writes
are named as trueup's own for the drift records (`trueup.system.ownwrites`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import replace
from typing import TYPE_CHECKING

from trueup.model.document import DeviceState, document_digest
from trueup.model.reasons import ReasonCode
from trueup.reconcile.attribution import item_label
from trueup.reconcile.changes import ApplyResult, Change, Refused, StorageError, own_label
from trueup.reconcile.checking import Checking, Preparation
from trueup.reconcile.committing import Committing
from trueup.reconcile.overriding import Overriding
from trueup.subsystems.base import Facts, Plan, Scope
from trueup.subsystems.registry import scope_for
from trueup.system import ownwrites
from trueup.system.sources import Sources

log = logging.getLogger("trueup.reconcile")


def _pinned(desired: Facts, observed: Facts, contested: Collection[str]) -> Facts:
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


__all__ = ["Transacting"]


class Transacting(Committing, Checking, Overriding):
    """One transaction from begin to commit, under the writer lock."""

    _current_kind: str | None = None
    failing: dict[str, str]

    if TYPE_CHECKING:

        def observe_bounded(
            self,
            net: Sources,
            scope: Scope,
            names: Collection[str] | None = None,
            errors: dict[str, str] | None = None,
            *,
            give_up: Callable[[], bool],
        ) -> dict[str, Facts] | None: ...

        def _preempted(self) -> bool: ...

        def observe(
            self,
            net: Sources,
            scope: Scope,
            names: Collection[str] | None = None,
            errors: dict[str, str] | None = None,
        ) -> dict[str, Facts]: ...

        def applied_document(self) -> DeviceState | None: ...

    def _transact_locked(
        self,
        change: Change,
        names: list[str],
        skipped: dict[str, str],
        preparation: Preparation | None = None,
    ) -> ApplyResult:
        self._current_kind = change.kind
        self._carrying = {}
        try:
            return self._transact_checked(change, names, skipped, preparation)
        finally:
            self._current_kind = None

    def _carried(
        self,
        change: Change,
        document: DeviceState,
        previous: DeviceState | None,
        scope: Scope,
        names: list[str],
    ) -> dict[str, str]:
        """Subsystems failing before this write whose section it leaves unchanged.

        They are left out of it (never converged, never a reason to roll it
        back) and keep their failure: a write is never refused, delayed or
        undone for a service it does not touch. The reconcile loop goes on
        healing them; a write that changes their section converges them.
        """
        return self._unchanged_of(
            change, document, previous, scope, {n: self.failing.get(n) for n in names}, "failing"
        )

    def _unchanged_of(
        self,
        change: Change,
        document: DeviceState,
        previous: DeviceState | None,
        scope: Scope,
        errors: dict[str, str | None],
        why: str,
    ) -> dict[str, str]:
        """Of `errors` (failing, or not observable), the subsystems this write leaves unchanged."""
        if change.kind == "reconcile" or previous is None:
            return {}
        out: dict[str, str] = {}
        for name, error in errors.items():
            if error is None or name == "management":
                continue
            sub = self.by_name[name]
            try:
                unchanged = sub.desired(document, scope) == sub.desired(previous, scope)
            except Exception:  # undecidable: converged as usual
                unchanged = False
            if unchanged:
                out[name] = (
                    f"{why} before this write and unchanged by it (left to the reconcile "
                    f"loop): {error}"
                )[:2000]
        return out

    def _transact_checked(
        self,
        change: Change,
        names: list[str],
        skipped: dict[str, str],
        preparation: Preparation | None,
    ) -> ApplyResult:
        state = self.state
        applied = state.applied()
        applied_version = applied.version
        # Before any revision, a console override is what management must not lose.
        previous = self.applied_document() or self._override_document()
        # A heal converges to what is applied *now*, under the lock: the caller
        # read the applied revision before recovery may have rolled back the
        # transaction a crash left open (whose applied record it then saw).
        stale = change.kind == "reconcile" and change.document.metadata.version != applied_version
        if stale and previous is not None and applied_version:
            change = replace(change, document=previous)
        digest = document_digest(change.document)
        version, same_version = self._resolve_version(change, applied, digest)
        self._check_origin(change, applied)
        document = change.document.with_version(version)
        self._guard(change, previous)
        scope = scope_for(document, previous)
        if change.former_virtual:
            scope = replace(
                scope, virtual_addresses=scope.virtual_addresses | change.former_virtual
            )
        heal = change.kind == "reconcile"
        carried = self._carried(change, document, previous, scope, names)
        self._carrying = carried
        names = [n for n in names if n not in carried]

        with self.sources() as net:
            unobservable: dict[str, str] = {}
            seen = self.observe_bounded(
                net, scope, names, errors=unobservable, give_up=self._preempted
            )
            if seen is None:
                raise Refused(
                    ReasonCode.CONCURRENT_MODIFICATION,
                    "heal deferred: an operator's write is waiting for the writer",
                )
            before = seen
            # A daemon that does not answer, its section unchanged by this write: carried
            # like a failing one, never a reason to refuse or roll back the write.
            for name, error in self._unchanged_of(
                change, document, previous, scope, dict(unobservable), "not observable"
            ).items():
                unobservable.pop(name)
                carried[name] = error
            skipped.update(unobservable)
            names = [n for n in names if n in before]
            targets = {
                n: _pinned(
                    self.by_name[n].desired(document, scope),
                    before[n],
                    change.contested.get(n, ()),
                )
                for n in names
            }
            # A preparation still running (a lookup that hangs) is joined at its
            # subsystem's turn in `_execute`: earlier tiers converge meanwhile.
            late = preparation.running() & set(names) if preparation is not None else set()
            if preparation is not None:
                skipped.update(
                    (n, e)
                    for n, e in preparation.finished_failures().items()
                    if n in names and n not in late
                )
            active = [n for n in names if n not in skipped]
            plans = {
                n: (
                    Plan(n, [], [])
                    if n in late
                    else self.by_name[n].plan(targets[n], before[n], scope)
                )
                for n in active
            }

            def settle(name: str) -> bool:
                """Join `name`'s preparation if it was still running; False when it failed."""
                if name not in late:
                    return True
                late.discard(name)
                error = preparation.wait(name) if preparation is not None else None
                if error:
                    skipped[name] = error
                    plans.pop(name, None)
                    return False
                sub = self.by_name[name]
                targets[name] = _pinned(
                    sub.desired(document, scope), before[name], change.contested.get(name, ())
                )
                plans[name] = sub.plan(targets[name], before[name], scope)
                return True

            if late and not any(p.changes for p in plans.values()):
                # Nothing earlier to converge: waiting holds nothing back.
                for name in [n for n in active if n in late]:
                    settle(name)
            unchanged = (
                not skipped
                and not any(p.changes for p in plans.values())
                and same_version
                and (heal or applied.outcome == "committed")
            )
            if unchanged:
                try:
                    cleared = self._settle_recovered(change, version, digest, scope)
                except OSError as exc:
                    raise StorageError(
                        f"{state.root}: cannot write the journal ({exc}); nothing was changed"
                    ) from exc
                return ApplyResult(
                    True,
                    version,
                    "unchanged",
                    plans=list(plans.values()),
                    digest=digest,
                    carried=carried,
                    cleared=[cleared] if cleared else [],
                )
            journal = state.journal
            try:
                txn = journal.begin(
                    kind=change.kind,
                    origin=change.origin,
                    version=version,
                    mode=change.mode,
                    digest=digest,
                    actor=change.actor,
                    subsystems=[n for n, p in plans.items() if p.changes or n in late],
                    all_subsystems=names,
                    scope=scope.to_json(),
                    before=before,
                    previous_applied=applied.to_json(),
                    steps={n: len(p.steps) for n, p in plans.items() if p.changes},
                )
            except OSError as exc:
                raise StorageError(
                    f"{state.root}: cannot write the journal ({exc}); nothing was changed"
                ) from exc
            touched: list[str] = []
            with ownwrites.writing(own_label(change.kind, txn)):
                try:
                    self._hit(change.kind, "begin")
                    failed: dict[str, str] = {}
                    waiting: dict[str, str] = {}
                    if change.only is not None and same_version and not heal:
                        # Subsystems outside this transaction keep the failures they had.
                        failed.update(
                            (name, error)
                            for name, error in dict(applied.failed).items()
                            if name not in change.only
                        )
                    for name, reason in skipped.items():
                        failed[name] = reason
                        journal.record(txn, "failed", subsystem=name, error=reason)
                    healed: dict[str, list[str]] = {}

                    def turn(name: str) -> bool:
                        if settle(name):
                            return True
                        failed[name] = skipped[name]
                        journal.record(txn, "failed", subsystem=name, error=skipped[name])
                        return False

                    self._execute(
                        net,
                        change,
                        txn,
                        plans,
                        targets,
                        scope,
                        failed,
                        waiting,
                        touched,
                        healed,
                        turn,
                    )
                    if not (failed and change.mode == "atomic"):
                        self._verify(
                            net,
                            change,
                            txn,
                            names,
                            skipped,
                            targets,
                            scope,
                            failed,
                            waiting,
                            touched,
                            healed,
                        )

                    if failed and change.mode == "atomic":
                        errors = self._rollback(net, before, scope, touched)
                        journal.record(
                            txn,
                            "rolled_back",
                            recovered=False,
                            reason="step failed",
                            errors=errors,
                            failed=failed,
                        )
                        state.audit.append(
                            f"{change.kind}_rolled_back"
                            if change.kind != "apply"
                            else "apply_rolled_back",
                            change.actor,
                            version=version,
                            txn=txn,
                            failed=failed,
                            rollback_errors=errors,
                            source=change.source,
                            origin=change.origin,
                        )
                        return ApplyResult(
                            False,
                            applied_version,
                            "rolled_back",
                            txn,
                            list(plans.values()),
                            failed,
                            errors,
                            waiting,
                            healed,
                            change.origin,
                            digest,
                            attempted=version,
                            carried=carried,
                        )

                    self._hit(change.kind, "before-commit")
                    settled = [n for n in names if n not in failed and n not in waiting]
                    outcome = "partial" if failed else "committed"
                    if heal:
                        outcome = "failed" if failed else "committed"
                    records = self._audit_records(
                        change, txn, version, outcome, failed, waiting, healed
                    )
                    self._commit(
                        change, txn, document, version, digest, applied, failed, settled, records
                    )
                    self._hit(change.kind, "after-commit")
                except OSError as exc:
                    raise self._storage_failure(
                        net, txn, before, scope, touched, applied, exc
                    ) from exc
        try:
            for event, details in records:
                state.audit.append(event, change.actor, **details)
        except OSError:
            # Committed; the lines travel with the journal's commit and are
            # written by the next transaction (see `_complete_audit`).
            self._audit_checked = False
        if not heal:
            self._settle_override(change, document, version)
        return ApplyResult(
            not failed,
            version,
            outcome,
            txn,
            list(plans.values()),
            failed,
            [],
            waiting,
            healed,
            change.origin,
            digest,
            carried=carried,
        )
