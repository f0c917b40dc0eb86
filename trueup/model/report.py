"""The report an agent sends the control plane: one typed model for both sides.

The agent builds it from its status (`trueup.agent.cpclient.report_from_status`)
and the server validates it (`POST /api/v1/agents/report`). Unknown fields are
kept with the report (evidence), so a newer agent can add fields without an
older server refusing the report. Bounds match the server's columns: one
device's report can never fail another's in a shared ingest batch.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from trueup.model.health import SubsystemHealth
from trueup.model.limits import DIGEST_LENGTH, MAX_VERSION, ORIGIN_LENGTH
from trueup.model.reasons import ReasonCode

__all__ = ["DIGEST_PATTERN", "MAX_VERSION", "AgentReport", "OverrideReport", "SubsystemReport"]

DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}$"


class SubsystemReport(BaseModel):
    model_config = ConfigDict(extra="allow")
    health: SubsystemHealth
    reason: str | None = Field(None, max_length=1000)
    since: str | float | None = Field(None, union_mode="left_to_right")


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
    observed_digest: str | None = Field(None, max_length=DIGEST_LENGTH, pattern=r"^[\x21-\x7e]*$")
    applied_digest: str | None = Field(None, pattern=DIGEST_PATTERN)
    applied_origin: str | None = Field(
        None, min_length=1, max_length=ORIGIN_LENGTH, pattern=r"^[a-z0-9][a-z0-9._-]*$"
    )
    override: OverrideReport | None = None
    diff_summary: dict[str, Any] = {}
    subsystems: dict[str, SubsystemReport] = {}
    reason_codes: list[ReasonCode] = []
    findings: list[dict[str, Any]] = []
    journal: dict[str, Any] = {}
    heartbeat_interval: float = Field(30.0, gt=0, le=86400)
    agent_version: str | None = Field(None, max_length=200)
    management_ready: bool | None = None
