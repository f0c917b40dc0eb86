"""A console management override laid over the applied revision, and damaged state refusals.

See `trueup management set` in docs/startup.md: the override's facts stand
until a committed revision carries them, so no heal, recovery or management
guard takes the console's address away meanwhile.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from trueup.journal.atomic import StateFileError
from trueup.journal.override import (
    OVERRIDE_FILE,
    ManagementFacts,
    ManagementOverride,
    clear_override,
    read_override,
    same_facts,
)
from trueup.journal.state import StateDir
from trueup.model.document import DeviceState, DocumentError
from trueup.reconcile.changes import Change, DamagedState
from trueup.reconcile.management_tier import (
    document_from_facts,
    management_facts_of,
    with_management,
)

if TYPE_CHECKING:
    from trueup.journal.damage import StateCheck

log = logging.getLogger("trueup.reconcile")

__all__ = [
    "management_override",
    "override_document",
    "refuse_if_damaged",
    "settle_override",
    "with_override",
]


def management_override(state: StateDir) -> ManagementOverride | None:
    """The override record, or None (a damaged one is reported as damage, not used)."""
    try:
        return read_override(state.root)
    except (StateFileError, OSError):
        return None


def with_override(state: StateDir, document: DeviceState) -> DeviceState:
    """`document` with the override's management facts, while one stands.

    An override that cannot be laid over the revision (it conflicts with
    another section) is reported by status and leaves the revision as it is.
    """
    override = management_override(state)
    if override is None or same_facts(
        override.facts, ManagementFacts.from_json(management_facts_of(document))
    ):
        return document
    try:
        return with_management(
            document,
            override.facts.to_json(),
            source=f"{OVERRIDE_FILE} over revision {document.metadata.version}",
        )
    except DocumentError as exc:
        log.warning("management override not laid over the applied revision: %s", exc)
        return document


def override_document(state: StateDir) -> DeviceState | None:
    """The override alone, as a document (before any revision was applied)."""
    override = management_override(state)
    if override is None:
        return None
    try:
        return document_from_facts(override.facts.to_json(), source=OVERRIDE_FILE)
    except DocumentError:
        return None


def settle_override(state: StateDir, change: Change, document: DeviceState, version: int) -> None:
    """Clear the override once a committed revision carries its facts (or replaced them)."""
    override = management_override(state)
    if override is None:
        return
    if same_facts(override.facts, ManagementFacts.from_json(management_facts_of(document))):
        reason = f"revision {version} carries these management facts"
    elif change.management_confirmed:
        reason = f"revision {version} changed management with a confirmation"
    else:
        return
    try:
        clear_override(state.root)
        state.audit.append(
            "management_override_cleared",
            change.actor,
            version=version,
            reason=reason,
            override=override.facts.to_json(),
        )
    except OSError as exc:
        log.warning("%s: clearing the management override failed: %s", OVERRIDE_FILE, exc)


def refuse_if_damaged(check: StateCheck) -> None:
    """Raise `DamagedState` when a state file a write depends on is damaged."""
    damaged = check.blocking("writes")
    if damaged:
        raise DamagedState(damaged)
