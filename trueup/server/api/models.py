"""Request bodies of the HTTP API, and the agent report as the server validates it.

Request bodies refuse unknown fields; the agent report keeps them (evidence),
so newer agents can add fields without an older server refusing the report.
Every field is bounded by `trueup.server.limits`, the sizes of the columns it
ends up in; names follow the name rules and text refuses control characters
(PostgreSQL refuses a NUL in text, and none belongs in a name or a comment).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from trueup.model.report import AgentReport, OverrideReport, SubsystemReport
from trueup.server.limits import (
    AGENT_VERSION_LENGTH,
    DEVICE_NAME_LENGTH,
    MAX_INT32,
    MAX_VERSION,
    NAME_LENGTH,
    SECRET_VALUE_LENGTH,
    SUBSYSTEM_LENGTH,
    TEXT_LENGTH,
    TOKEN_LABEL_LENGTH,
    has_control_characters,
)
from trueup.server.tokens import Role

__all__ = [
    "DEVICE_NAME",
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

# Names: what `service.errors.check_name` accepts, as a schema for path parameters
# (a body's name is checked by the service, whose message names the rule).
NAME = rf"^[A-Za-z0-9][A-Za-z0-9_.\-]{{0,{NAME_LENGTH - 1}}}$"
DEVICE_NAME = rf"^[A-Za-z0-9][A-Za-z0-9_.\-]{{0,{DEVICE_NAME_LENGTH - 1}}}$"


def check_text(value: str) -> str:
    """Free text that is stored: no control characters but tab and newline."""
    if has_control_characters(value, allow="\t\n"):
        raise ValueError("control characters (NUL, escape, …) are not accepted")
    return value


def _check_label(value: str) -> str:
    if has_control_characters(value):
        raise ValueError("control characters (NUL, escape, newline, …) are not accepted")
    return value


Text = Annotated[str, Field(max_length=TEXT_LENGTH), AfterValidator(check_text)]


class DeviceCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=DEVICE_NAME_LENGTH)  # the name rules are the service's


class UserCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=NAME_LENGTH)
    role: Role


class RoleChange(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Role


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    label: Annotated[str, Field(max_length=TOKEN_LABEL_LENGTH), AfterValidator(_check_label)] = ""


class AckCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    subsystem: str = Field(
        min_length=1, max_length=SUBSYSTEM_LENGTH, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$"
    )
    for_seconds: float = Field(allow_inf_nan=False)  # the range is the service's (30 days)
    reason: Text


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
        Annotated[str, Field(max_length=AGENT_VERSION_LENGTH), AfterValidator(_check_label)] | None
    ) = None
    applied_revision: int | None = Field(None, ge=0, le=MAX_VERSION)
    with_leases: bool | None = None
