"""The values rendering takes and gives: inputs, the rendered document, its provenance, problems."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

__all__ = ["DeviceInputs", "PathChange", "Provenance", "RenderError", "RenderProblem", "Rendered"]


@dataclass(frozen=True)
class DeviceInputs:
    """What one device contributes: its name, labels, variable values and own layer.

    `own` is a partial `spec` (the device's overrides, applied last); a device
    that no profile selects renders from `own` alone, as a full document.
    """

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    variables: Mapping[str, Any] = field(default_factory=dict)
    own: Mapping[str, Any] | None = None


class ProfileVersionJSON(TypedDict):
    name: str
    version: int


class ProvenanceJSON(TypedDict):
    """A rendered document's provenance as stored and shown (`Provenance.as_json`)."""

    profiles: list[ProfileVersionJSON]
    variables_digest: str
    own_digest: str | None


@dataclass(frozen=True)
class Provenance:
    """Where a rendered document came from: profile versions in the order applied,
    the digest of the device's variable values, the digest of its own layer."""

    profiles: tuple[tuple[str, int], ...]
    variables_digest: str
    own_digest: str | None

    def as_json(self) -> ProvenanceJSON:
        return {
            "profiles": [{"name": name, "version": version} for name, version in self.profiles],
            "variables_digest": self.variables_digest,
            "own_digest": self.own_digest,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Provenance:
        return cls(
            profiles=tuple((str(p["name"]), int(p["version"])) for p in data.get("profiles", [])),
            variables_digest=str(data.get("variables_digest", "")),
            own_digest=data.get("own_digest"),
        )


@dataclass(frozen=True)
class Rendered:
    """A device's rendered desired document (validated by the document model) and its digest."""

    device: str
    document: dict[str, Any]
    digest: str
    provenance: Provenance


@dataclass(frozen=True)
class RenderProblem:
    """One reason a device cannot be rendered: which profile, which variable, which path."""

    message: str
    path: str = ""
    profile: str | None = None
    variable: str | None = None

    def __str__(self) -> str:
        where = []
        if self.profile is not None:
            where.append(f"profile {self.profile}")
        if self.variable is not None:
            where.append(f"variable {self.variable}")
        prefix = f"{self.path}: " if self.path else ""
        suffix = f" ({', '.join(where)})" if where else ""
        return f"{prefix}{self.message}{suffix}"


class RenderError(Exception):
    """A device's inputs do not render to a valid document; every problem at once."""

    def __init__(self, device: str, problems: list[RenderProblem]) -> None:
        self.device = device
        self.problems = problems
        super().__init__(f"{device}: " + "; ".join(str(p) for p in problems))


@dataclass(frozen=True)
class PathChange:
    """One difference between two documents: a path, and its old and new value.

    `op` is "add" (old is None), "remove" (new is None) or "change".
    """

    path: str
    op: str
    old: Any = None
    new: Any = None
