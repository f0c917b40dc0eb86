"""Request bodies of the HTTP API, and the agent report as the server validates it.

Request bodies refuse unknown fields; the agent report keeps them (evidence),
so newer agents can add fields without an older server refusing the report.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from trueup.model.health import SubsystemHealth
from trueup.model.reasons import ReasonCode
from trueup.server.tokens import Role

__all__ = [
    "AckCreate",
    "AgentReport",
    "DeviceCreate",
    "OverrideReport",
    "RoleChange",
    "SecretPut",
    "SubsystemReport",
    "TokenCreate",
    "UserCreate",
]

DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}$"
MAX_VERSION = 2**31 - 1  # an INTEGER column on both databases


class SubsystemReport(BaseModel):
    model_config = ConfigDict(extra="allow")
    health: SubsystemHealth
    reason: str | None = None
    since: str | float | None = None


class OverrideReport(BaseModel):
    """A local apply that overrides the control plane's revision, as the agent reports it."""

    model_config = ConfigDict(extra="allow")
    version: int = Field(ge=0, le=MAX_VERSION)
    actor: str = Field("", max_length=200)
    at: str | None = Field(None, max_length=64)
    reason: str = Field("", max_length=1000)
    digest: str | None = Field(None, pattern=DIGEST_PATTERN)


class AgentReport(BaseModel):
    """What an agent reports after every change and on every heartbeat.

    Unknown fields are kept with the report (evidence), so newer agents can add some.
    `applied_digest` is `document_digest` of the applied document (metadata.version
    ignored), compared with the desired revision's content_hash; `applied_origin`
    says where that document came from; `override` is set while a local apply
    overrides the control plane's revision.
    """

    model_config = ConfigDict(extra="allow")
    applied_version: int | None = Field(None, ge=0, le=MAX_VERSION)
    observed_digest: str | None = Field(None, max_length=80, pattern=r"^[\x21-\x7e]*$")
    applied_digest: str | None = Field(None, pattern=DIGEST_PATTERN)
    applied_origin: str | None = Field(
        None, min_length=1, max_length=32, pattern=r"^[a-z0-9][a-z0-9._-]*$"
    )
    override: OverrideReport | None = None
    diff_summary: dict[str, Any] = {}
    subsystems: dict[str, SubsystemReport] = {}
    reason_codes: list[ReasonCode] = []
    findings: list[dict[str, Any]] = []
    journal: dict[str, Any] = {}
    heartbeat_interval: float = Field(30.0, gt=0, le=86400)
    agent_version: str | None = None
    management_ready: bool | None = None


class DeviceCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str


class UserCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    role: Role


class RoleChange(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Role


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    label: str = ""


class AckCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    subsystem: str
    for_seconds: float
    reason: str


class SecretPut(BaseModel):
    model_config = ConfigDict(extra="forbid")
    value: str = Field(max_length=65536)
