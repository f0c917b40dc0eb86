"""What a fleet plan says, per device: the revision it would get, or why it is refused.

The planner (`profiles`) renders every device a change affects and compares the
result with its current desired revision; a rollout (`rollouts`) publishes a
plan's targets wave by wave. Both speak these values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trueup.model.jsontypes import JSONObject
from trueup.model.layering import PathChange, Profile, Provenance

__all__ = [
    "Change",
    "LabelsChange",
    "Plan",
    "ProfileEdit",
    "ProfileRemoval",
    "Published",
    "Refusal",
    "Target",
    "VariablesChange",
]


@dataclass(frozen=True)
class Target:
    """A device whose rendered document differs from its current desired revision."""

    device_id: int
    device: str
    from_version: int  # the device's desired version the plan was made against (0: none)
    document: JSONObject  # the rendered, validated full document (DeviceState as JSON)
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


@dataclass(frozen=True)
class ProfileEdit:
    """A proposed profile: created, or replacing the stored one of the same name."""

    profile: Profile


@dataclass(frozen=True)
class ProfileRemoval:
    """A proposed deletion of the profile `name`."""

    name: str


@dataclass(frozen=True)
class VariablesChange:
    """Proposed variable values for one device (`None` removes a variable) and, when
    `replace_own` is set, its new own layer (`own`, a partial spec or None)."""

    device: str
    variables: Mapping[str, Any] = field(default_factory=dict)
    own: Mapping[str, Any] | None = None
    replace_own: bool = False


@dataclass(frozen=True)
class LabelsChange:
    """Proposed labels for one device (`None` removes a label)."""

    device: str
    labels: Mapping[str, str | None] = field(default_factory=dict)


# What a plan may propose; None plans the stored inputs as they are.
Change = ProfileEdit | ProfileRemoval | VariablesChange | LabelsChange


@dataclass(frozen=True)
class Published:
    """What publishing a plan stored: (device, new desired version) per target, and the
    targets refused (kind "concurrent": the device changed since the plan was made)."""

    stored: tuple[tuple[str, int], ...]
    refused: tuple[Refusal, ...]
