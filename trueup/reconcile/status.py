"""The status document, built in one place; the drift report derived from it.

Who calls this: the agent (`Agent.status()` behind `/v1/status`, `/v1/drift`,
`/metrics`, the control-plane report) and the CLI when no agent answers
(`gather`). Both go through `build_status`, which returns the typed
`trueup.model.status.Status` (its shape, and the JSON body `to_json()` gives,
are defined there); `drift_report` and the control-plane report read a
status body back through the same model.

Facts come from the state directory and the system (`trueup.reconcile.
statuslook.observe`); the reason codes from `classify()`; the loop's healing
state from its view (`trueup.reconcile.view.LoopView`); the rest from the
agent's typed inputs.

Why this module is over 400 lines: every section of the document — versions,
management, each subsystem's health, accepted differences under a known
limitation, pending confirmations, refused writes — is built here, next to
the others, so that none can drift from the shape `Status` defines.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypedDict, TypeVar

from pydantic import BaseModel

from trueup.journal.atomic import StateFileError
from trueup.journal.audit import now_iso
from trueup.journal.confirm import ConfirmState, read_outcome, read_pending
from trueup.journal.journal import Transaction
from trueup.journal.limitations import accept_covered, active_limitations
from trueup.journal.lock import lock_holder
from trueup.journal.override import OVERRIDE_FILE, ManagementFacts, same_facts
from trueup.journal.restore import restore_status
from trueup.model.document import DeviceState, DocumentError
from trueup.model.health import SubsystemHealth
from trueup.model.jsontypes import JSONObject
from trueup.model.order import natural_sorted
from trueup.model.reasons import Finding, ReasonCode
from trueup.model.records import Applied, DamageRecord
from trueup.model.status import (
    DriftBody,
    JournalStatus,
    ManagementStatus,
    StateDirectoryStatus,
    Status,
    SubsystemStatus,
    Versions,
)
from trueup.reconcile.classify import ClassifierInput, OverrideStatus, classify
from trueup.reconcile.confirm import outcome
from trueup.reconcile.engine import Engine
from trueup.reconcile.engine.commit import last_reported_transaction
from trueup.reconcile.engine.override import management_override
from trueup.reconcile.healing import MarkedPath
from trueup.reconcile.management_tier import management_facts_of
from trueup.reconcile.statuslook import Observation, observe
from trueup.reconcile.view import LoopView, StatusExtra, fought_finding_inputs
from trueup.system.fence import read_fences

__all__ = [
    "TRANSACTION_DEADLINE",
    "AgentInfo",
    "build_status",
    "drift_report",
    "gather",
    "last_reported_transaction",
    "refusals_since_last_write",
]

TRANSACTION_DEADLINE = timedelta(minutes=5)
# Writes that answer an earlier refusal: the operator's own apply or rollback.
_CLEARING_WRITES = {"apply", "rollback"}

log = logging.getLogger("trueup.status")


@dataclass(frozen=True)
class AgentInfo:
    """Status' `agent` section: the process, its startup phases and their verdicts."""

    pid: int
    started_at: str
    state_dir: str
    # The startup orchestrator's records, typed there (`PhaseJSON`, `HealedAtStart`), shown as they are.
    startup: Sequence[Mapping[str, object]] = field(default_factory=list)  # the phases, in order
    startup_drift: Sequence[Mapping[str, object]] = field(default_factory=list)
    extra: Mapping[str, Any] = field(default_factory=dict)  # what wiring adds
    config_error: str | None = None

    def to_json(self) -> dict[str, Any]:
        from trueup import __version__

        out: dict[str, Any] = {
            "running": True,
            "version": __version__,
            "pid": self.pid,
            "started_at": self.started_at,
            "state_dir": self.state_dir,
            "startup": self.startup,
            "startup_drift": self.startup_drift,
            **self.extra,
        }
        if self.config_error:
            out["config_error"] = self.config_error
        return out


def refusals_since_last_write(
    engine: Engine, limit: int = 10, *, begun: Mapping[str, str] | None = None
) -> list[JSONObject]:
    """Refused writes that no later apply or rollback has answered yet: their audit lines
    as read (a tamper-evident log's lines are checked, not trusted: read them with `.get`).

    A refusal stays after the write it lost to commits (that one began before
    it: the loser's change is still not on the device) and goes once an apply
    or rollback that began after it commits. `begun`: transaction id → begin
    time (read from the journal when not given).
    """
    if begun is None:
        begun = {t.txn: str(t.begin.get("at")) for t in engine.state.journal.transactions()}
    out: list[JSONObject] = []
    answered_until: datetime | None = None  # the latest begin of a later successful write
    for record in reversed(engine.state.audit.tail()):
        event = record.get("event")
        details = record.get("details", {})
        if event in _CLEARING_WRITES:
            started = begun.get(str(details.get("txn")))
            when = _parse_time(started) if started and started != "None" else None
            if when is None and "at" in record:
                when = _parse_time(str(record["at"]))
            if when is not None and (answered_until is None or when > answered_until):
                answered_until = when
            continue
        if event == "refused" and details.get("code") == ReasonCode.CONCURRENT_MODIFICATION.value:
            at = record.get("at")
            if answered_until is not None and at and _parse_time(str(at)) <= answered_until:
                break  # this one and every older one were answered by a later write
            out.append(dict(record))
            if len(out) >= limit:
                break
    return list(reversed(out))


def _parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def gather(engine: Engine, *, control_plane_version: int | None = None) -> JSONObject:
    """Status from the state directory and the system alone (the CLI, when no agent answers)."""
    return build_status(engine, control_plane_version=control_plane_version).to_json()


@dataclass
class _JournalFacts:
    """What the journal and the writer lock say about transactions now."""

    transactions: list[Transaction]
    open: Transaction | None
    last: Transaction | None
    last_apply: Transaction | None
    holder: dict[str, object] | None

    @classmethod
    def read(cls, engine: Engine) -> _JournalFacts:
        transactions = engine.state.journal.transactions()
        return cls(
            transactions=transactions,
            open=next((t for t in reversed(transactions) if t.is_open), None),
            last=transactions[-1] if transactions else None,
            last_apply=last_reported_transaction(transactions),
            holder=lock_holder(engine.state.root / "lock"),
        )

    @property
    def recovering(self) -> bool:
        return self.holder is not None and self.holder.get("purpose") == "recovery"

    @property
    def live(self) -> bool:
        # An open transaction is "running" only while its own writer holds the lock;
        # while recovery rolls it back it is still reported as not completed.
        return self.holder is not None and not self.recovering

    @property
    def overdue(self) -> bool:
        began = self.open.begin["at"] if self.open else None
        return bool(began and datetime.now(UTC) - _parse_time(began) > TRANSACTION_DEADLINE)


def build_status(
    engine: Engine,
    *,
    control_plane_version: int | None = None,
    loop: LoopView | None = None,
    startup_health: Mapping[str, Mapping[str, Any]] | None = None,
    forget_startup_verdict: Callable[[str], None] | None = None,
    management: Mapping[str, Any] | None = None,
    agent: AgentInfo | None = None,
    control_plane: Mapping[str, Any] | None = None,
) -> Status:
    """The status document. Every input but `engine` is optional: what is absent is left out.

    * `loop` — the reconcile loop's view: healing state per subsystem, heal
      failures, drift records, `pending_confirmation` and `reconcile_loop`;
    * `startup_health` — the startup orchestrator's verdicts per subsystem
      (pending, failed at a deadline). They show until the subsystem is seen
      healthy and in sync again, whichever pass healed it; then
      `forget_startup_verdict(name)` is called so the agent drops it;
    * `management` — the agent's management health (phase, listeners, …),
      laid over what the document and the system say;
    * `agent` — the `agent` section; `control_plane` — the sync's state.
    """
    state = engine.state
    applied = state.applied()
    journal = _JournalFacts.read(engine)
    unsupported: str | None = None
    document = None
    try:
        document = engine.applied_document()
    except DocumentError as exc:
        unsupported = f"applied revision uses a schema this agent does not support: {exc}"
    except StateFileError:
        document = None  # listed as damaged below
    damaged = [d.to_json() for d in engine.check.damaged()]
    override = _override_status(engine, document)
    observed_at = now_iso()
    seen = observe(engine, document) if document is not None else Observation()
    limitations = active_limitations(state.root)
    view = loop or LoopView()
    facts = ClassifierInput(
        applied=applied,
        open_transaction=journal.open.summary() if journal.open else None,
        open_transaction_live=journal.live,
        open_transaction_overdue=journal.overdue,
        open_transaction_recovering=journal.recovering,
        last_transaction=(
            journal.last_apply.summary()
            if journal.last_apply and not journal.last_apply.is_open
            else None
        ),
        refusals=refusals_since_last_write(
            engine, begun={t.txn: str(t.begin.get("at")) for t in journal.transactions}
        ),
        control_plane_version=control_plane_version,
        unsupported_schema=unsupported,
        differences=seen.differences,
        observed_at=observed_at,
        reconcile_failures=view.reconcile_failures,
        drift_since=view.drift_since,
        attribution=view.attribution,
        damaged=damaged,
        management_override=override,
    )
    fought = fought_finding_inputs(view.policies)
    subsystems = _subsystems(
        engine,
        document,
        applied,
        seen,
        accept_covered(seen.differences, limitations),
        damaged,
        view,
    )
    _lay_startup_verdicts(subsystems, startup_health or {}, forget_startup_verdict)
    return Status(
        device=document.metadata.device if document else None,
        observed_at=observed_at,
        versions=_versions(applied, control_plane_version),
        management=_management(document, seen, override, fought, management),
        subsystems=subsystems,
        journal=JournalStatus(
            open=journal.open.summary() if journal.open else None,
            last=journal.last.summary() if journal.last else None,
            writer=lock_holder(state.root / "lock"),
        ),
        state_directory=StateDirectoryStatus(
            path=str(state.root),
            damaged=damaged,
            writes_refused=any(d["blocks"] == "writes" for d in damaged),
        ),
        reason_codes=classify(facts) + _fought_findings(fought),
        fences=[fence.to_json() for fence in read_fences(state.root)],
        restore=restore_status(state.root),
        limitations=[limitation.to_json() for limitation in limitations],
        **(loop.status_extra() if loop is not None else _confirmation_from_state(engine)),
        **_optional_sections(seen, agent, damaged, control_plane),
    )


def _versions(applied: Applied, control_plane_version: int | None) -> Versions:
    return Versions(
        applied=applied.version,
        control_plane=control_plane_version,
        outcome=applied.outcome,
        applied_at=applied.applied_at,
        applied_digest=applied.digest,
        origin=applied.origin,
        control_plane_applied=applied.cp_version,
        override=applied.override,
    )


def _management(
    document: DeviceState | None,
    seen: Observation,
    override: OverrideStatus | None,
    fought: dict[str, MarkedPath],
    agent_view: Mapping[str, Any] | None,
) -> ManagementStatus:
    """Management from the document and the system; the agent's view (phase, listeners) laid
    over it, the document's addresses kept."""
    diffs = seen.differences.get("management", [])
    missing = [v for d in diffs if d.path.endswith(".addresses") for v in d.missing]
    state_bad = any(d.path.endswith(".state") for d in diffs)
    section = ManagementStatus(
        ready=document is not None and not missing and not state_bad,
        interface=document.spec.management.interface if document else None,
        addresses=document.spec.management.addresses if document else [],
        missing_addresses=missing,
        override=override,
        # Another writer keeps changing management (path → writer, flips, since):
        # trueup keeps restoring it; find and stop that writer.
        fought=fought,
    )
    if agent_view is None:
        return section
    return _overlay(section, {k: v for k, v in agent_view.items() if k != "addresses"})


_Model = TypeVar("_Model", bound=BaseModel)


def _overlay(model: _Model, update: Mapping[str, Any]) -> _Model:
    """`model` with `update`'s keys laid over it (validated; keys it never set stay unset)."""
    if not update:
        return model
    return type(model).model_validate({**model.model_dump(exclude_unset=True), **update})


def _subsystems(
    engine: Engine,
    document: DeviceState | None,
    applied: Applied,
    seen: Observation,
    accepted: Mapping[str, list[JSONObject]],
    damaged: list[DamageRecord],
    view: LoopView,
) -> dict[str, SubsystemStatus]:
    """Each subsystem's health and why, from the most telling fact down."""
    failed = dict(applied.failed) if applied.outcome == "partial" else {}
    # Failing before the applied revision and left out of its transaction: still failing.
    failed.update(applied.carried)
    # Failed its last convergence, its heal since deferred (an operator's write took
    # the writer): still failing, never shown as merely waiting.
    for name, error in engine.failing.items():
        failed.setdefault(name, error)
    out: dict[str, SubsystemStatus] = {}
    for sub in engine.subsystems:
        diffs = seen.differences.get(sub.name, [])
        health, reason = SubsystemHealth.OK, ""
        if document is None:
            health, reason = SubsystemHealth.PENDING, "nothing applied yet"
            unreadable = [d for d in damaged if d["blocks"] == "writes"]
            if unreadable:
                reason = f"what is applied cannot be read: {unreadable[0]['path']}"
        elif sub.name in seen.unobservable:
            health, reason = SubsystemHealth.FAILED, seen.unobservable[sub.name]
        elif sub.name in failed:
            health, reason = SubsystemHealth.FAILED, failed[sub.name]
        elif view.reconcile_failures.get(sub.name):
            health = SubsystemHealth.FAILED
            reason = str(view.reconcile_failures[sub.name].get("detail"))
        elif diffs:
            health, reason = SubsystemHealth.DEGRADED, f"{len(diffs)} path(s) differ"
        if sub.name in seen.conditions and health != SubsystemHealth.FAILED:
            # A fence outranks drift: what matters first is that it must not act.
            health, reason = seen.conditions[sub.name]
            if diffs:
                reason += f"; {len(diffs)} path(s) differ"
        entry = SubsystemStatus(
            tier=sub.tier.value,
            health=health,
            reason=reason,
            differences=[d.to_json() for d in diffs],
            accepted=accepted.get(sub.name, []),
            policy=document.spec.convergence.policy_for(sub.name) if document else None,
        )
        # The loop's healing state: breaker, acknowledgement, drift, why it waits.
        entry = _overlay(entry, view.policies.get(sub.name, {}))
        waiting = (entry.model_extra or {}).get("waiting")
        if entry.health == SubsystemHealth.DEGRADED and waiting:
            # Waiting on something that does not exist yet (a late link): not failing.
            entry.health, entry.reason = SubsystemHealth.PENDING, waiting
        if sub.name in seen.stale:
            entry.stale = dict(seen.stale[sub.name])
        if seen.reports.get(sub.name):
            entry.system = seen.reports[sub.name]
        out[sub.name] = entry
    return out


def _optional_sections(
    seen: Observation,
    agent: AgentInfo | None,
    damaged: list[DamageRecord],
    control_plane: Mapping[str, Any] | None,
) -> _OptionalSections:
    """The status keys present only sometimes: stale looks, the agent's (and the loop's,
    `LoopView.status_extra`, or without a loop `_confirmation_from_state`)."""
    out: _OptionalSections = {}
    if seen.stale:
        # Subsystems whose daemon did not answer in time: shown from their last look.
        out["stale"] = sorted(seen.stale)
    if agent is not None:
        out["agent"] = {**agent.to_json(), "damaged_state": damaged}
    if control_plane is not None:
        out["control_plane"] = dict(control_plane)
    return out


class _OptionalSections(TypedDict, total=False):
    """The status keys present only sometimes (`Status` defines their shape on the wire)."""

    stale: list[str]
    agent: JSONObject  # the agent's section as its process shows it (`AgentInfo.to_json`)
    control_plane: JSONObject  # the sync's state, as the agent's sync reports it


def _confirmation_from_state(engine: Engine) -> StatusExtra:
    """No loop (the CLI without an agent): the pending record as the state directory holds it."""
    state = engine.state
    pending = read_pending(state)
    if pending is not None and pending.get("state") == "pending":
        return {
            "pending_confirmation": {
                "version": pending.get("version"),
                "deadline": pending.get("deadline_at"),
                "rollback_to": pending.get("confirmed_version"),
            },
            "confirmation": outcome(
                pending,
                ConfirmState.PENDING,
                str(pending.get("waiting_for") or "a running agent to confirm or roll it back"),
            ),
        }
    outcome_now = read_outcome(state)
    return {"confirmation": outcome_now} if outcome_now is not None else {}


# Not the drift action: management cannot be acknowledged and needs no reconcile.
FOUGHT_ACTION = (
    "trueup keeps restoring the management address and route whatever the writer does "
    "(management is never acknowledged or contested). Find the writer named in the "
    "detail and stop it; to change management itself, apply a document or use "
    "`trueup management set`."
)


def _fought_findings(fought: Mapping[str, MarkedPath]) -> list[Finding]:
    """A loud `STATE_DRIFT_DETECTED` while another writer keeps changing management."""
    if not fought:
        return []
    writers = sorted({str(r.get("writer")) for r in fought.values() if r.get("writer")})
    flips = sum(int(r.get("flips", 0)) for r in fought.values())
    return [
        Finding(
            code=ReasonCode.DRIFT_DETECTED,
            action=FOUGHT_ACTION,
            subsystem="management",
            paths=natural_sorted(fought),
            since=min(str(r.get("since")) for r in fought.values()),
            detail=(
                f"another writer keeps changing the management tier ({flips} times; "
                + (", ".join(writers) if writers else "writer unidentified")
                + "): trueup keeps restoring it; find and stop that writer"
            ),
            evidence={"fought": {p: dict(r) for p, r in fought.items()}},
        )
    ]


def _override_status(engine: Engine, document: DeviceState | None) -> OverrideStatus | None:
    """The console management override, whether it is in effect, and what it stands against."""
    record = management_override(engine.state)
    if record is None:
        return None
    out: OverrideStatus = {
        "interface": record.facts.interface,
        "addresses": list(record.facts.addresses),
        "gateway": record.facts.gateway,
        "set_at": record.set_at,
        "actor": record.actor,
        "reason": record.reason,
        "writer_lock": record.writer_lock,
        "file": str(engine.state.root / OVERRIDE_FILE),
        "in_effect": True,
    }
    try:
        revision = engine.applied_revision()
    except (DocumentError, StateFileError):
        revision = None
    if revision is not None:
        out["revision"] = management_facts_of(revision)
    if document is not None and not same_facts(
        record.facts, ManagementFacts.from_json(management_facts_of(document))
    ):
        out["in_effect"] = False
        out["problem"] = (
            "it conflicts with the applied revision (see the agent log); the revision's "
            "management facts are enforced"
        )
    return out


def _lay_startup_verdicts(
    subsystems: dict[str, SubsystemStatus],
    verdicts: Mapping[str, Mapping[str, Any]],
    forget: Callable[[str], None] | None,
) -> None:
    """Lay startup's verdicts over the subsystems; forget those a later pass made moot."""
    for name, verdict in dict(verdicts).items():
        entry = subsystems.get(name)
        if entry is None:
            continue
        # Failed at a deadline, or waiting on a late link: moot once seen ok and in sync
        # (a pending preparation is not: it shows until the start is done with it).
        settles = verdict.get("health") == "failed" or verdict.get("until_in_sync")
        if settles and entry.health == SubsystemHealth.OK and not entry.differences:
            if forget is not None:
                forget(name)
            continue
        subsystems[name] = _overlay(
            entry, {k: v for k, v in verdict.items() if k != "until_in_sync"}
        )


def drift_report(body: Mapping[str, Any]) -> JSONObject:
    """`/v1/drift` from a status document (`Status.to_json()`, from an agent or `gather`)."""
    status = Status.read(body)
    subsystems = status.subsystems
    differences = [d for sub in subsystems.values() for d in sub.differences]
    # A refused write, or a crash recovery that converged everything back, leaves the
    # system in sync with the applied version: status reports them, drift does not.
    drift = [
        f
        for f in status.reason_codes
        if f.code != ReasonCode.CONCURRENT_MODIFICATION and not f.evidence.get("recovery_complete")
    ]
    extras = {name: sub.model_extra or {} for name, sub in subsystems.items()}
    return DriftBody(
        in_sync=not differences and not drift,
        observed_at=status.observed_at,
        applied_version=status.versions.applied,
        differences=differences,
        reason_codes=drift,
        # Per subsystem, the drift going on (with who changed what) and the last one that
        # ended, healed or not: what happened stays visible after the heal.
        drift={n: extra["drift"] for n, extra in extras.items() if extra.get("drift")},
        last_drift={
            n: extra["last_drift"] for n, extra in extras.items() if extra.get("last_drift")
        },
    ).to_json()
