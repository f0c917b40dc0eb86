"""The status document and the drift report: one typed model for whoever builds or reads them.

`trueup.reconcile.status.build_status` builds a `Status` (the agent behind
`/v1/status`, the CLI when no agent answers); `Status.to_json()` is the body
served and printed. Who reads a status document — the drift report, the
control-plane report (`trueup.agent.cpclient.report_from_status`) — parses it
back with `Status.read(body)`, so both ends share one shape:

```
device, observed_at, versions{…}, management{…}, subsystems{NAME: {…, system{…}}},
journal{open, last, writer}, state_directory{path, damaged[…], writes_refused},
reason_codes[…], fences[…], restore{…}, limitations[…],
stale[…]                                    (subsystems shown from their last look)
confirmation{version, state, deadline, reason}  (the last guarded apply, when there was one)
pending_confirmation, reconcile_loop, drift_history, acknowledgements_ended  (from the loop)
agent{…}                                    (from an agent)
control_plane{…}                            (when a control plane manages the device)
```

A key that is optional is left out of the body when it was never set (a
`None` set on purpose is kept: the loop reports `confirmation: null`).
Sections other layers own (the loop's per-subsystem policy, startup's
verdicts, the agent's management health) ride along as extra keys, kept
as they are (`extra="allow"`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer

from trueup.model.health import SubsystemHealth
from trueup.model.jsontypes import JSONObject
from trueup.model.reasons import Finding
from trueup.model.records import DamageRecord, Override, TransactionSummary

__all__ = [
    "DriftBody",
    "JournalStatus",
    "ManagementStatus",
    "StateDirectoryStatus",
    "Status",
    "SubsystemStatus",
    "Versions",
]


class _Body(BaseModel):
    """A JSON body whose optional keys are absent until set."""

    model_config = ConfigDict(extra="allow")
    _optional: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _absent_left_out(self, handler: SerializerFunctionWrapHandler) -> Any:
        out = handler(self)
        if isinstance(out, dict):
            for name in self._optional - self.model_fields_set:
                out.pop(name, None)
        return out

    def to_json(self) -> JSONObject:
        body: JSONObject = self.model_dump(mode="json")
        return body


class Versions(_Body):
    """Which revision is applied, where it came from, and the control plane's."""

    applied: int = 0
    control_plane: int | None = None
    outcome: str | None = None
    applied_at: str | None = None
    applied_digest: str | None = None
    origin: str | None = None
    control_plane_applied: int | None = None
    override: Override | None = None


class ManagementStatus(_Body):
    """Management readiness from the document and the system (the agent lays its own over it)."""

    ready: bool = False
    interface: str | None = None
    addresses: list[str] = []
    missing_addresses: list[str] = []
    override: JSONObject | None = None
    # Another writer keeps changing management (path → writer, flips, since).
    fought: JSONObject = {}


class SubsystemStatus(_Body):
    """One subsystem: health and why, its differences, and what the loop and startup add."""

    _optional = frozenset({"stale", "system"})

    tier: str = ""
    health: SubsystemHealth = SubsystemHealth.PENDING
    reason: str = ""
    differences: list[JSONObject] = []
    accepted: list[JSONObject] = []
    policy: str | None = None
    stale: JSONObject | None = None  # shown from its last look: when, and why
    system: JSONObject | None = None  # `Subsystem.report`: observations beside the facts


class JournalStatus(_Body):
    open: TransactionSummary | None = None
    last: TransactionSummary | None = None
    writer: JSONObject | None = None  # the writer lock's holder


class StateDirectoryStatus(_Body):
    path: str = ""
    damaged: list[DamageRecord] = []
    writes_refused: bool = False


class Status(_Body):
    """The status document (`/v1/status`, `trueup status -o json`)."""

    _optional = frozenset(
        {
            "stale",
            "pending_confirmation",
            "confirmation",
            "reconcile_loop",
            "drift_history",
            "acknowledgements_ended",
            "agent",
            "control_plane",
        }
    )

    device: str | None = None
    observed_at: str | None = None
    versions: Versions = Versions()
    management: ManagementStatus = ManagementStatus()
    subsystems: dict[str, SubsystemStatus] = {}
    journal: JournalStatus = JournalStatus()
    state_directory: StateDirectoryStatus = StateDirectoryStatus()
    reason_codes: list[Finding] = []
    fences: list[JSONObject] = []
    restore: JSONObject | None = None
    limitations: list[JSONObject] = []
    stale: list[str] | None = None
    pending_confirmation: JSONObject | None = None
    confirmation: JSONObject | None = None
    reconcile_loop: JSONObject | None = None
    drift_history: list[JSONObject] | None = None
    acknowledgements_ended: list[JSONObject] | None = None
    agent: JSONObject | None = None
    control_plane: JSONObject | None = None

    @classmethod
    def read(cls, body: Mapping[str, Any]) -> Status:
        """A status document as served (`to_json()`), typed again."""
        return cls.model_validate(body)


class DriftBody(_Body):
    """`/v1/drift`, `trueup drift -o json`: what differs from the applied revision, and why."""

    in_sync: bool
    observed_at: str | None = None
    applied_version: int = 0
    differences: list[JSONObject] = []
    reason_codes: list[Finding] = []
    # Per subsystem, the drift going on and the last one that ended, healed or not.
    drift: dict[str, JSONObject] = {}
    last_drift: dict[str, JSONObject] = {}
