"""Request bodies of the HTTP API, and the agent report as the server validates it.

Request bodies refuse unknown fields; the agent report keeps them (evidence),
so newer agents can add fields without an older server refusing the report.
Every field is bounded by `trueup.server.limits`, the sizes of the columns it
ends up in; names follow the name rules and text refuses control characters
(PostgreSQL refuses a NUL in text, and none belongs in a name or a comment).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema

from trueup.model.document import supported_sections
from trueup.model.jsontypes import JSONObject
from trueup.model.layering.selectors import LABEL_KEY_RULE, LABEL_VALUE_RULE
from trueup.model.report import AgentReport, OverrideReport, SubsystemReport
from trueup.server.inputs import (
    DEVICE_NAME_PATTERN,
    NAME_PATTERN,
    AckReason,
    AckSeconds,
    DeviceName,
    Label,
    Name,
    SubsystemName,
    Text,
    check_label,
    check_text,
)
from trueup.server.limits import (
    AGENT_VERSION_LENGTH,
    LABEL_KEY_LENGTH,
    LABELS_MAX,
    MAX_INT32,
    MAX_VERSION,
    SECRET_VALUE_LENGTH,
)
from trueup.server.service.deviceinputs import MAX_VARIABLES, VARIABLE_NAME_PATTERN
from trueup.server.tokens import Role

__all__ = [
    "DEVICE_NAME",
    "LABELS_SCHEMA",
    "LABEL_VALUE_SCHEMA",
    "NAME",
    "AckCreate",
    "AgentReport",
    "BackupMetadata",
    "DeviceCreate",
    "LabelsProposal",
    "OverrideReport",
    "PlanChange",
    "PlanRequest",
    "ProfileDeletion",
    "ProfileProposal",
    "PublishRequest",
    "RoleChange",
    "SecretPut",
    "SubsystemReport",
    "TokenCreate",
    "UserCreate",
    "VariablesProposal",
    "VariablesPut",
    "check_text",
]

SELECTOR_LENGTH = 4000  # a label selector (`site=ams,role in (edge,core)`)

# Names: what `service.errors.check_name` accepts (trueup.server.inputs declares them).
NAME = NAME_PATTERN
DEVICE_NAME = DEVICE_NAME_PATTERN


# What a label key and value look like, as far as a JSON Schema can say (the prefix's
# 253-character bound is the service's to check). The schemas are JSON Schema documents
# (JSONObject), and the bodies they describe stay JSON objects as sent: the service checks
# them, so that its messages name each problem (labels.<key>: what is expected).
_SEGMENT = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
KEY_PATTERN = rf"^({_SEGMENT}(\.{_SEGMENT})*/)?{_NAME}$"
VALUE_PATTERN = rf"^({_NAME})?$"
LABEL_VALUE_SCHEMA: JSONObject = {"type": "string", "pattern": VALUE_PATTERN, "maxLength": 63}
LABELS_SCHEMA: JSONObject = {
    "type": "object",
    "description": f"label key -> value; a key is {LABEL_KEY_RULE}; a value is {LABEL_VALUE_RULE}",
    "propertyNames": {"pattern": KEY_PATTERN, "maxLength": LABEL_KEY_LENGTH},
    "additionalProperties": LABEL_VALUE_SCHEMA,
    "maxProperties": LABELS_MAX,
}


_LABELS_PATCH_SCHEMA: JSONObject = {
    **LABELS_SCHEMA,
    "additionalProperties": {"anyOf": [LABEL_VALUE_SCHEMA, {"type": "null"}]},
}


class DeviceCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: DeviceName
    # Checked by the service (labels.<key>: what is expected), declared for the schema;
    # until then a JSON object as sent.
    labels: Annotated[JSONObject, WithJsonSchema(LABELS_SCHEMA)] | None = None


class UserCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: Name
    role: Role


class RoleChange(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Role


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    label: Label = ""


class AckCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    subsystem: SubsystemName
    for_seconds: AckSeconds
    reason: AckReason


class SecretPut(BaseModel):
    model_config = ConfigDict(extra="forbid")
    value: str = Field(max_length=SECRET_VALUE_LENGTH)


class BackupMetadata(BaseModel):
    """What an uploading agent says about its archive (`X-Trueup-Backup-Metadata`, JSON).

    Every field is optional; the archive itself is opaque to the control plane."""

    model_config = ConfigDict(extra="forbid")
    format_version: int | None = Field(None, ge=1, le=MAX_INT32)
    created_at: float | None = Field(None, ge=0, allow_inf_nan=False)
    agent_version: (
        Annotated[str, Field(max_length=AGENT_VERSION_LENGTH), AfterValidator(check_label)] | None
    ) = None
    applied_revision: int | None = Field(None, ge=0, le=MAX_VERSION)
    with_leases: bool | None = None


# What the service checks a device's inputs against (service/deviceinputs.py), stated.
VARIABLES_SCHEMA: JSONObject = {
    "type": "object",
    "description": "variable name -> value (null is not a value)",
    "propertyNames": {"pattern": VARIABLE_NAME_PATTERN},
    "additionalProperties": {"not": {"type": "null"}},
    "maxProperties": MAX_VARIABLES,
}
OWN_SCHEMA: JSONObject = {
    "anyOf": [
        {
            "type": "object",
            "description": "a partial spec: sections of a device document",
            "propertyNames": {"enum": supported_sections()},
        },
        {"type": "null"},
    ]
}


class VariablesPut(BaseModel):
    """A device's variable values (name: value) and its own layer (a partial spec, or null;
    left out: the one the plan uses now stays — for a device without stored inputs, its
    desired document's spec)."""

    model_config = ConfigDict(extra="forbid")
    # Values as sent (any JSON), and a partial spec: the service checks both.
    variables: Annotated[JSONObject, WithJsonSchema(VARIABLES_SCHEMA)] = {}
    own: Annotated[JSONObject | None, WithJsonSchema(OWN_SCHEMA)] = None


class ProfileProposal(BaseModel):
    """A proposed profile: created, or replacing the stored one of its name."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["profile"]
    # Checked by the profile model (every problem with its path), like a desired document.
    document: JSONObject


class ProfileDeletion(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["profile-delete"]
    name: Name


class VariablesProposal(BaseModel):
    """Variable values for one device (null removes one); `own` replaces its own layer
    when `replace_own` is set."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["variables"]
    device: DeviceName
    # As sent, like VariablesPut's: the service checks them.
    variables: JSONObject = {}
    own: JSONObject | None = None
    replace_own: bool = False


class LabelsProposal(BaseModel):
    """Labels for one device (null removes one)."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["labels"]
    device: DeviceName
    # As sent (a value or null): the service checks each, like DeviceCreate's.
    labels: Annotated[JSONObject, WithJsonSchema(_LABELS_PATCH_SCHEMA)]


PlanChange = Annotated[
    ProfileProposal | ProfileDeletion | VariablesProposal | LabelsProposal,
    Field(discriminator="kind"),
]


class PlanRequest(BaseModel):
    """The change to plan (none: the stored inputs as they are) and the devices to plan."""

    model_config = ConfigDict(extra="forbid")
    # Parsed by the selector grammar (the problem names its position).
    selector: str = Field("", max_length=SELECTOR_LENGTH)
    change: PlanChange | None = None


class PublishRequest(BaseModel):
    """Publish the plan of the stored inputs; `expect` (device: digest) refuses a device
    whose rendered digest is no longer the one shown in the plan."""

    model_config = ConfigDict(extra="forbid")
    selector: str = Field("", max_length=SELECTOR_LENGTH)
    comment: Text = ""
    expect: dict[str, str] | None = None
