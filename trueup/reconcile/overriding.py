"""A console management override laid over the applied revision, and damaged state refusals.

Part of the engine (`trueup.reconcile.transaction.Engine`); see
`trueup management set` in docs/startup.md.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from trueup.journal.atomic import StateFileError
from trueup.journal.damage import StateCheck
from trueup.journal.override import OVERRIDE_FILE, clear_override, read_override, same_facts
from trueup.journal.state import StateDir
from trueup.model.document import DeviceState, DocumentError
from trueup.reconcile.changes import (
    Change,
    DamagedState,
)
from trueup.reconcile.management_tier import (
    document_from_facts,
    management_facts_of,
    with_management,
)

log = logging.getLogger("trueup.reconcile")

__all__ = ["Overriding"]


class Overriding:
    """A console management override laid over the applied revision, and damaged state refusals."""

    if TYPE_CHECKING:
        state: StateDir
        check: StateCheck

        def applied_revision(self) -> DeviceState | None: ...

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
