"""Journaled transactions: apply a document, roll back, recover after a crash.

Who calls this: the CLI (`plan`, `apply`, `rollback` without a running agent),
the agent's API and its reconcile loop. Everything that changes the system
goes through `Engine.apply_document` or `Engine.recover`, under the writer
lock, with a write-ahead journal record before every action.

Recovery rule: an open transaction (a `begin` without `commit` or
`rolled_back`) is never resumed forward. Its subsystems are converged back to
the before-images recorded in `begin`, the applied record it replaced is
restored, and it is closed as `rolled_back` with `recovered: true`. Because
rollback converges to a recorded image, running it twice is harmless, and
nothing is applied twice. `STATE_APPLY_NOT_COMPLETED` is reported from that
journal record until the next committed transaction.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from trueup.journal.audit import now_iso
from trueup.journal.journal import Transaction
from trueup.journal.lock import LockBusy
from trueup.journal.state import StateDir
from trueup.model.document import DeviceState, document_digest, parse_document
from trueup.model.reasons import ReasonCode
from trueup.reconcile import faults
from trueup.subsystems.base import Difference, Facts, Plan, Scope, Step, StepError, Subsystem
from trueup.subsystems.registry import default_subsystems, scope_for
from trueup.system.netlink import CachedNetlink, Netlink

__all__ = ["ApplyResult", "Engine", "Mode", "Refused", "UnknownRevision"]

Mode = Literal["atomic", "best-effort"]
NetlinkFactory = Callable[[], Netlink]


_CONVERGE_PASSES = 3


class UnknownRevision(LookupError):
    """A rollback target that is not among the accepted revisions."""


class Refused(Exception):
    """A write refused before anything changed, with the reason code that explains it."""

    def __init__(self, code: ReasonCode, message: str, **evidence: Any) -> None:
        self.code = code
        self.evidence = evidence
        super().__init__(message)


@dataclass
class ApplyResult:
    ok: bool
    version: int
    outcome: str  # committed | partial | rolled_back | unchanged
    txn: str | None = None
    plans: list[Plan] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    rollback_errors: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "version": self.version,
            "outcome": self.outcome,
            "txn": self.txn,
            "steps": [s.describe() for p in self.plans for s in p.steps],
            "failed": self.failed,
            "rollback_errors": self.rollback_errors,
        }


def _kernel_netlink() -> Netlink:
    from trueup.system.netlink import KernelNetlink

    return KernelNetlink()


class Engine:
    def __init__(
        self,
        state: StateDir,
        subsystems: list[Subsystem] | None = None,
        netlink_factory: NetlinkFactory = _kernel_netlink,
    ) -> None:
        self.state = state
        self.subsystems = subsystems or default_subsystems()
        self.netlink_factory = netlink_factory
        self.by_name = {s.name: s for s in self.subsystems}

    @contextmanager
    def netlink(self) -> Iterator[Netlink]:
        net = CachedNetlink(self.netlink_factory())
        try:
            yield net
        finally:
            net.close()

    # -- documents ----------------------------------------------------------
    def applied_document(self) -> DeviceState | None:
        version = int(self.state.applied().get("version", 0))
        if not version:
            return None
        record = self.state.revision(version)
        if record is None:
            return None
        return parse_document(record["document"], f"revision {version}")

    # -- observation --------------------------------------------------------
    def observe(
        self, net: Netlink, scope: Scope, names: list[str] | None = None
    ) -> dict[str, Facts]:
        return {
            s.name: s.observe(net, scope)
            for s in self.subsystems
            if names is None or s.name in names
        }

    def plan(self, document: DeviceState, net: Netlink | None = None) -> list[Plan]:
        scope = scope_for(document, self.applied_document())
        if net is None:
            with self.netlink() as opened:
                return self.plan(document, opened)
        return [
            s.plan(s.desired(document, scope), s.observe(net, scope), scope)
            for s in self.subsystems
        ]

    def differences(
        self, document: DeviceState, net: Netlink, names: list[str] | None = None
    ) -> dict[str, list[Difference]]:
        scope = scope_for(document)
        out: dict[str, list[Difference]] = {}
        for s in self.subsystems:
            if names is None or s.name in names:
                out[s.name] = s.diff(s.desired(document, scope), s.observe(net, scope))
        return out

    # -- writes -------------------------------------------------------------
    def _refuse(self, code: ReasonCode, message: str, actor: str, **evidence: Any) -> Refused:
        self.state.audit.append("refused", actor, code=code.value, message=message, **evidence)
        return Refused(code, message, **evidence)

    @contextmanager
    def writer(self, purpose: str, actor: str, wait: float = 0.0) -> Iterator[None]:
        try:
            with self.state.writer_lock(purpose, wait):
                yield
        except LockBusy as exc:
            raise self._refuse(
                ReasonCode.CONCURRENT_MODIFICATION, str(exc), actor, holder=exc.holder
            ) from None

    def apply_document(
        self,
        document: DeviceState,
        *,
        mode: Mode = "atomic",
        expect_version: int | None = None,
        actor: str = "local",
        kind: str = "apply",
        lock_wait: float = 0.0,
        source: str = "",
        allow_same_version: bool = False,
        only: Collection[str] | None = None,
        skipped: dict[str, str] | None = None,
        deadlines: dict[str, float] | None = None,
    ) -> ApplyResult:
        """Apply under the writer lock; raise `Refused` when nothing may change.

        `only` limits the transaction to some subsystems; `skipped` names
        subsystems that could not start (recorded as failed, with the reason);
        `deadlines` bounds each subsystem's work in seconds.
        """
        with self.writer(kind, actor, lock_wait):
            self.recover(actor=actor)
            return self._apply_locked(
                document,
                mode=mode,
                expect_version=expect_version,
                actor=actor,
                kind=kind,
                source=source,
                allow_same_version=allow_same_version,
                only=set(only) if only is not None else None,
                skipped=dict(skipped or {}),
                deadlines=deadlines,
            )

    def _apply_locked(
        self,
        document: DeviceState,
        *,
        mode: Mode,
        expect_version: int | None,
        actor: str,
        kind: str,
        source: str,
        allow_same_version: bool,
        only: set[str] | None = None,
        skipped: dict[str, str] | None = None,
        deadlines: dict[str, float] | None = None,
    ) -> ApplyResult:
        skipped = skipped or {}
        applied = self.state.applied()
        applied_version = int(applied.get("version", 0))
        if expect_version is not None and expect_version != applied_version:
            raise self._refuse(
                ReasonCode.CONCURRENT_MODIFICATION,
                f"expected applied version {expect_version} but the device is at "
                f"{applied_version}; nothing was changed",
                actor,
                expected=expect_version,
                applied=applied_version,
            )
        digest = document_digest(document)
        version = document.metadata.version
        if version is None:
            same = applied.get("digest") == digest and applied.get("outcome") == "committed"
            version = applied_version if same and applied_version else applied_version + 1
        elif version < applied_version:
            raise self._refuse(
                ReasonCode.VERSION_SKEW,
                f"document version {version} is older than the applied version "
                f"{applied_version}; versions only grow",
                actor,
                document_version=version,
                applied=applied_version,
            )
        elif (
            version == applied_version
            and applied.get("digest") != digest
            and not (allow_same_version)
        ):
            raise self._refuse(
                ReasonCode.VERSION_SKEW,
                f"version {version} is already applied with different content; "
                "give the new document a higher version (or omit it)",
                actor,
                document_version=version,
                applied=applied_version,
            )
        document = document.with_version(version)
        previous = self.applied_document()
        scope = scope_for(document, previous)
        names = [s.name for s in self.subsystems]

        with self.netlink() as net:
            before = self.observe(net, scope)
            active = [
                s
                for s in self.subsystems
                if (only is None or s.name in only) and s.name not in skipped
            ]
            plans = [s.plan(s.desired(document, scope), before[s.name], scope) for s in active]
            if (
                not skipped
                and not any(p.changes for p in plans)
                and version == applied_version
                and (applied.get("outcome") == "committed")
            ):
                return ApplyResult(True, version, "unchanged", plans=plans)
            journal = self.state.journal
            txn = journal.begin(
                kind=kind,
                version=version,
                mode=mode,
                digest=digest,
                actor=actor,
                subsystems=[p.subsystem for p in plans if p.changes],
                all_subsystems=names,
                scope=scope.to_json(),
                before=before,
                previous_applied=applied,
                steps={p.subsystem: len(p.steps) for p in plans if p.changes},
            )
            faults.hit("begin")
            failed: dict[str, str] = {}
            if only is not None and version == applied_version:
                # Subsystems outside this transaction keep the failures they had.
                failed.update(
                    (name, error)
                    for name, error in dict(applied.get("failed", {})).items()
                    if name not in only
                )
            for name, reason in skipped.items():
                failed[name] = reason
                journal.record(txn, "failed", subsystem=name, error=reason)
            touched: list[str] = []
            for plan in plans:
                if not plan.changes:
                    continue
                subsystem = self.by_name[plan.subsystem]
                touched.append(subsystem.name)
                try:
                    desired = subsystem.desired(document, scope)
                    if deadlines is not None:
                        self._converge_with_deadline(
                            subsystem, desired, scope, deadlines.get(subsystem.name, 90.0)
                        )
                    else:
                        self._converge(
                            net,
                            subsystem,
                            desired,
                            scope,
                            plan,
                            fault_point=f"step:{subsystem.name}",
                        )
                except (StepError, ValueError) as exc:
                    failed[subsystem.name] = str(exc)
                    journal.record(txn, "failed", subsystem=subsystem.name, error=str(exc))
                    if mode == "atomic":
                        break
                    continue
                journal.record(txn, "applied", subsystem=subsystem.name, steps=len(plan.steps))
                faults.hit(f"applied:{subsystem.name}")

            if failed and mode == "atomic":
                errors = self._rollback(net, txn, before, scope, touched)
                journal.record(
                    txn,
                    "rolled_back",
                    recovered=False,
                    reason="step failed",
                    errors=errors,
                    failed=failed,
                )
                self.state.audit.append(
                    "apply_rolled_back",
                    actor,
                    version=version,
                    txn=txn,
                    failed=failed,
                    rollback_errors=errors,
                    source=source,
                )
                return ApplyResult(
                    False, applied_version, "rolled_back", txn, plans, failed, errors
                )

            faults.hit("before-commit")
            outcome = "partial" if failed else "committed"
            self.state.save_revision(
                version,
                document.canonical(),
                accepted_at=now_iso(),
                actor=actor,
                source=source,
                txn=txn,
            )
            self.state.set_applied(
                {
                    "version": version,
                    "digest": digest,
                    "outcome": outcome,
                    "txn": txn,
                    "applied_at": now_iso(),
                    "mode": mode,
                    "failed": failed,
                    "actor": actor,
                }
            )
            journal.record(txn, "commit", outcome=outcome, version=version, failed=failed)
            faults.hit("after-commit")
        self.state.audit.append(
            "apply" if kind == "apply" else kind,
            actor,
            version=version,
            txn=txn,
            outcome=outcome,
            failed=failed,
            source=source,
            steps=sum(len(p.steps) for p in plans),
        )
        return ApplyResult(not failed, version, outcome, txn, plans, failed)

    def _converge(
        self,
        net: Netlink,
        subsystem: Subsystem,
        desired: Facts,
        scope: Scope,
        plan: Plan | None = None,
        fault_point: str | None = None,
        cancel: threading.Event | None = None,
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
                if cancel is not None and cancel.is_set():
                    raise StepError(step, "cancelled: the subsystem's deadline passed")
                subsystem.execute(net, step)
                if index == 0 and attempt == 0 and fault_point:
                    faults.hit(fault_point)
            plan = subsystem.plan(desired, subsystem.observe(net, scope), scope)
            if not plan.changes:
                return
        raise StepError(
            plan.steps[0],
            f"still differs after {_CONVERGE_PASSES} passes; something else is changing it",
        )

    def _converge_with_deadline(
        self, subsystem: Subsystem, desired: Facts, scope: Scope, seconds: float
    ) -> None:
        """Converge on a worker thread with its own netlink handle; give up at the deadline.

        A subsystem whose work hangs (a daemon that never answers) fails at its
        deadline and the transaction moves on; the abandoned worker is told to
        stop before its next step.
        """
        cancel = threading.Event()
        outcome: list[BaseException | None] = []

        def work() -> None:
            try:
                with self.netlink() as net:
                    self._converge(net, subsystem, desired, scope, cancel=cancel)
                outcome.append(None)
            except BaseException as exc:  # reported to the waiting thread
                outcome.append(exc)

        worker = threading.Thread(target=work, name=f"trueup-{subsystem.name}", daemon=True)
        worker.start()
        worker.join(seconds)
        if worker.is_alive():
            cancel.set()
            raise StepError(
                Step(subsystem.name, "converge", f"subsystem {subsystem.name}"),
                f"deadline of {seconds:g}s exceeded",
            )
        if outcome and outcome[0] is not None:
            raise outcome[0]

    def _rollback(
        self, net: Netlink, txn: str, before: dict[str, Facts], scope: Scope, touched: list[str]
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
                self._converge(net, subsystem, before[name], exact)
            except (StepError, ValueError) as exc:
                errors.append(str(exc))
            faults.hit(f"rollback:{name}")
        # Restoring a later subsystem can disturb an earlier one (a link brought
        # down flushes its IPv6 addresses); one more pass in order settles it.
        for name in touched:
            subsystem = self.by_name.get(name)
            if subsystem is not None and name in before:
                try:
                    self._converge(net, subsystem, before[name], exact)
                except (StepError, ValueError) as exc:
                    errors.append(str(exc))
        return errors

    def recover(self, actor: str = "local") -> Transaction | None:
        """Roll back an open transaction left by a crash. Caller holds the writer lock."""
        journal = self.state.journal
        open_txn = journal.open_transaction()
        if open_txn is None:
            return None
        begin = open_txn.begin
        scope = Scope.from_json(begin["scope"])
        touched = list(begin.get("subsystems", []))
        with self.netlink() as net:
            errors = self._rollback(net, open_txn.txn, begin["before"], scope, touched)
        previous = begin.get("previous_applied") or {"version": 0}
        self.state.set_applied(previous)
        journal.record(
            open_txn.txn,
            "rolled_back",
            recovered=True,
            reason="interrupted before commit",
            errors=errors,
        )
        self.state.audit.append(
            "recovered",
            actor,
            txn=open_txn.txn,
            version=begin.get("version"),
            rollback_errors=errors,
        )
        return open_txn

    def rollback_to(
        self, version: int | None, *, actor: str = "local", expect_version: int | None = None
    ) -> ApplyResult:
        """Re-apply an earlier accepted revision's content as a new version."""
        with self.writer("rollback", actor):
            self.recover(actor=actor)
            applied_version = int(self.state.applied().get("version", 0))
            candidates = [v for v in self.state.revision_versions() if v < applied_version]
            target = version if version is not None else (candidates[-1] if candidates else None)
            record = self.state.revision(target) if target is not None else None
            if record is None:
                known = ", ".join(map(str, self.state.revision_versions())) or "none"
                raise UnknownRevision(
                    f"--to {target}: no accepted revision {target} to roll back to "
                    f"(accepted revisions: {known}); nothing was changed"
                    if target is not None
                    else "no earlier accepted revision to roll back to; nothing was changed"
                )
            document = parse_document(record["document"], f"revision {target}")
            document = document.with_version(applied_version + 1)
            return self._apply_locked(
                document,
                mode="atomic",
                expect_version=expect_version,
                actor=actor,
                kind="rollback",
                source=f"revision {target}",
                allow_same_version=False,
            )
