"""The control plane's records that stay dicts: revisions, profiles, device inputs,
secrets, users and tokens, enrollment, labels, the audit log as listed.

Each is a `TypedDict`: the value is the very dict the API returns as JSON (or an
audit entry records), so typing it changes no byte on the wire.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict

from trueup.model.jsontypes import JSONObject
from trueup.model.layering.types import ProvenanceJSON

__all__ = [
    "AuditEntry",
    "DeviceCredential",
    "DeviceSecrets",
    "EnrollmentBundle",
    "InputsDetail",
    "InputsSummary",
    "LabelsSet",
    "PathChangeJSON",
    "PlanCounts",
    "PlanJSON",
    "PlanRefusal",
    "PlannedTarget",
    "ProfileSummary",
    "PublishedRevision",
    "RefusedSecret",
    "RevisionDetail",
    "RevisionSummary",
    "SecretName",
    "StoredSecret",
    "TokenEntry",
    "UserEntry",
]


class RevisionSummary(TypedDict):
    """A desired revision as listed (its document apart)."""

    device: str
    version: int
    parent_version: int | None
    author: str
    comment: str
    content_hash: str
    created_at: float
    provenance: ProvenanceJSON | None
    confirm_within: int | None


class RevisionDetail(TypedDict):
    """The audit detail of `revision.create`."""

    device_id: int
    version: int
    parent_version: int | None
    content_hash: str
    author: str
    comment: str
    provenance: NotRequired[ProvenanceJSON]
    confirm_within: NotRequired[int]


class ProfileSummary(TypedDict):
    """A stored profile version as listed (its document apart)."""

    name: str
    version: int
    digest: str
    created_by: str
    created_at: float
    comment: str
    deleted: bool


class InputsSummary(TypedDict):
    """A device's stored inputs: its variable values and its own layer."""

    device: str
    version: int
    variables: JSONObject  # the operator's values, by variable name
    own: JSONObject | None  # a partial spec (checked when rendered)
    updated_by: str | None
    updated_at: float | None


class InputsDetail(TypedDict):
    """The audit detail of `device.variables`."""

    device_id: int
    version: int
    variables_digest: str
    own_digest: str | None
    names: list[str]
    reason: NotRequired[str]


class StoredSecret(TypedDict):
    """A device secret just stored (its value is never shown again)."""

    id: str
    device: str
    name: str
    version: int


class SecretName(TypedDict):
    """A device secret as listed: its id, name and when it was stored."""

    id: str
    name: str
    created_at: float


class RefusedSecret(TypedDict):
    """A secret not served, and why."""

    name: str
    error: str


class DeviceSecrets(TypedDict):
    """A device's secrets as its agent fetches them: name -> value, and the refused ones."""

    secrets: dict[str, str]
    refused: list[RefusedSecret]


class UserEntry(TypedDict):
    """A user as listed."""

    name: str
    role: str
    created_at: float


class TokenEntry(TypedDict):
    """A token as listed (never its hash): whose it is and whether it is revoked."""

    id: int
    kind: str
    label: str
    created_at: float
    revoked_at: float | None
    user: str | None
    device: str | None


class EnrollmentBundle(TypedDict):
    """The one-time enrollment bundle an agent trades for its credential."""

    kind: str  # "trueup-enrollment"
    control_plane: str
    tenant: str
    device: str
    token: str
    expires_at: float
    server_certificate_sha256: NotRequired[str]


class DeviceCredential(TypedDict):
    """What an agent gets for its enrollment token: its device credential."""

    tenant: str
    device: str
    credential: str


class LabelsSet(TypedDict):
    """A device's labels after a change, and whether the change changed them."""

    device: str
    labels: dict[str, str]
    changed: bool


class AuditEntry(TypedDict):
    """One audit log entry as the API lists it."""

    seq: int
    at: float
    actor: str
    action: str
    target: str
    detail: JSONObject  # the action's own record (auditfacts.py names each one's keys)
    row_hash: str


class PathChangeJSON(TypedDict):
    """One path a plan changes on a device: `op` add, remove or change; the JSON values."""

    path: str
    op: str
    old: object
    new: object


class PlannedTarget(TypedDict):
    """A device a plan changes."""

    device: str
    from_version: int
    digest: str
    provenance: ProvenanceJSON
    changes: list[PathChangeJSON]


class PlanRefusal(TypedDict):
    """A device a plan (or its publishing) cannot send the change to, and why."""

    device: str
    kind: str
    problems: list[str]


class PlanCounts(TypedDict):
    changed: int
    refused: int
    unchanged: int


class PublishedRevision(TypedDict):
    device: str
    version: int


class PlanJSON(TypedDict):
    """A fleet plan as the API answers it (and `trueup fleet plan -o json` prints it);
    publishing it adds what it stored."""

    targets: list[PlannedTarget]
    refused: list[PlanRefusal]
    counts: PlanCounts
    exit_code: int
    digest: str
    published: NotRequired[list[PublishedRevision]]
