"""The checks every write passes once: preparation, versions, origin, the management guard.

Part of the engine (`trueup.reconcile.transaction.Engine`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from trueup.journal.state import StateDir
from trueup.model.document import DeviceState
from trueup.model.reasons import ReasonCode
from trueup.reconcile.changes import (
    _LOCAL_ORIGINS,
    Change,
    NeedsConfirmation,
    Refused,
)
from trueup.reconcile.guard import management_guard, subsystem_risks, unsafe_management_changes
from trueup.subsystems.base import Subsystem

log = logging.getLogger("trueup.reconcile")


def _prepares(subsystem: Subsystem) -> bool:
    return type(subsystem).prepare is not Subsystem.prepare


__all__ = ["Checking"]


class Checking:
    """The checks every write passes once: preparation, versions, origin, the management guard."""

    if TYPE_CHECKING:
        state: StateDir
        by_name: dict[str, Subsystem]
        subsystems: list[Subsystem]
        api_port: int | None

        def managed_by(self) -> str | None: ...

        def _refuse(
            self, code: ReasonCode, message: str, actor: str, **evidence: Any
        ) -> Refused: ...

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
        if change.management_confirmed or change.kind not in ("apply", "rollback", "restore"):
            return
        risks = subsystem_risks(self.subsystems, previous, change.document, self.api_port)
        refusal = management_guard(previous, change.document, risks)
        if refusal is not None:
            unsafe = unsafe_management_changes(previous, change.document) + risks
            with contextlib.suppress(OSError):
                self.state.audit.append(
                    "apply_refused", change.actor, message=refusal, changes=unsafe, kind=change.kind
                )
            raise NeedsConfirmation(refusal, unsafe)
