"""A restore analysis as JSON (`trueup.backup.analysis.Analysis.to_json`): its parts, typed.

`trueup restore analyze -o json` and `POST /v1/restore/analyze` answer with it.
"""

from __future__ import annotations

from typing import TypedDict

from trueup.backup.format import AuditHead
from trueup.backup.reader import ProblemJSON
from trueup.journal.restore import ArchiveRevision, RestoreRevision

__all__ = [
    "AnalysisJSON",
    "ComponentInfo",
    "ComponentReport",
    "ConfigRevision",
    "DiffSummary",
    "LeasePlan",
    "RestorePlan",
]


class ConfigRevision(TypedDict):
    """The revision the archive's config component holds."""

    version: int
    digest: str | None
    origin: str | None
    accepted_at: str | None


class ComponentInfo(TypedDict, total=False):
    """What the analysis found of one component (each holds the keys of its component)."""

    present: bool
    revisions: int  # config
    revision: ConfigRevision  # config
    generation: str | None  # leases
    counts: dict[str, int]  # leases: per family
    source: dict[str, str] | None  # leases: per family, socket | memfile
    zones: list[str]  # native/dns
    lines: int  # audit
    head: AuditHead  # audit


class ComponentReport(ComponentInfo, total=False):
    """A component in the analysis' JSON: what was found, eligible or not, and why not."""

    eligible: bool
    problems: list[ProblemJSON]


class DiffSummary(TypedDict):
    """What applying the restored revision changes: per `spec` section, and the first paths."""

    sections: dict[str, str]  # section → added | removed | changed
    paths_changed: int
    paths: list[str]
    identical: bool


class LeasePlan(TypedDict):
    """The leases a full restore puts back."""

    restore: int | None
    per_family: dict[str, int]
    files: list[str]


class RestorePlan(TypedDict, total=False):
    """What a mode would do: the revision it applies, over which, with what changes."""

    revision: ConfigRevision | dict[str, object]  # {} when the config component has none
    current: RestoreRevision
    changes: DiffSummary
    interface_mappings: dict[str, str]
    eligible: bool
    leases: str | LeasePlan  # config-only: a sentence (the lease files are not touched)
    dns_zones: list[str]


class AnalysisJSON(TypedDict):
    """`trueup restore analyze -o json` (and `POST /v1/restore/analyze`)."""

    archive: str
    format_version: int | None
    device: str | None
    created_at: str | None
    agent_version: str | None
    revision: ArchiveRevision | None
    eligible: dict[str, bool]
    components: dict[str, ComponentReport]
    problems: list[ProblemJSON]
    refusals: dict[str, list[ProblemJSON]]
    warnings: list[str]
    mappings: dict[str, str]
    plans: dict[str, RestorePlan]
