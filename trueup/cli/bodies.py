"""The agent API's answers as the CLI reads them (`docs/agent-api.md`), for the type checker.

The CLI's renderers and its fast path read these bodies as decoded JSON, with
the standard library only; these `TypedDict`s name the keys they read, and are
imported only under `TYPE_CHECKING` (never at run time). The local device
(`trueup.cli.device.LocalDevice`) answers with the same shapes, built from the
engine's records.
"""

from __future__ import annotations

from typing import Any, TypedDict

from trueup.journal.restore import RestoreRecord
from trueup.model.drift import Attribution
from trueup.reconcile.planning import ObservedByJSON

__all__ = [
    "Acknowledgement",
    "AgentRecord",
    "ApplyBody",
    "Attribution",
    "ConfirmationBody",
    "DifferenceBody",
    "DriftRecord",
    "DriftReport",
    "Finding",
    "HealedBy",
    "HelpScreen",
    "JournalBody",
    "LastDrift",
    "LimitationRecord",
    "ManagementBody",
    "MessageBody",
    "OpenTransaction",
    "PendingConfirmation",
    "PlanBody",
    "PlanStep",
    "RestoreRefusal",
    "RetryBudget",
    "StartupPhase",
    "StatusBody",
    "SubsystemPlan",
    "SubsystemStatus",
    "VersionsBody",
]


class MessageBody(TypedDict, total=False):
    """`/v1/confirm`, `/v1/ack`: whether it was done and the line to print."""

    ok: bool
    message: str


class PendingConfirmation(TypedDict, total=False):
    version: int
    deadline: str


class ApplyBody(TypedDict, total=False):
    """`/v1/apply`, `/v1/rollback`, `/v1/reconcile`: an `ApplyResult` as JSON."""

    ok: bool
    version: int
    outcome: str
    txn: str | None
    steps: list[str]
    failed: dict[str, str]
    rollback_errors: list[str]
    waiting: dict[str, str]
    origin: str
    digest: str
    attempted_version: int
    carried: dict[str, str]
    cleared: list[str]
    pending_confirmation: PendingConfirmation
    message: str


class PlanStep(TypedDict, total=False):
    """One step of a plan: the step's JSON, its description, old → new values."""

    subsystem: str
    action: str
    path: str
    describe: str
    args: dict[str, object]
    old: object
    new: object


class SubsystemPlan(TypedDict, total=False):
    subsystem: str
    steps: list[PlanStep]
    noop: list[str]
    error: str | None


class PlanBody(TypedDict, total=False):
    """`/v1/plan`: what applying a document would change."""

    changes: bool
    plans: list[SubsystemPlan]
    failed: dict[str, str]
    management_changes: list[str]
    needs_confirmation: bool
    managed_by: str | None
    observed_by: ObservedByJSON  # the agent (its pid) or this process (its namespace)


class StartupPhase(TypedDict):
    name: str
    state: str


class AgentRecord(TypedDict, total=False):
    """The status's `agent`: who answers (or that nobody does) on the state directory."""

    pid: int
    version: str
    running: bool
    answering: bool
    state_dir: str
    startup: list[StartupPhase]


# -- the status document's parts the tables read (`trueup status`, `trueup drift`) ------
class Finding(TypedDict, total=False):
    """A reason code with its subsystem, paths, detail and corrective action."""

    code: str
    subsystem: str | None
    paths: list[str]
    since: str | None
    detail: object
    action: str


class DifferenceBody(TypedDict, total=False):
    subsystem: str
    path: str
    desired: object
    observed: object
    limitation: str


class DriftRecord(TypedDict, total=False):
    """A drift still open: since when, how it was seen, who changed it."""

    since: str
    paths: list[str]
    detected_by: str
    attribution: list[Attribution]


class HealedBy(TypedDict, total=False):
    writer: str
    actor: str


class LastDrift(DriftRecord, total=False):
    """A drift that ended, healed by trueup or put back by its writer."""

    ended_at: str
    healed_by: HealedBy | None


class Acknowledgement(TypedDict, total=False):
    until_at: str
    actor: str
    reason: str


class RetryBudget(TypedDict, total=False):
    used: int
    limit: int


class SubsystemStatus(TypedDict, total=False):
    """One subsystem's row of the status document."""

    tier: str
    health: str
    policy: str | None
    reason: str | None
    breaker: str
    acknowledged_until: str | None
    acknowledgement: Acknowledgement | None
    contested: list[str]
    fought: list[str]
    stale: dict[str, float | None] | None
    differences: list[DifferenceBody]
    accepted: list[DifferenceBody]
    drift: DriftRecord | None
    last_drift: LastDrift | None
    consecutive_failures: int
    backoff_seconds: float
    next_attempt_at: str | None
    retry_budget: RetryBudget | None
    # The subsystem's own report beside its facts (routing: sessions and adjacencies).
    system: dict[str, object]


class LimitationRecord(TypedDict, total=False):
    """A known limitation (`trueup.journal.limitations`), as `/v1/limitations` answers it."""

    id: str
    subsystem: str
    path: str
    reason: str
    reviewed_by: str
    ticket: str | None
    added_at: str
    actor: str
    withdrawn_at: str | None
    withdraw_reason: str | None


class VersionsBody(TypedDict, total=False):
    """The status's `versions`: the applied revision, where it came from, the control plane's."""

    applied: int
    control_plane: int | None
    outcome: str | None
    applied_at: str | None
    applied_digest: str | None
    origin: str | None
    control_plane_applied: int | None


class ManagementBody(TypedDict, total=False):
    """The status's `management`: ready or not, the interface and its addresses."""

    ready: bool
    interface: str | None
    addresses: list[str]
    missing_addresses: list[str]


class OpenTransaction(TypedDict, total=False):
    txn: str
    version: int


class JournalBody(TypedDict, total=False):
    open: OpenTransaction | None
    last: OpenTransaction | None


class ConfirmationBody(TypedDict, total=False):
    """The last guarded apply: its version, whether it is pending, confirmed or rolled back."""

    version: int
    state: str
    deadline: str | None
    reason: str | None


class RestoreRefusal(TypedDict, total=False):
    """`/v1/restore/apply` refused: why, and what to run next."""

    message: str
    detail: str
    next: str | None
    problems: list[object]


class StatusBody(TypedDict, total=False):
    """`/v1/status`, `trueup status -o json` (`trueup.model.status.Status`), as the table reads it."""

    device: str | None
    observed_at: str | None
    versions: VersionsBody
    management: ManagementBody
    subsystems: dict[str, SubsystemStatus]
    journal: JournalBody
    reason_codes: list[Finding]
    restore: RestoreRecord | None
    limitations: list[LimitationRecord]
    pending_confirmation: PendingConfirmation | None
    confirmation: ConfirmationBody | None
    agent: AgentRecord | None


class DriftReport(TypedDict, total=False):
    """`/v1/drift`, `trueup drift -o json` (`trueup.model.status.DriftBody`)."""

    in_sync: bool
    observed_at: str | None
    applied_version: int
    differences: list[DifferenceBody]
    reason_codes: list[Finding]
    drift: dict[str, DriftRecord]
    last_drift: dict[str, LastDrift]


# -- `trueup --help` without typer (`trueup.cli.helptext`) ------------------------------
class HelpScreen(TypedDict):
    """`trueup.cli.helptext.HELP`: typer's top-level help, each text as its pieces
    (`[text, SGR parameters]`), generated by `trueup.cli.helpgen`."""

    usage: list[list[str]]
    usage_style: str
    description: list[list[list[str]]]  # the paragraphs
    options: list[list[list[list[str]]]]  # each option's [lead, help]
    options_prefix: int
    commands: list[list[Any]]  # each command's [name, help]
    command_width: int
    border: str
    command_style: str
