"""The one transaction writer: every change to the system goes through `Engine.transact`.

Who calls this: the CLI without a running agent, the agent's API, the
reconcile loop (heals are transactions of kind `reconcile`), confirm-timeout,
rollback, startup (phase 3) and crash recovery. Nothing else writes.

One transaction, in order:

1. preparation (`Subsystem.prepare`) of the subsystems it may change starts,
   in parallel, each within its deadline; the transaction waits for a
   subsystem's preparation only when that subsystem's turn comes (step 5),
   so a hanging lookup in a later tier never delays an earlier one; a
   subsystem that fails or hangs is recorded as failed and the others go on;
2. the writer lock (reentrant within a thread; another writer is refused
   with `STATE_CONCURRENT_MODIFICATION`), then recovery of any transaction a
   crash left open;
3. the checks, once for every caller: `If-Match` (expected version), the
   revision's origin and number (a control-plane revision is never skipped
   because a local apply took its number; a local apply on a managed device
   needs an explicit override), and the management guard;
4. `begin` in the write-ahead journal with every subsystem's before-image;
5. each subsystem converged in tier and dependency order, within its
   deadline; a subsystem whose dependency did not converge waits;
6. verification: every subsystem the transaction may change is observed
   again and converged until observed equals desired (the kernel has side
   effects: removing an address flushes the routes through it), so
   "committed" means the system matches the document;
7. commit: the revision, the applied record and the journal's `commit`
   (which carries the audit record, so a crash right after it cannot lose the
   audit line: the next transaction writes it), then the audit line.

An atomic transaction that fails is converged back to its before-images.
Recovery rule: an open transaction (a `begin` without `commit` or
`rolled_back`) is never resumed forward. The subsystems it could change are
converged to the last *committed* revision — never to a before-image that may
hold drift, and never away from its management addresses — and it is closed
as `rolled_back` with `recovered: true`. Converging to a recorded revision is
idempotent, so a crash during recovery is recovered the same way.
`STATE_APPLY_NOT_COMPLETED` is reported from that journal record until the
next committed transaction.

Why this module is over 400 lines: it is the engine's public face — the
system seams it builds (netlink, files, programs, nftables, daemons) and the
entry points every caller uses (transact, apply, rollback, plan, observe).
The steps of a transaction already live in their own modules (checking,
converging, committing, overriding); what remains is one class's interface,
and splitting it would scatter the one write path across files.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from trueup.journal.atomic import StateFileError, file_identity
from trueup.journal.damage import StateCheck
from trueup.journal.lock import LockBusy
from trueup.journal.state import StateDir
from trueup.model.document import DeviceState, DocumentError, parse_document
from trueup.model.reasons import ReasonCode
from trueup.model.virtual import virtual_addresses
from trueup.reconcile import faults
from trueup.reconcile.changes import (
    _STEP_ERRORS,
    CONTROL_PLANE_FILE,
    ApplyResult,
    Change,
    DamagedState,
    Mode,
    NeedsConfirmation,
    Origin,
    Refused,
    StorageError,
    UnknownRevision,
)
from trueup.reconcile.probes import StatusProbes
from trueup.reconcile.transacting import Transacting
from trueup.subsystems.base import Difference, Facts, Plan, Scope, Subsystem
from trueup.subsystems.registry import default_subsystems, scope_for
from trueup.system.announce import Announcer, KernelAnnouncer, NoAnnouncer
from trueup.system.daemon import Daemons, DaemonSupervisor
from trueup.system.netlink import CachedNetlink, Netlink
from trueup.system.nft import HostNftables, Nftables
from trueup.system.runner import Runner, SubprocessRunner
from trueup.system.sources import Files, HostFiles, Sources

__all__ = [
    "CONTROL_PLANE_FILE",
    "ApplyResult",
    "Change",
    "DamagedState",
    "Engine",
    "Mode",
    "NeedsConfirmation",
    "Origin",
    "Refused",
    "StorageError",
    "UnknownRevision",
]

NetlinkFactory = Callable[[], Netlink]

log = logging.getLogger("trueup.reconcile")


def _kernel_netlink() -> Netlink:
    from trueup.system.netlink import KernelNetlink

    return KernelNetlink()


class Engine(Transacting):
    def __init__(
        self,
        state: StateDir,
        subsystems: list[Subsystem] | None = None,
        netlink_factory: NetlinkFactory = _kernel_netlink,
        files: Files | None = None,
        runner: Runner | None = None,
        announcer: Announcer | None = None,
        nft: Nftables | None = None,
        daemons: Daemons | None = None,
    ) -> None:
        self.state = state
        self.subsystems = subsystems or default_subsystems()
        self.netlink_factory = netlink_factory
        self.files: Files = files if files is not None else HostFiles()
        self.runner: Runner = runner if runner is not None else SubprocessRunner()
        if announcer is None:
            kernel = netlink_factory is _kernel_netlink
            announcer = KernelAnnouncer() if kernel else NoAnnouncer()
        self.announcer: Announcer = announcer
        self.nft: Nftables = nft if nft is not None else HostNftables(self.runner)
        # The port the agent's API listens on when `--listen-port` overrides the
        # document's (the firewall's management check needs it); None: the document's.
        self.api_port: int | None = None
        # One supervisor for the engine's lifetime: daemons stay supervised between transactions.
        self.daemons: Daemons = (
            daemons if daemons is not None else DaemonSupervisor(state.root / "run")
        )
        self.by_name = {s.name: s for s in self.subsystems}
        # Which state files are damaged: writes they make unsafe are refused.
        self.check = StateCheck(state)
        # Set while no transaction runs in this process; the loop waits on it
        # instead of spinning while an apply is under way.
        self.idle = threading.Event()
        self.idle.set()
        self._owner: int | None = None
        # The applied revision parsed, keyed by its file's identity (every pass needs it).
        self._parsed: tuple[tuple[object, ...], DeviceState] | None = None
        self._depth = 0
        self._audit_checked = False
        # Operator writers (apply, rollback, restore, management) waiting for the writer
        # lock right now: a heal yields to them (`writer_wanted`, docs/architecture.md).
        self._wanted = 0
        # Per subsystem, the last worker converging it (`_converge_bounded`): one that was
        # abandoned finishes its step before the next convergence of that subsystem starts.
        self._abandoned: dict[str, threading.Thread] = {}
        self._wanted_lock = threading.Lock()
        # Subsystems whose last convergence failed (subsystem → error): a write that
        # leaves their section unchanged carries the failure instead of waiting on it.
        # Status' bounded looks at subsystems that may block (`trueup.reconcile.probes`).
        self.status_probes = StatusProbes(self.sources)
        self.failing: dict[str, str] = dict(state.applied().get("failed") or {})
        self.failing.update(state.applied().get("carried") or {})

    @contextmanager
    def sources(self, memo: dict[str, Any] | None = None) -> Iterator[Sources]:
        """The system for one piece of work: a netlink handle (one dump per table), files, programs.

        `memo`: the memo of the piece of work this one belongs to (a transaction's worker).
        """
        sources = Sources(
            CachedNetlink(self.netlink_factory()),
            self.files,
            self.runner,
            self.announcer,
            self.nft,
            state_dir=self.state.root,
            daemons=self.daemons,
            memo={} if memo is None else memo,
        )
        try:
            yield sources
        finally:
            sources.close()

    # -- documents ----------------------------------------------------------
    def applied_document(self) -> DeviceState | None:
        """The applied revision, with a console management override laid over it."""
        document = self.applied_revision()
        return self.with_override(document) if document is not None else None

    def applied_revision(self) -> DeviceState | None:
        """The applied revision as it was accepted (no override)."""
        applied = self.state.applied()
        version = int(applied.get("version", 0))
        if not version:
            return None
        key = (version, applied.get("digest"), file_identity(self.state.revision_file(version)))
        if self._parsed is not None and self._parsed[0] == key and key[2] is not None:
            return self._parsed[1]
        record = self.state.revision(version, key[1])
        if record is None:
            return None
        self._parsed = (key, parse_document(record["document"], f"revision {version}"))
        return self._parsed[1]

    def _keep_parsed(self, document: DeviceState) -> None:
        """The revision just committed is the applied one: keep `document` as its parse.

        The revision file holds `document.canonical()`, so parsing it again would
        give the same document; the key is the one `applied_revision` checks.
        """
        applied = self.state.applied()
        version = int(applied.get("version", 0))
        key = (version, applied.get("digest"), file_identity(self.state.revision_file(version)))
        if key[2] is not None and document.metadata.version == version:
            self._parsed = (key, document)

    # -- the console's management override (`trueup management set`) ---------------
    def managed_by(self) -> str | None:
        """The control plane's URL when this device is managed by one."""
        record = self.state.read(CONTROL_PLANE_FILE, {}) or {}
        url = record.get("url") if isinstance(record, dict) else None
        return str(url) if url else None

    def revision_document(self, version: int | None) -> tuple[int, DeviceState]:
        """An accepted revision to roll back to (default: the one before the applied one)."""
        applied_version = int(self.state.applied().get("version", 0))
        candidates = [v for v in self.state.revision_versions() if v < applied_version]
        target = version if version is not None else (candidates[-1] if candidates else None)
        record = self.state.revision(target) if target is not None else None
        if target is None or record is None:
            known = ", ".join(map(str, self.state.revision_versions())) or "none"
            raise UnknownRevision(
                f"--to {target}: no accepted revision {target} to roll back to "
                f"(accepted revisions: {known}); nothing was changed"
                if target is not None
                else "no earlier accepted revision to roll back to; nothing was changed"
            )
        return target, parse_document(record["document"], f"revision {target}")

    # -- observation --------------------------------------------------------
    def observe(
        self,
        net: Sources,
        scope: Scope,
        names: Collection[str] | None = None,
        errors: dict[str, str] | None = None,
    ) -> dict[str, Facts]:
        """Each subsystem's facts. One that cannot be observed is left out, its error in `errors`.

        A daemon that does not answer, a file the kernel refuses to show: one
        subsystem's observation failing never stops the others (a later tier
        never blocks an earlier one). Without `errors`, the failure is raised.
        """
        out: dict[str, Facts] = {}
        for sub in self.subsystems:
            if names is not None and sub.name not in names:
                continue
            try:
                out[sub.name] = sub.observe(net, scope)
            except _STEP_ERRORS as exc:
                if errors is None:
                    raise
                errors[sub.name] = f"cannot observe {sub.name}: {exc}"
        return out

    def plan(self, document: DeviceState, net: Sources | None = None) -> list[Plan]:
        scope = scope_for(document, self.applied_document())
        if net is None:
            with self.sources() as opened:
                return self.plan(document, opened)
        errors: dict[str, str] = {}
        refused = self._preparation_failures(document)
        observed = self.observe(net, scope, errors=errors)
        plans: list[Plan] = []
        for s in self.subsystems:
            if s.name in refused:
                plans.append(Plan(s.name, [], [], error=refused[s.name]))
            elif s.name in observed:
                desired = s.desired(document, scope)
                have = observed[s.name]
                made = s.plan(desired, have, scope)
                values = {
                    step.path: {"old": have.get(step.path), "new": desired.get(step.path)}
                    for step in made.steps
                    if step.path in desired or step.path in have
                }
                plans.append(replace(made, values=values))
            else:
                plans.append(Plan(s.name, [], [errors[s.name]]))
        return plans

    def _preparation_failures(self, document: DeviceState) -> dict[str, str]:
        """What an apply's preparation would refuse (an nft rule, …), so plan says it too."""
        failures: dict[str, str] = {}
        for sub in self.subsystems:
            if type(sub).prepare is Subsystem.prepare or not sub.configured(document):
                continue
            try:
                sub.prepare(document)
            except Exception as exc:  # reported per subsystem, as an apply reports it
                failures[sub.name] = f"preparation failed: {exc}"
        return failures

    def differences(
        self,
        document: DeviceState,
        net: Sources,
        names: list[str] | None = None,
        errors: dict[str, str] | None = None,
    ) -> dict[str, list[Difference]]:
        """Observed against desired, per subsystem; unobservable ones go to `errors`."""
        scope = scope_for(document)
        failures: dict[str, str] = {} if errors is None else errors
        observed = self.observe(net, scope, names, errors=failures)
        return {
            s.name: s.diff(s.desired(document, scope), observed[s.name])
            for s in self.subsystems
            if s.name in observed
        }

    # -- the writer lock ----------------------------------------------------
    def _refuse(self, code: ReasonCode, message: str, actor: str, **evidence: Any) -> Refused:
        with contextlib.suppress(OSError):  # a full disk must not hide the refusal
            self.state.audit.append("refused", actor, code=code.value, message=message, **evidence)
        return Refused(code, message, **evidence)

    @property
    def active(self) -> bool:
        return not self.idle.is_set()

    @contextmanager
    def wanting(self) -> Iterator[None]:
        """Mark an operator's write as waiting for the writer: heals yield to it meanwhile."""
        with self._wanted_lock:
            self._wanted += 1
        try:
            yield
        finally:
            with self._wanted_lock:
                self._wanted -= 1

    def writer_wanted(self) -> bool:
        """Whether an operator's write waits for (or holds) the writer in this agent."""
        return self._wanted > 0

    def _preempted(self) -> bool:
        """A heal running while an operator's write waits: it abandons what is left."""
        return self._current_kind == "reconcile" and self.writer_wanted()

    def observe_bounded(
        self,
        net: Sources,
        scope: Scope,
        names: Collection[str] | None = None,
        errors: dict[str, str] | None = None,
        *,
        give_up: Callable[[], bool],
    ) -> dict[str, Facts] | None:
        """`observe`, abandoned (None) as soon as `give_up()` holds.

        Subsystems that may block (a daemon's socket) are observed on a worker
        with a handle of their own, so a daemon that does not answer never keeps
        the caller (a heal, the loop's pass) from yielding to an operator's write.
        """
        out: dict[str, Facts] = {}
        for sub in self.subsystems:
            if names is not None and sub.name not in names:
                continue
            if give_up():
                return None
            if not sub.may_block:
                out.update(self.observe(net, scope, [sub.name], errors))
                continue
            found: dict[str, Facts] = {}
            failures: dict[str, str] = {}
            raised: list[BaseException] = []

            def work(sub: Subsystem = sub, found: dict[str, Facts] = found,
                     failures: dict[str, str] = failures, raised: list[BaseException] = raised
                     ) -> None:  # fmt: skip
                try:
                    with self.sources(net.memo) as own:
                        kept = failures if errors is not None else None
                        found.update(self.observe(own, scope, [sub.name], kept))
                except BaseException as exc:  # reported to the waiting thread
                    raised.append(exc)

            worker = threading.Thread(target=work, name=f"observe-{sub.name}", daemon=True)
            worker.start()
            while worker.is_alive():
                worker.join(0.05)
                if worker.is_alive() and give_up():
                    return None
            if raised:
                if errors is None:
                    raise raised[0]
                errors[sub.name] = f"cannot observe {sub.name}: {raised[0]}"
                continue
            if errors is not None:
                errors.update(failures)
            out.update(found)
        return out

    @contextmanager
    def writer(
        self, purpose: str, actor: str, wait: float = 0.0, *, quiet: bool = False
    ) -> Iterator[None]:
        """The writer lock; reentrant for the thread that holds it.

        A busy lock raises `Refused` (`STATE_CONCURRENT_MODIFICATION`), audited
        unless `quiet` (the reconcile loop defers and tries again).
        """
        me = threading.get_ident()
        if self._owner == me:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        try:
            lock = self.state.writer_lock(purpose, wait)
            if quiet:
                lock.__enter__()
            else:
                with self.wanting():  # a heal holding it yields
                    lock.__enter__()
        except OSError as exc:
            raise StorageError(
                f"{self.state.root}: cannot take the writer lock ({exc}); nothing was changed"
            ) from exc
        except LockBusy as exc:
            if quiet:
                raise Refused(
                    ReasonCode.CONCURRENT_MODIFICATION, str(exc), holder=exc.holder
                ) from None
            raise self._refuse(
                ReasonCode.CONCURRENT_MODIFICATION, str(exc), actor, holder=exc.holder
            ) from None
        self._owner, self._depth = me, 1
        self.idle.clear()
        try:
            yield
        finally:
            self._owner, self._depth = None, 0
            self.idle.set()
            lock.__exit__(None, None, None)

    # -- compatibility entry points -------------------------------------------
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
        origin: Origin = "local-cli",
        only: Collection[str] | None = None,
        skipped: dict[str, str] | None = None,
        deadlines: dict[str, float] | None = None,
        management_confirmed: bool = False,
        override: str | None = None,
        former_virtual: Collection[str] = (),
    ) -> ApplyResult:
        """`transact` with keyword arguments; raises `Refused` or `NeedsConfirmation`."""
        if kind == "reconcile":
            return self.transact(
                Change.heal(
                    document,
                    actor=actor,
                    origin=origin,
                    only=only,
                    skipped=skipped,
                    lock_wait=lock_wait,
                    source=source,
                    deadlines=deadlines,
                    former_virtual=former_virtual,
                )
            )
        change = Change.apply(
            document,
            origin=origin,
            actor=actor,
            mode=mode,
            expect_version=expect_version,
            override=override,
            source=source,
            lock_wait=lock_wait,
            only=only,
            skipped=skipped,
            deadlines=deadlines,
            management_confirmed=management_confirmed,
            former_virtual=former_virtual,
        )
        return self.transact(change if kind == "apply" else replace(change, kind=kind))

    def former_virtual_addresses(self) -> frozenset[str]:
        """The HA virtual addresses of the accepted revision before the applied one.

        A start releases them wherever nobody holds them (docs/ha.md): a former
        VIP left on an interface after a reboot or a crash is nobody's.
        """
        try:
            _, previous = self.revision_document(None)
        except (UnknownRevision, DocumentError, StateFileError, OSError, ValueError):
            return frozenset()
        return frozenset(virtual_addresses(previous))

    def rollback_to(
        self,
        version: int | None,
        *,
        actor: str = "local",
        expect_version: int | None = None,
        management_confirmed: bool = False,
        override: str | None = None,
    ) -> ApplyResult:
        """Re-apply an earlier accepted revision's content as a new version."""
        applied_version = int(self.state.applied().get("version", 0))
        target, document = self.revision_document(version)
        return self.transact(
            Change.rollback(
                document,
                target=target,
                applied_version=applied_version,
                actor=actor,
                expect_version=expect_version,
                management_confirmed=management_confirmed,
                override=override,
            )
        )

    # -- the transaction ------------------------------------------------------
    def transact(self, change: Change) -> ApplyResult:
        """Apply `change` as one journaled, verified transaction.

        Raises `Refused` (nothing changed, with its reason code) or
        `NeedsConfirmation` (a management change without a confirmation).
        """
        self.refuse_if_damaged()
        if change.kind == "reconcile" and change.mode == "atomic":
            # A heal converges towards the committed revision: what worked stays,
            # so a failing link never takes restored management addresses away.
            change = replace(change, mode="best-effort")
        names = self._names(change.only)
        skipped = dict(change.skipped)
        # Preparation runs beside the transaction: each subsystem's is joined at its turn.
        preparation = self._prepare(change, [n for n in names if n not in skipped])
        preparation.settle_if_alone([n for n in names if n not in skipped])
        quiet = change.kind == "reconcile"
        with self.writer(change.kind, change.actor, change.lock_wait, quiet=quiet):
            try:
                self._recover_locked(change.actor)
            except OSError as exc:
                raise StorageError(
                    f"{self.state.root}: recovering an open transaction needs a write that "
                    f"failed ({exc}); nothing else was changed"
                ) from exc
            result = self._transact_locked(change, names, skipped, preparation)
        self._note_failing(change, names, result)
        return result

    def _note_failing(self, change: Change, names: list[str], result: ApplyResult) -> None:
        """Which subsystems failed their last convergence (what a later write may carry)."""
        if result.outcome == "rolled_back":
            return  # nothing changed: what was failing still is
        for name in names:
            if name in result.failed:
                self.failing[name] = result.failed[name]
            elif name in result.carried or name in result.waiting:
                continue
            elif change.kind != "reconcile" or name in result.healed:
                self.failing.pop(name, None)

    def settle_in_sync(self, names: Collection[str], actor: str = "reconcile") -> list[str]:
        """Subsystems seen in sync with the applied revision are failing no more.

        A failure recorded by a transaction (`failed`, `carried`, `Engine.failing`)
        is otherwise cleared only by a transaction that converges the subsystem;
        one that recovered by itself (a daemon the supervisor restarted once its
        port was free) has nothing to heal, so no transaction comes, and every
        later write would carry its old failure. The reconcile loop calls this
        with what its pass saw in sync. Returns the names settled in the record.
        """
        names = set(names)
        for name in names:
            self.failing.pop(name, None)
        applied = self.state.applied()
        failed = dict(applied.get("failed") or {})
        carried = dict(applied.get("carried") or {})
        if not names & (failed.keys() | carried.keys()) or not applied.get("version"):
            return []
        try:
            with self.writer("reconcile", actor, quiet=True):
                applied = self.state.applied()  # under the lock: what is recorded now
                failed = dict(applied.get("failed") or {})
                carried = dict(applied.get("carried") or {})
                settled = sorted(names & (failed.keys() | carried.keys()))
                if not settled or not applied.get("version"):
                    return []
                record = dict(applied)
                record["failed"] = {n: e for n, e in failed.items() if n not in names}
                record["carried"] = {n: e for n, e in carried.items() if n not in names}
                if applied.get("outcome") == "partial" and not record["failed"]:
                    record["outcome"] = "committed"
                self.state.set_applied(record)
                self.state.audit.append(
                    "failure_settled",
                    actor,
                    version=applied.get("version"),
                    subsystems=settled,
                    why="seen in sync with the applied revision",
                )
                return settled
        except (Refused, StorageError, OSError, StateFileError):
            return []  # a writer is busy or the directory refuses: the next pass again

    def _names(self, only: Collection[str] | None) -> list[str]:
        return [s.name for s in self.subsystems if only is None or s.name in only]

    @staticmethod
    def _hit(kind: str, point: str) -> None:
        faults.hit(point)
        faults.hit(f"{kind}/{point}")
