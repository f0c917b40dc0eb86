"""The engine: the state directory, the system seams, the writer lock and `transact`.

Everything a transaction does is in the modules beside this one, as
functions over a `TransactionRun` (see the package's docstring for the
walk); reading the system is `trueup.reconcile.engine.observe` and the
console override `trueup.reconcile.engine.override`, which callers call
with the engine. `Engine` holds what outlives one transaction: the state
directory, the subsystems, the system seams it opens (`sources`), the
writer lock, the daemons it supervises and the failures a later write may
carry. Beside `transact` it keeps a few named entry points, each a few lines
over it: the applied revision (parsed once), `plan`, `apply_document`,
`rollback_to`, `recover` and `settle_in_sync`.

Why this module is over 400 lines: it is the engine's public face — the
constructor that wires the system seams (netlink, files, programs,
nftables, daemons), the writer lock, `transact`, and the few entry points
over it (the applied revision, rollback, recovery, the failures a pass
settles); their bodies are in the modules beside it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import replace

from trueup.journal.atomic import StateFileError, file_identity
from trueup.journal.damage import StateCheck
from trueup.journal.journal import Transaction
from trueup.journal.lock import LockBusy
from trueup.journal.override import OVERRIDE_FILE
from trueup.journal.state import StateDir
from trueup.model.document import DeviceState, DocumentError, parse_document
from trueup.model.reasons import ReasonCode
from trueup.model.virtual import virtual_addresses
from trueup.reconcile.changes import (
    CONTROL_PLANE_FILE,
    ApplyResult,
    Change,
    Kind,
    Mode,
    Origin,
    Outcome,
    Refused,
    StorageError,
    UnknownRevision,
)
from trueup.reconcile.engine import observe as observing
from trueup.reconcile.engine import override as overriding
from trueup.reconcile.engine.checks import prepare, refuse
from trueup.reconcile.engine.recovery import recover_locked
from trueup.reconcile.engine.run import TransactionRun
from trueup.reconcile.engine.transact import run_transaction
from trueup.reconcile.probes import StatusProbes
from trueup.subsystems.base import Plan, Subsystem
from trueup.subsystems.registry import default_subsystems
from trueup.system.announce import Announcer, KernelAnnouncer, NoAnnouncer
from trueup.system.daemon import DaemonSupervisor
from trueup.system.daemonspec import Daemons
from trueup.system.netlink import CachedNetlink, Netlink
from trueup.system.nft import HostNftables, Nftables
from trueup.system.runner import Runner, SubprocessRunner
from trueup.system.sources import Files, HostFiles, Memo, Sources

__all__ = ["Engine", "NetlinkFactory"]

NetlinkFactory = Callable[[], Netlink]

log = logging.getLogger("trueup.reconcile")


def _kernel_netlink() -> Netlink:
    from trueup.system.netlink import KernelNetlink

    return KernelNetlink()


class Engine:
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
        # The transaction under way in this process (under the writer lock), or None.
        self.running: TransactionRun | None = None
        # Whether the audit lines of the journal's last commit were checked as written.
        self.audit_checked = False
        # Per subsystem, the last worker converging it (`converge_bounded`): one that was
        # abandoned finishes its step before the next convergence of that subsystem starts.
        self.abandoned: dict[str, threading.Thread] = {}
        self._owner: int | None = None
        self._depth = 0
        # The applied revision parsed, keyed by its file's identity (every pass needs it).
        self._parsed: tuple[tuple[object, ...], DeviceState] | None = None
        # Operator writers (apply, rollback, restore, management) waiting for the writer
        # lock right now: a heal yields to them (`writer_wanted`, docs/architecture.md).
        self._wanted = 0
        self._wanted_lock = threading.Lock()
        # Status' bounded looks at subsystems that may block (`trueup.reconcile.probes`).
        self.status_probes = StatusProbes(self.sources)
        self.failing: dict[str, str] = dict(state.applied().failed)
        self.failing.update(state.applied().carried)

    @contextmanager
    def sources(self, memo: Memo | None = None) -> Iterator[Sources]:
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
        return overriding.with_override(self.state, document) if document is not None else None

    def _applied_key(self) -> tuple[int, tuple[object, ...]]:
        applied = self.state.applied()
        version = applied.version
        key = (version, applied.digest, file_identity(self.state.revision_file(version)))
        return version, key

    def applied_revision(self) -> DeviceState | None:
        """The applied revision as it was accepted (no override)."""
        version, key = self._applied_key()
        if not version:
            return None
        if self._parsed is not None and self._parsed[0] == key and key[2] is not None:
            return self._parsed[1]
        digest = key[1]
        record = self.state.revision(version, digest if isinstance(digest, str) else None)
        if record is None:
            return None
        self._parsed = (key, parse_document(record["document"], f"revision {version}"))
        return self._parsed[1]

    def keep_parsed(self, document: DeviceState) -> None:
        """The revision just committed is the applied one: keep `document` as its parse.

        The revision file holds `document.canonical()`, so parsing it again would
        give the same document; the key is the one `applied_revision` checks.
        """
        version, key = self._applied_key()
        if key[2] is not None and document.metadata.version == version:
            self._parsed = (key, document)

    def managed_by(self) -> str | None:
        """The control plane's URL when this device is managed by one."""
        record = self.state.read(CONTROL_PLANE_FILE, {}) or {}
        url = record.get("url") if isinstance(record, dict) else None
        return str(url) if url else None

    def revision_document(self, version: int | None) -> tuple[int, DeviceState]:
        """An accepted revision to roll back to (default: the one before the applied one)."""
        applied_version = self.state.applied().version
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

    # -- the console's management override (`trueup management set`) ---------------
    def override_signature(self) -> tuple[int, int, int] | None:
        """Changes whenever the override file does (for callers that cache documents)."""
        try:
            st = (self.state.root / OVERRIDE_FILE).stat()
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def refuse_if_damaged(self) -> None:
        """Raise `DamagedState` when a state file a write depends on is damaged."""
        overriding.refuse_if_damaged(self.check)

    # -- observation (`trueup.reconcile.engine.observe`) ------------------------------
    def plan(self, document: DeviceState, net: Sources | None = None) -> list[Plan]:
        """What applying `document` would do now, per subsystem."""
        if net is None:
            with self.sources() as opened:
                return observing.plan(self, document, opened)
        return observing.plan(self, document, net)

    # -- the writer lock ----------------------------------------------------
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

    def preempted(self) -> bool:
        """A heal running while an operator's write waits: it abandons what is left."""
        running = self.running
        return running is not None and running.heal and self.writer_wanted()

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
            raise refuse(
                self.state, ReasonCode.CONCURRENT_MODIFICATION, str(exc), actor, holder=exc.holder
            ) from None
        self._owner, self._depth = me, 1
        self.idle.clear()
        try:
            yield
        finally:
            self._owner, self._depth = None, 0
            self.idle.set()
            lock.__exit__(None, None, None)

    # -- the transaction ------------------------------------------------------
    def transact(self, change: Change) -> ApplyResult:
        """Apply `change` as one journaled, verified transaction.

        Raises `Refused` (nothing changed, with its reason code) or
        `NeedsConfirmation` (a management change without a confirmation).
        """
        self.refuse_if_damaged()
        if change.kind is Kind.RECONCILE and change.mode is Mode.ATOMIC:
            # A heal converges towards the committed revision: what worked stays,
            # so a failing link never takes restored management addresses away.
            change = replace(change, mode=Mode.BEST_EFFORT)
        names = [s.name for s in self.subsystems if change.only is None or s.name in change.only]
        skipped = dict(change.skipped)
        # Preparation runs beside the transaction: each subsystem's is joined at its turn.
        ready = [n for n in names if n not in skipped]
        preparation = prepare(self, change, ready)
        preparation.settle_if_alone(ready)
        quiet = change.kind == Kind.RECONCILE
        with self.writer(change.kind, change.actor, change.lock_wait, quiet=quiet):
            try:
                recover_locked(self, change.actor)
            except OSError as exc:
                raise StorageError(
                    f"{self.state.root}: recovering an open transaction needs a write that "
                    f"failed ({exc}); nothing else was changed"
                ) from exc
            result = run_transaction(self, change, names, skipped, preparation)
        self._note_failing(change, names, result)
        return result

    def _note_failing(self, change: Change, names: list[str], result: ApplyResult) -> None:
        """Which subsystems failed their last convergence (what a later write may carry)."""
        if result.outcome == Outcome.ROLLED_BACK:
            return  # nothing changed: what was failing still is
        for name in names:
            if name in result.failed:
                self.failing[name] = result.failed[name]
            elif name in result.carried or name in result.waiting:
                continue
            elif change.kind != Kind.RECONCILE or name in result.healed:
                self.failing.pop(name, None)

    def recover(
        self, actor: str = "local", *, wait: float = 30.0, quiet: bool = False
    ) -> Transaction | None:
        """Recover an open transaction left by a crash (takes the lock when not held).

        Refused with `DamagedState` while a file recovery depends on is damaged;
        `quiet`: a busy lock is refused without an audit line (the loop retries).
        """
        self.refuse_if_damaged()
        with self.writer("recovery", actor, wait=wait, quiet=quiet):
            return recover_locked(self, actor)

    # -- entry points over `transact` ------------------------------------------
    def apply_document(
        self,
        document: DeviceState,
        *,
        mode: Mode | str = Mode.ATOMIC,
        expect_version: int | None = None,
        actor: str = "local",
        kind: Kind = Kind.APPLY,
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
        """`transact(Change.apply(…))`, or `Change.heal` for `kind` reconcile (tests, tools).

        Other kinds have their own constructors (`Change.rollback`, …) and
        are refused here with `ValueError`; raises `Refused` or `NeedsConfirmation`.
        """
        kind = Kind(kind)
        if kind is Kind.RECONCILE:
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
        if kind is not Kind.APPLY:
            raise ValueError(f"kind {kind.value}: build it with its Change constructor")
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
        return self.transact(change)

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
        applied_version = self.state.applied().version
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
        failed = dict(applied.failed)
        carried = dict(applied.carried)
        if not names & (failed.keys() | carried.keys()) or not applied.version:
            return []
        try:
            with self.writer(Kind.RECONCILE, actor, quiet=True):
                return self._settle_in_sync_locked(names, actor)
        except (Refused, StorageError, OSError, StateFileError):
            return []  # a writer is busy or the directory refuses: the next pass again

    def _settle_in_sync_locked(self, names: set[str], actor: str) -> list[str]:
        applied = self.state.applied()  # under the lock: what is recorded now
        failed = dict(applied.failed)
        carried = dict(applied.carried)
        settled = sorted(names & (failed.keys() | carried.keys()))
        if not settled or not applied.version:
            return []
        still_failed = {n: e for n, e in failed.items() if n not in names}
        record = applied.model_copy(
            update={
                "failed": still_failed,
                "carried": {n: e for n, e in carried.items() if n not in names},
            }
        )
        if applied.outcome == Outcome.PARTIAL and not still_failed:
            record.outcome = Outcome.COMMITTED.value
        self.state.set_applied(record)
        self.state.audit.append(
            "failure_settled",
            actor,
            version=applied.version,
            subsystems=settled,
            why="seen in sync with the applied revision",
        )
        return settled
