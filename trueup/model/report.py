"""The report an agent sends the control plane: one typed model for both sides.

The agent builds it from its status (`trueup.agent.cpreport.report_from_status`)
and the server validates it (`POST /api/v1/agents/report`). Unknown fields are
kept with the report (evidence), so a newer agent can add fields without an
older server refusing the report. Bounds match the server's columns: one
device's report can never fail another's in a shared ingest batch.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from trueup.model.health import SubsystemHealth
from trueup.model.limits import DIGEST_LENGTH, MAX_VERSION, ORIGIN_LENGTH
from trueup.model.reasons import ReasonCode

__all__ = [
    "DIGEST_PATTERN",
    "MAX_VERSION",
    "AckReport",
    "AgentReport",
    "ConfirmationReport",
    "DriftReport",
    "OverrideReport",
    "SubsystemReport",
]

DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}$"

# An apiVersion (`trueup/v1`) or a section name (`dhcp`, a plugin's `acme.vpn`).
_Supported = Annotated[str, StringConstraints(max_length=100, pattern=r"^[^\x00-\x1f\x7f]+$")]


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


class DriftReport(BaseModel):
    """One drift record: going on (`healed_at` None) or ended, who changed it and who healed it."""

    model_config = ConfigDict(extra="allow")
    subsystem: str = Field(min_length=1, max_length=100)
    since: str = Field(min_length=1, max_length=64)
    healed_at: str | None = Field(None, max_length=64)
    detected_by: str | None = Field(None, max_length=20)
    paths: list[str] = Field([], max_length=50)
    paths_total: int | None = Field(None, ge=0, le=MAX_VERSION)
    changed_by: list[str] = Field([], max_length=20)
    attribution: list[dict[str, Any]] = Field([], max_length=20)
    healed_by: dict[str, Any] | None = None


class AckReport(BaseModel):
    """A `trueup ack` set on the router: active, or recently ended (expired, withdrawn)."""

    model_config = ConfigDict(extra="allow")
    subsystem: str = Field(min_length=1, max_length=100)
    until: str | None = Field(None, max_length=64)
    by: str | None = Field(None, max_length=200)
    reason: str | None = Field(None, max_length=10_000)
    at: str | None = Field(None, max_length=64)
    state: str = Field("active", pattern=r"^(active|expired|withdrawn)$")
    ended_at: str | None = Field(None, max_length=64)


class ConfirmationReport(BaseModel):
    """The last apply guarded by a confirmation window, as the agent reports it: `pending`
    (until `deadline`, epoch seconds; `reason` says what it waits for), `confirmed` (why) or
    `rolled-back` (why: what it still waited for when the window passed)."""

    model_config = ConfigDict(extra="allow")
    version: int | None = Field(None, ge=0, le=MAX_VERSION)
    state: str = Field(pattern=r"^(pending|confirmed|rolled-back)$")
    deadline: float | None = Field(None, ge=0, le=1e11)
    reason: str = Field("", max_length=1000)
    rollback_to: int | None = Field(None, ge=0, le=MAX_VERSION)
    rolled_back_to_version: int | None = Field(None, ge=0, le=MAX_VERSION)
    origin: str | None = Field(None, max_length=ORIGIN_LENGTH)
    at: str | None = Field(None, max_length=64)


class AgentReport(BaseModel):
    """What an agent reports after every change and on every heartbeat.

    Unknown fields are kept with the report (evidence), so newer agents can add some.
    `applied_digest` is `document_digest` of the applied document (metadata.version
    ignored), compared with the desired revision's content_hash; `applied_origin`
    says where that document came from; `override` is set while a local apply
    overrides the control plane's revision. `agent_version` is the agent's own version
    (`trueup --version`), `supported_api_versions` the document apiVersions it accepts
    and `supported_sections` the sections of `spec` it knows (core and subsystems',
    plugins' included); older agents send none of the three (None: not reported).
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
    agent_version: str | None = Field(None, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")
    supported_api_versions: list[_Supported] | None = Field(None, max_length=20)
    supported_sections: list[_Supported] | None = Field(None, max_length=200)
    management_ready: bool | None = None
    # Drift going on and recently ended, newest first; the router's acknowledgements.
    drift_history: list[DriftReport] = Field([], max_length=50)
    acknowledgements: list[AckReport] = Field([], max_length=50)
    # The last apply guarded by a confirmation window; older agents send none.
    confirmation: ConfirmationReport | None = None
