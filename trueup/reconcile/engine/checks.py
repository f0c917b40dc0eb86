"""The checks every write passes once: preparation, versions, origin, the management guard.

`check` turns a `Change` into a `TransactionRun` (its version, digest,
scope, the subsystems it may change and the ones it carries) or refuses it
before anything changed.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from trueup.journal.state import StateDir
from trueup.model.document import DeviceState, document_digest
from trueup.model.reasons import ReasonCode
from trueup.model.records import Applied
from trueup.reconcile.changes import Change, Kind, NeedsConfirmation, Outcome, Refused
from trueup.reconcile.engine.override import override_document
from trueup.reconcile.engine.run import LOCAL_ORIGINS, TransactionRun
from trueup.reconcile.guard import management_guard, subsystem_risks, unsafe_management_changes
from trueup.subsystems.base import Scope, Subsystem
from trueup.subsystems.registry import scope_for

if TYPE_CHECKING:
    from trueup.reconcile.engine.core import Engine

__all__ = [
    "Preparation",
    "check",
    "deadline_for",
    "prepare",
    "prepares",
    "refuse",
]


def prepares(subsystem: Subsystem) -> bool:
    """Whether the subsystem has a preparation step (`Subsystem.prepare` overridden)."""
    return type(subsystem).prepare is not Subsystem.prepare


class Preparation:
    """Preparations running in parallel on daemon threads, each joined when its turn comes.

    `wait(name)` blocks until the subsystem's preparation ends or its
    deadline (counted from the start) passes, and answers the failure, or
    None when it is prepared (or needs no preparation).
    """

    def __init__(
        self, document: DeviceState, subsystems: list[Subsystem], deadlines: Mapping[str, float]
    ) -> None:
        self._started = time.monotonic()
        self._deadlines = deadlines
        self._results: dict[str, str | None] = {}
        self._threads: dict[str, threading.Thread] = {}
        for sub in subsystems:
            thread = threading.Thread(
                target=self._work, args=(sub, document), name=f"prepare-{sub.name}", daemon=True
            )
            thread.start()
            self._threads[sub.name] = thread

    def _work(self, sub: Subsystem, document: DeviceState) -> None:
        try:
            sub.prepare(document)
            self._results[sub.name] = None
        except Exception as exc:  # reported per subsystem, never raised
            self._results[sub.name] = f"preparation failed: {exc}"

    def running(self) -> set[str]:
        """The subsystems whose preparation has not ended yet."""
        return {name for name, thread in self._threads.items() if thread.is_alive()}

    def finished_failures(self) -> dict[str, str]:
        """The preparations that have ended and failed."""
        return {
            name: str(self._results[name])
            for name, thread in self._threads.items()
            if not thread.is_alive() and self._results.get(name)
        }

    def settle_if_alone(self, names: list[str]) -> None:
        """Wait for every preparation now when each of `names` prepares.

        Nothing else in the transaction could converge meanwhile, so the wait
        happens before the writer lock is taken: a retry of a subsystem whose
        lookup hangs never holds an operator's write back.
        """
        if names and all(n in self._threads for n in names):
            for name in names:
                self.wait(name)

    def wait(self, name: str) -> str | None:
        thread = self._threads.get(name)
        if thread is None:
            return None
        seconds = self._deadlines[name]
        thread.join(max(0.0, seconds - (time.monotonic() - self._started)))
        if thread.is_alive():
            return f"deadline of {seconds:g}s exceeded while preparing"
        return self._results.get(name)


def deadline_for(change: Change, name: str) -> float:
    """The subsystem's deadline in this change: the caller's, else the document's."""
    if change.deadlines is not None and name in change.deadlines:
        return float(change.deadlines[name])
    return float(change.document.spec.convergence.deadline_for(name))


def prepare(engine: Engine, change: Change, names: list[str]) -> Preparation:
    """Start preparing the subsystems that need it, in parallel, each within its deadline.

    Nothing waits here: the transaction joins a subsystem's preparation
    only when that subsystem's turn comes (`Preparation.wait`), so a
    lookup that hangs in a later tier never delays an earlier one.
    """
    subsystems = [engine.by_name[n] for n in names if prepares(engine.by_name[n])]
    return Preparation(
        change.document, subsystems, {s.name: deadline_for(change, s.name) for s in subsystems}
    )


def refuse(state: StateDir, code: ReasonCode, message: str, actor: str, **evidence: Any) -> Refused:
    """A refusal, audited (best effort: a full disk must not hide it)."""
    with contextlib.suppress(OSError):
        state.audit.append("refused", actor, code=code.value, message=message, **evidence)
    return Refused(code, message, **evidence)


def check(
    engine: Engine,
    change: Change,
    names: list[str],
    skipped: dict[str, str],
    preparation: Preparation | None,
) -> TransactionRun:
    """The checked run of `change` under the writer lock; raises `Refused`/`NeedsConfirmation`."""
    applied = engine.state.applied()
    applied_version = applied.version
    # Before any revision, a console override is what management must not lose.
    previous = engine.applied_document() or override_document(engine.state)
    # A heal converges to what is applied *now*, under the lock: the caller
    # read the applied revision before recovery may have rolled back the
    # transaction a crash left open (whose applied record it then saw).
    heal = change.kind == Kind.RECONCILE
    stale = heal and change.document.metadata.version != applied_version
    if stale and previous is not None and applied_version:
        change = replace(change, document=previous)
    digest = document_digest(change.document)
    version, same_version = _resolve_version(engine, change, applied, digest)
    _check_origin(engine, change, applied)
    document = change.document.with_version(version)
    _guard(engine, change, previous)
    scope = scope_for(document, previous)
    if change.former_virtual:
        scope = replace(scope, virtual_addresses=scope.virtual_addresses | change.former_virtual)
    run = TransactionRun(
        change=change,
        applied=applied,
        previous=previous,
        document=document,
        version=version,
        digest=digest,
        same_version=same_version,
        scope=scope,
        names=names,
        skipped=skipped,
        preparation=preparation,
    )
    failing = {n: engine.failing.get(n) for n in names}
    run.carried = unchanged_of(engine, run, failing, "failing")
    run.names = [n for n in names if n not in run.carried]
    return run


def unchanged_of(
    engine: Engine, run: TransactionRun, errors: Mapping[str, str | None], why: str
) -> dict[str, str]:
    """Of `errors` (failing, or not observable), the subsystems this write leaves unchanged.

    They are left out of it (never converged, never a reason to roll it
    back) and keep their failure: a write is never refused, delayed or
    undone for a service it does not touch. The reconcile loop goes on
    healing them; a write that changes their section converges them.
    """
    if run.heal or run.previous is None:
        return {}
    out: dict[str, str] = {}
    scope: Scope = run.scope
    for name, error in errors.items():
        if error is None or name == "management":
            continue
        sub = engine.by_name[name]
        try:
            unchanged = sub.desired(run.document, scope) == sub.desired(run.previous, scope)
        except Exception:  # undecidable: converged as usual
            unchanged = False
        if unchanged:
            out[name] = (
                f"{why} before this write and unchanged by it (left to the reconcile loop): {error}"
            )[:2000]
    return out


def _resolve_version(
    engine: Engine, change: Change, applied: Applied, digest: str
) -> tuple[int, bool]:
    """The version this change gets, and whether it is the applied one again."""
    actor = change.actor
    applied_version = applied.version
    if change.expect_version is not None and change.expect_version != applied_version:
        raise refuse(
            engine.state,
            ReasonCode.CONCURRENT_MODIFICATION,
            f"expected applied version {change.expect_version} but the device is at "
            f"{applied_version}; nothing was changed",
            actor,
            expected=change.expect_version,
            applied=applied_version,
        )
    if change.kind == Kind.RECONCILE:
        return applied_version, True
    if change.new_version:
        return applied_version + 1, False
    version = change.document.metadata.version
    if change.origin == "control-plane":
        if version is None:
            raise ValueError("a control-plane revision carries its version")
        cp_version = applied.cp_version
        if cp_version is not None and version < int(cp_version):
            raise refuse(
                engine.state,
                ReasonCode.VERSION_SKEW,
                f"control-plane revision {version} is older than revision {cp_version} "
                "already applied from the control plane; versions only grow",
                actor,
                document_version=version,
                applied=applied_version,
            )
        same = version == applied_version and applied.digest == digest
        return version, same and not applied.override
    if version is None:
        same = applied.digest == digest and applied.outcome == Outcome.COMMITTED
        # A restore replaces a local override even with the same document: committed anew.
        same = same and not (change.replaces_override and applied.override)
        if same and applied_version:
            return applied_version, True
        return applied_version + 1, False
    if version < applied_version:
        raise refuse(
            engine.state,
            ReasonCode.VERSION_SKEW,
            f"document version {version} is older than the applied version "
            f"{applied_version}; versions only grow",
            actor,
            document_version=version,
            applied=applied_version,
        )
    if version == applied_version and applied.digest != digest:
        raise refuse(
            engine.state,
            ReasonCode.VERSION_SKEW,
            f"version {version} is already applied with different content; "
            "give the new document a higher version (or omit it)",
            actor,
            document_version=version,
            applied=applied_version,
        )
    return version, version == applied_version


def _check_origin(engine: Engine, change: Change, applied: Applied) -> None:
    if change.origin not in LOCAL_ORIGINS or change.override is not None:
        return
    url = engine.managed_by()
    if url is None:
        return
    cp = applied.cp_version
    raise refuse(
        engine.state,
        ReasonCode.VERSION_SKEW,
        f"this device is managed by the control plane at {url}"
        + (f" (revision {cp} applied from it)" if cp is not None else "")
        + "; its desired revision is the source of truth and the next one would replace "
        "this change. Nothing was changed. To change the device locally anyway, re-run "
        'with --override "REASON": the change is reported upstream as a local override',
        change.actor,
        managed_by=url,
    )


def _guard(engine: Engine, change: Change, previous: DeviceState | None) -> None:
    if change.management_confirmed or change.kind not in (Kind.APPLY, Kind.ROLLBACK, Kind.RESTORE):
        return
    risks = subsystem_risks(engine.subsystems, previous, change.document, engine.api_port)
    refusal = management_guard(previous, change.document, risks)
    if refusal is not None:
        unsafe = unsafe_management_changes(previous, change.document) + risks
        with contextlib.suppress(OSError):
            engine.state.audit.append(
                "apply_refused", change.actor, message=refusal, changes=unsafe, kind=change.kind
            )
        raise NeedsConfirmation(refusal, unsafe)
