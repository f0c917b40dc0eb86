"""What a fleet plan says, per device: the revision it would get, or why it is refused.

The planner (`profiles`) renders every device a change affects and compares the
result with its current desired revision; a rollout (`rollouts`) publishes a
plan's targets wave by wave. Both speak these values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trueup.model.layering import PathChange, Provenance

__all__ = ["Plan", "Refusal", "Target"]


@dataclass(frozen=True)
class Target:
    """A device whose rendered document differs from its current desired revision."""

    device_id: int
    device: str
    from_version: int  # the device's desired version the plan was made against (0: none)
    document: dict[str, Any]  # the rendered, validated full document
    digest: str  # document_digest(document)
    provenance: Provenance
    changes: tuple[PathChange, ...]


@dataclass(frozen=True)
class Refusal:
    """A device the change cannot be sent to, and why (every problem, each naming its path)."""

    device_id: int
    device: str
    kind: str  # "render" (variables, merge, validation) or "agent-version"
    problems: tuple[str, ...]


@dataclass(frozen=True)
class Plan:
    """A fleet plan: the targets, the refusals, how many devices are unchanged."""

    targets: tuple[Target, ...]
    refused: tuple[Refusal, ...]
    unchanged: int

    @property
    def exit_code(self) -> int:
        """0 no change, 2 changes, 1 refusals (terraform's -detailed-exitcode)."""
        if self.refused:
            return 1
        return 2 if self.targets else 0
