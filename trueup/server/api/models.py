"""Request bodies of the HTTP API, and the agent report as the server validates it.

Request bodies refuse unknown fields; the agent report keeps them (evidence),
so newer agents can add fields without an older server refusing the report.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from trueup.model.report import AgentReport, OverrideReport, SubsystemReport
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
