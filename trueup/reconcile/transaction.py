"""The one transaction writer: every change to the system goes through `Engine.transact`.

Who calls this: the CLI without a running agent, the agent's API, the
reconcile loop (heals are transactions of kind `reconcile`), confirm-timeout,
rollback, startup (phase 3) and crash recovery. Nothing else writes.

One transaction, in order:

1. preparation (`Subsystem.prepare`) of the subsystems it may change, in
   parallel, each within its deadline; a subsystem that fails or hangs is
   recorded as failed and the others go on;
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
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from trueup.journal.atomic import StateFileError
from trueup.journal.audit import now_iso
from trueup.journal.damage import Damage, StateCheck
from trueup.journal.journal import Transaction
from trueup.journal.lock import LockBusy
from trueup.journal.management import management_facts, write_management
from trueup.journal.override import OVERRIDE_FILE, clear_override, read_override, same_facts
from trueup.journal.state import StateDir
from trueup.model.document import DeviceState, DocumentError, document_digest, parse_document
from trueup.model.reasons import ReasonCode
from trueup.model.records import Applied, Override
from trueup.reconcile import faults
from trueup.reconcile.guard import management_guard, unsafe_management_changes
from trueup.reconcile.management_tier import (
    document_from_facts,
    management_facts_of,
    with_management,
)
from trueup.subsystems.base import Difference, Facts, Plan, Scope, Step, StepError, Subsystem
from trueup.subsystems.registry import default_subsystems, scope_for
from trueup.system.announce import Announcer, KernelAnnouncer, NoAnnouncer
from trueup.system.netlink import CachedNetlink, Netlink, NetlinkError
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

Mode = Literal["atomic", "best-effort"]
Origin = Literal[
    "control-plane",
    "local-file",
    "local-cli",
    "rollback",
    "recovery",
    "confirm-timeout",
    "reconcile",
]
# Builds a transaction's audit lines from its outcome: (txn, failed, waiting, healed).
AuditBuilder = Callable[
    [str, dict[str, str], dict[str, str], dict[str, list[str]]], list[tuple[str, dict[str, Any]]]
]
NetlinkFactory = Callable[[], Netlink]

# Written by the agent when it is managed by a control plane.
CONTROL_PLANE_FILE = "control-plane.json"

_CONVERGE_PASSES = 3
_VERIFY_ROUNDS = 2
# Bound on restoring one subsystem's before-image (no document deadline applies).
_UNDO_SECONDS = 90.0
# Origins an operator starts on the device itself; on a managed device they are overrides.
_LOCAL_ORIGINS = {"local-cli", "rollback"}
_STEP_ERRORS = (StepError, NetlinkError, ValueError, OSError)


class UnknownRevision(LookupError):
    """A rollback target that is not among the accepted revisions."""


class Refused(Exception):
    """A write refused before anything changed, with the reason code that explains it."""

    def __init__(self, code: ReasonCode, message: str, **evidence: Any) -> None:
        self.code = code
        self.evidence = evidence
        super().__init__(message)


log = logging.getLogger("trueup.reconcile")


class StorageError(RuntimeError):
    """The state directory refused a write (full, read-only); nothing was left changed."""


class DamagedState(Refused):
    """A write refused because a state file it depends on is damaged; nothing was changed.

    Raised before the writer lock, the journal or the system are touched. The
    code is `STATE_APPLY_NOT_COMPLETED` for a damaged pending confirmation,
    else `STATE_VERSION_SKEW` (the agent cannot tell what is applied).
    """

    def __init__(self, damaged: list[Damage]) -> None:
        self.damaged = damaged
        first = damaged[0]
        code = (
            ReasonCode.APPLY_NOT_COMPLETED
            if first.file == "pending-confirm.json"
            else ReasonCode.VERSION_SKEW
        )
        also = (
            " Also damaged: " + ", ".join(d.sentence() for d in damaged[1:]) + "."
            if len(damaged) > 1
            else ""
        )
        super().__init__(
            code,
            f"{first.sentence()}. Writes are refused while it is damaged; nothing was changed "
            "(management and diagnostics keep running). Keep it as evidence (`trueup "
            f"evidence`), then restore it from a backup or move it aside (mv {first.path} "
            f"{first.path}.damaged); the refusal lifts at once.{also}",
            damaged=[d.to_json() for d in damaged],
        )


class NeedsConfirmation(Exception):
    """A change that would take management access away, refused without a confirmation."""

    def __init__(self, message: str, changes: list[str]) -> None:
        self.changes = changes
        super().__init__(message)


@dataclass(frozen=True)
class Change:
    """What a caller asks of the engine. Every writer fills one of these in.

    `only` limits the subsystems the transaction may change (a heal names the
    ones it heals); `contested` pins paths another writer keeps changing to
    what is observed; `skipped` names subsystems that could not start, with
    the reason. `management_confirmed` is set when the caller arranged a
    confirmation (or restores a confirmed revision). `new_version` gives the
    document the next version number (rollbacks). `override` is the operator's
    reason for a local change on a device the control plane manages.
    """

    document: DeviceState
    kind: str = "apply"  # apply | reconcile | rollback | confirm-timeout
    origin: Origin = "local-cli"
    actor: str = "local"
    mode: Mode = "atomic"
    expect_version: int | None = None
    only: frozenset[str] | None = None
    contested: Mapping[str, Collection[str]] = field(default_factory=dict)
    skipped: Mapping[str, str] = field(default_factory=dict)
    management_confirmed: bool = False
    new_version: bool = False
    override: str | None = None
    lock_wait: float = 0.0
    source: str = ""
    deadlines: Mapping[str, float] | None = None
    # The audit lines to write with the commit; default one line of event `kind`.
    audit: AuditBuilder | None = None


@dataclass
class ApplyResult:
    ok: bool
    version: int
    outcome: str  # committed | partial | rolled_back | unchanged | failed
    txn: str | None = None
    plans: list[Plan] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    rollback_errors: list[str] = field(default_factory=list)
    waiting: dict[str, str] = field(default_factory=dict)
    healed: dict[str, list[str]] = field(default_factory=dict)  # subsystem → steps run
    origin: str | None = None
    digest: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "ok": self.ok,
            "version": self.version,
            "outcome": self.outcome,
            "txn": self.txn,
            "steps": [s.describe() for p in self.plans for s in p.steps],
            "failed": self.failed,
            "rollback_errors": self.rollback_errors,
        }
        if self.waiting:
            out["waiting"] = self.waiting
        if self.origin:
            out["origin"] = self.origin
        if self.digest:
            out["digest"] = self.digest
        return out


def _kernel_netlink() -> Netlink:
    from trueup.system.netlink import KernelNetlink

    return KernelNetlink()


def _pinned(desired: Facts, observed: Facts, contested: Collection[str]) -> Facts:
    """Desired facts with contested paths pinned to what is observed (left alone)."""
    target = {k: v for k, v in desired.items() if k not in contested}
    for path in contested:
        if path in observed:
            target[path] = observed[path]
    return target


def _prepares(subsystem: Subsystem) -> bool:
    return type(subsystem).prepare is not Subsystem.prepare


class Engine:
    def __init__(
        self,
        state: StateDir,
        subsystems: list[Subsystem] | None = None,
        netlink_factory: NetlinkFactory = _kernel_netlink,
        files: Files | None = None,
        runner: Runner | None = None,
        announcer: Announcer | None = None,
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
        self.by_name = {s.name: s for s in self.subsystems}
        # Which state files are damaged: writes they make unsafe are refused.
        self.check = StateCheck(state)
        # Set while no transaction runs in this process; the loop waits on it
        # instead of spinning while an apply is under way.
        self.idle = threading.Event()
        self.idle.set()
        self._owner: int | None = None
        self._depth = 0
        self._audit_checked = False

    @contextmanager
    def sources(self) -> Iterator[Sources]:
        """The system for one piece of work: a netlink handle (one dump per table), files, programs."""
        sources = Sources(
            CachedNetlink(self.netlink_factory()), self.files, self.runner, self.announcer
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
        record = self.state.revision(version, applied.get("digest"))
        if record is None:
            return None
        return parse_document(record["document"], f"revision {version}")

    # -- the console's management override (`trueup management set`) ---------------
    def management_override(self) -> dict[str, Any] | None:
        """The override record, or None (a damaged one is reported as damage, not used)."""
        try:
            return read_override(self.state.root)
        except (StateFileError, OSError):
            return None

    def override_signature(self) -> tuple[int, int, int] | None:
        """Changes whenever the override file does (for callers that cache documents)."""
        try:
            st = (self.state.root / OVERRIDE_FILE).stat()
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def with_override(self, document: DeviceState) -> DeviceState:
        """`document` with the override's management facts, while one stands.

        Until a committed revision carries them, every heal, recovery and
        management guard works against the operator's facts, so nothing takes
        the console's address away. An override that cannot be laid over the
        revision (it conflicts with another section) is reported by status and
        leaves the revision as it is.
        """
        override = self.management_override()
        if override is None or same_facts(override, management_facts_of(document)):
            return document
        try:
            return with_management(
                document,
                override,
                source=f"{OVERRIDE_FILE} over revision {document.metadata.version}",
            )
        except DocumentError as exc:
            log.warning("management override not laid over the applied revision: %s", exc)
            return document

    def _override_document(self) -> DeviceState | None:
        """The override alone, as a document (before any revision was applied)."""
        override = self.management_override()
        if override is None:
            return None
        try:
            return document_from_facts(override, source=OVERRIDE_FILE)
        except DocumentError:
            return None

    def _settle_override(self, change: Change, document: DeviceState, version: int) -> None:
        """Clear the override once a committed revision carries its facts (or replaced them)."""
        override = self.management_override()
        if override is None:
            return
        if same_facts(override, management_facts_of(document)):
            reason = f"revision {version} carries these management facts"
        elif change.management_confirmed:
            reason = f"revision {version} changed management with a confirmation"
        else:
            return
        try:
            clear_override(self.state.root)
            self.state.audit.append(
                "management_override_cleared",
                change.actor,
                version=version,
                reason=reason,
                override={k: override.get(k) for k in ("interface", "addresses", "gateway")},
            )
        except OSError as exc:
            log.warning("%s: clearing the management override failed: %s", OVERRIDE_FILE, exc)

    def refuse_if_damaged(self) -> None:
        """Raise `DamagedState` when a state file a write depends on is damaged."""
        damaged = self.check.blocking("writes")
        if damaged:
            raise DamagedState(damaged)

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
        observed = self.observe(net, scope, errors=errors)
        return [
            s.plan(s.desired(document, scope), observed[s.name], scope)
            if s.name in observed
            else Plan(s.name, [], [errors[s.name]])
            for s in self.subsystems
        ]

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
    ) -> ApplyResult:
        """`transact` with keyword arguments; raises `Refused` or `NeedsConfirmation`."""
        return self.transact(
            Change(
                document,
                kind=kind,
                origin=origin,
                actor=actor,
                mode=mode,
                expect_version=expect_version,
                only=frozenset(only) if only is not None else None,
                skipped=dict(skipped or {}),
                management_confirmed=management_confirmed,
                override=override,
                lock_wait=lock_wait,
                source=source,
                deadlines=deadlines,
            )
        )

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
            Change(
                document,
                kind="rollback",
                origin="rollback",
                actor=actor,
                expect_version=applied_version if expect_version is None else expect_version,
                new_version=True,
                management_confirmed=management_confirmed,
                override=override,
                source=f"revision {target}",
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
        skipped.update(self._prepare(change, [n for n in names if n not in skipped]))
        quiet = change.kind == "reconcile"
        with self.writer(change.kind, change.actor, change.lock_wait, quiet=quiet):
            try:
                self._recover_locked(change.actor)
            except OSError as exc:
                raise StorageError(
                    f"{self.state.root}: recovering an open transaction needs a write that "
                    f"failed ({exc}); nothing else was changed"
                ) from exc
            return self._transact_locked(change, names, skipped)

    def _names(self, only: Collection[str] | None) -> list[str]:
        return [s.name for s in self.subsystems if only is None or s.name in only]

    def _prepare(self, change: Change, names: list[str]) -> dict[str, str]:
        """Prepare the subsystems that need it, in parallel, each within its deadline."""
        subsystems = [self.by_name[n] for n in names if _prepares(self.by_name[n])]
        if not subsystems:
            return {}
        results: dict[str, str | None] = {}

        def work(sub: Subsystem) -> None:
            try:
                sub.prepare(change.document)
                results[sub.name] = None
            except Exception as exc:  # reported per subsystem, never raised
                results[sub.name] = f"preparation failed: {exc}"

        started = time.monotonic()
        threads = {}
        for sub in subsystems:
            thread = threading.Thread(target=work, args=(sub,), name=f"prepare-{sub.name}")
            thread.daemon = True
            thread.start()
            threads[sub.name] = thread
        failures: dict[str, str] = {}
        for name, thread in threads.items():
            seconds = self._deadline(change, name)
            thread.join(max(0.0, seconds - (time.monotonic() - started)))
            if thread.is_alive():
                failures[name] = f"deadline of {seconds:g}s exceeded while preparing"
            elif results.get(name):
                failures[name] = str(results[name])
        return failures

    def _deadline(self, change: Change, name: str) -> float:
        if change.deadlines is not None and name in change.deadlines:
            return float(change.deadlines[name])
        return float(change.document.spec.convergence.deadline_for(name))

    def _resolve_version(
        self, change: Change, applied: dict[str, Any], digest: str
    ) -> tuple[int, bool]:
        """The version this change gets, and whether it is the applied one again."""
        actor = change.actor
        applied_version = int(applied.get("version", 0))
        if change.expect_version is not None and change.expect_version != applied_version:
            raise self._refuse(
                ReasonCode.CONCURRENT_MODIFICATION,
                f"expected applied version {change.expect_version} but the device is at "
                f"{applied_version}; nothing was changed",
                actor,
                expected=change.expect_version,
                applied=applied_version,
            )
        if change.kind == "reconcile":
            return applied_version, True
        if change.new_version:
            return applied_version + 1, False
        version = change.document.metadata.version
        if change.origin == "control-plane":
            if version is None:
                raise ValueError("a control-plane revision carries its version")
            cp_version = applied.get("cp_version")
            if cp_version is not None and version < int(cp_version):
                raise self._refuse(
                    ReasonCode.VERSION_SKEW,
                    f"control-plane revision {version} is older than revision {cp_version} "
                    "already applied from the control plane; versions only grow",
                    actor,
                    document_version=version,
                    applied=applied_version,
                )
            same = version == applied_version and applied.get("digest") == digest
            return version, same and not applied.get("override")
        if version is None:
            same = applied.get("digest") == digest and applied.get("outcome") == "committed"
            if same and applied_version:
                return applied_version, True
            return applied_version + 1, False
        if version < applied_version:
            raise self._refuse(
                ReasonCode.VERSION_SKEW,
                f"document version {version} is older than the applied version "
                f"{applied_version}; versions only grow",
                actor,
                document_version=version,
                applied=applied_version,
            )
        if version == applied_version and applied.get("digest") != digest:
            raise self._refuse(
                ReasonCode.VERSION_SKEW,
                f"version {version} is already applied with different content; "
                "give the new document a higher version (or omit it)",
                actor,
                document_version=version,
                applied=applied_version,
            )
        return version, version == applied_version

    def _check_origin(self, change: Change, applied: dict[str, Any]) -> None:
        if change.origin not in _LOCAL_ORIGINS or change.override is not None:
            return
        url = self.managed_by()
        if url is None:
            return
        cp = applied.get("cp_version")
        raise self._refuse(
            ReasonCode.VERSION_SKEW,
            f"this device is managed by the control plane at {url}"
            + (f" (revision {cp} applied from it)" if cp is not None else "")
            + "; its desired revision is the source of truth and the next one would replace "
            "this change. Nothing was changed. To change the device locally anyway, re-run "
            'with --override "REASON": the change is reported upstream as a local override',
            change.actor,
            managed_by=url,
        )

    def _guard(self, change: Change, previous: DeviceState | None) -> None:
        if change.management_confirmed or change.kind not in ("apply", "rollback"):
            return
        refusal = management_guard(previous, change.document)
        if refusal is not None:
            unsafe = unsafe_management_changes(previous, change.document)
            with contextlib.suppress(OSError):
                self.state.audit.append(
                    "apply_refused", change.actor, message=refusal, changes=unsafe, kind=change.kind
                )
            raise NeedsConfirmation(refusal, unsafe)

    _current_kind: str | None = None

    def _transact_locked(
        self, change: Change, names: list[str], skipped: dict[str, str]
    ) -> ApplyResult:
        self._current_kind = change.kind
        try:
            return self._transact_checked(change, names, skipped)
        finally:
            self._current_kind = None

    def _transact_checked(
        self, change: Change, names: list[str], skipped: dict[str, str]
    ) -> ApplyResult:
        state = self.state
        applied = state.applied()
        applied_version = int(applied.get("version", 0))
        # Before any revision, a console override is what management must not lose.
        previous = self.applied_document() or self._override_document()
        digest = document_digest(change.document)
        version, same_version = self._resolve_version(change, applied, digest)
        self._check_origin(change, applied)
        document = change.document.with_version(version)
        self._guard(change, previous)
        scope = scope_for(document, previous)
        heal = change.kind == "reconcile"

        with self.sources() as net:
            unobservable: dict[str, str] = {}
            before = self.observe(net, scope, names, errors=unobservable)
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
            active = [n for n in names if n not in skipped]
            plans = {n: self.by_name[n].plan(targets[n], before[n], scope) for n in active}
            unchanged = (
                not skipped
                and not any(p.changes for p in plans.values())
                and same_version
                and (heal or applied.get("outcome") == "committed")
            )
            if unchanged:
                return ApplyResult(
                    True, version, "unchanged", plans=list(plans.values()), digest=digest
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
                    subsystems=[n for n, p in plans.items() if p.changes],
                    all_subsystems=names,
                    scope=scope.to_json(),
                    before=before,
                    previous_applied=applied,
                    steps={n: len(p.steps) for n, p in plans.items() if p.changes},
                )
            except OSError as exc:
                raise StorageError(
                    f"{state.root}: cannot write the journal ({exc}); nothing was changed"
                ) from exc
            touched: list[str] = []
            try:
                self._hit(change.kind, "begin")
                failed: dict[str, str] = {}
                waiting: dict[str, str] = {}
                if change.only is not None and same_version and not heal:
                    # Subsystems outside this transaction keep the failures they had.
                    failed.update(
                        (name, error)
                        for name, error in dict(applied.get("failed", {})).items()
                        if name not in change.only
                    )
                for name, reason in skipped.items():
                    failed[name] = reason
                    journal.record(txn, "failed", subsystem=name, error=reason)
                healed: dict[str, list[str]] = {}
                self._execute(
                    net, change, txn, plans, targets, scope, failed, waiting, touched, healed
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
                raise self._storage_failure(net, txn, before, scope, touched, applied, exc) from exc
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
        )

    def _storage_failure(
        self,
        net: Sources,
        txn: str,
        before: dict[str, Facts],
        scope: Scope,
        touched: list[str],
        applied: dict[str, Any],
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
            + ("" if closed else " and the transaction is closed by the next write")
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
    ) -> None:
        """Converge every subsystem with a plan, in order; dependents of a failure wait."""
        journal = self.state.journal
        for name, plan in plans.items():
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
        for round_ in range(_VERIFY_ROUNDS + 1):
            differing = []
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
                if sub.plan(targets[name], observed, scope).changes:
                    differing.append(name)
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
                f"{_VERIFY_ROUNDS} rounds; something else is changing it"
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
        cancel = threading.Event()
        outcome: list[BaseException | None] = []

        def work() -> None:
            try:
                with self.sources() as own:
                    self._converge(own, subsystem, desired, scope, plan, fault_point, cancel)
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
            f"still differs after {_CONVERGE_PASSES} passes; something else is changing it",
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

    def _commit(
        self,
        change: Change,
        txn: str,
        document: DeviceState,
        version: int,
        digest: str,
        applied: dict[str, Any],
        failed: dict[str, str],
        settled: list[str],
        records: list[tuple[str, dict[str, Any]]],
    ) -> None:
        state = self.state
        outcome = "partial" if failed else "committed"
        if change.kind == "reconcile":
            # A heal converges to the applied revision; the applied record changes
            # only when a subsystem that had failed is now in place.
            before_failed = dict(applied.get("failed", {}))
            now_failed = {n: e for n, e in before_failed.items() if n not in settled}
            if now_failed != before_failed and applied.get("version"):
                record = dict(applied)
                record["failed"] = now_failed
                if applied.get("outcome") == "partial" and not now_failed:
                    record["outcome"] = "committed"
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
            write_management(
                state.root,
                management_facts(
                    document.spec.management.model_dump(mode="json"), version=version, digest=digest
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
        applied: dict[str, Any],
        failed: dict[str, str],
    ) -> Applied:
        previous = Applied.model_validate(applied)
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
        elif change.origin in _LOCAL_ORIGINS:
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
    def recover(self, actor: str = "local") -> Transaction | None:
        """Recover an open transaction left by a crash (takes the lock when not held).

        Refused with `DamagedState` while a file recovery depends on is damaged.
        """
        self.refuse_if_damaged()
        with self.writer("recovery", actor, wait=30.0):
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
        names = list(begin.get("all_subsystems") or begin.get("subsystems") or [])
        names = [n for n in names if n in self.by_name]
        journal.record(open_txn.txn, "recovering", to_version=previous.get("version", 0))
        target = self._committed_document(previous)
        errors: list[str] = []
        with self.sources() as net:
            if target is not None:
                # Forward to the last committed revision: never to a before-image
                # that may hold drift, never away from its management addresses.
                target_scope = _union_scope(scope_for(target), scope)
                for name in names:
                    sub = self.by_name[name]
                    try:
                        self._converge_bounded(
                            net,
                            sub,
                            sub.desired(target, target_scope),
                            target_scope,
                            None,
                            target.spec.convergence.deadline_for(name),
                        )
                    except _STEP_ERRORS as exc:
                        errors.append(str(exc))
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

    @staticmethod
    def _hit(kind: str, point: str) -> None:
        faults.hit(point)
        faults.hit(f"{kind}/{point}")


def _union_scope(target: Scope, txn: Scope) -> Scope:
    """The committed revision's scope widened by what the interrupted transaction managed."""
    return Scope(
        interfaces=target.interfaces | txn.interfaces,
        tables=target.tables | txn.tables,
        management_interface=target.management_interface,
        management_owned=target.management_owned
        | (
            txn.management_owned
            if txn.management_interface == target.management_interface
            else frozenset()
        ),
        management_default_routes=target.management_default_routes | txn.management_default_routes,
    )
