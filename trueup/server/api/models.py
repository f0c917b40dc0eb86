"""Request bodies of the HTTP API, and the agent report as the server validates it.

Request bodies refuse unknown fields; the agent report keeps them (evidence),
so newer agents can add fields without an older server refusing the report.
Every field is bounded by `trueup.server.limits`, the sizes of the columns it
ends up in; names follow the name rules and text refuses control characters
(PostgreSQL refuses a NUL in text, and none belongs in a name or a comment).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema

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
    "OverrideReport",
    "RoleChange",
    "SecretPut",
    "SubsystemReport",
    "TokenCreate",
    "UserCreate",
    "check_text",
]

# Names: what `service.errors.check_name` accepts (trueup.server.inputs declares them).
NAME = NAME_PATTERN
DEVICE_NAME = DEVICE_NAME_PATTERN


# What a label key and value look like, as far as a JSON Schema can say (the prefix's
# 253-character bound is the service's to check).
_SEGMENT = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
KEY_PATTERN = rf"^({_SEGMENT}(\.{_SEGMENT})*/)?{_NAME}$"
VALUE_PATTERN = rf"^({_NAME})?$"
LABEL_VALUE_SCHEMA: dict[str, Any] = {"type": "string", "pattern": VALUE_PATTERN, "maxLength": 63}
LABELS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": f"label key -> value; a key is {LABEL_KEY_RULE}; a value is {LABEL_VALUE_RULE}",
    "propertyNames": {"pattern": KEY_PATTERN, "maxLength": LABEL_KEY_LENGTH},
    "additionalProperties": LABEL_VALUE_SCHEMA,
    "maxProperties": LABELS_MAX,
}


class DeviceCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: DeviceName
    # Checked by the service (labels.<key>: what is expected), declared for the schema.
    labels: Annotated[dict[str, Any], WithJsonSchema(LABELS_SCHEMA)] | None = None


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
