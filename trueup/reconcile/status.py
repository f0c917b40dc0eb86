"""The status document, built in one place; the drift report derived from it.

Who calls this: the agent (`Agent.status()` behind `/v1/status`, `/v1/drift`,
`/metrics`, the control-plane report) and the CLI when no agent answers
(`gather`). Both go through `build_status`, so the document's shape is
defined here only:

```
device, observed_at, versions{…}, management{…}, subsystems{NAME: {…, system{…}}},
journal{open, last, writer}, state_directory{path, damaged[…], writes_refused},
reason_codes[…],
confirmation{version, state, deadline, reason}  (the last guarded apply, when there was one)
pending_confirmation, reconcile_loop        (while the reconcile loop runs)
agent{…}                                    (from an agent)
control_plane{…}                            (when a control plane manages the device)
```

Facts come from the state directory and the system; the reason codes from
`classify()`; the loop's healing state from its view
(`trueup.reconcile.view.LoopView`); the rest from the agent's typed inputs.

Why this module is over 400 lines: the document's shape is defined in this
one place on purpose (agent, CLI without an agent, the control-plane report
and evidence all read it), and each section — accepted differences under a
known limitation, pending confirmations, refused writes — is built next to
the others so that none can drift from the shape above.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from trueup.journal.atomic import StateFileError
from trueup.journal.audit import now_iso
from trueup.journal.confirm import read_outcome, read_pending
from trueup.journal.limitations import accept_covered, active_limitations
from trueup.journal.lock import lock_holder
from trueup.journal.override import OVERRIDE_FILE, same_facts
from trueup.journal.restore import restore_status
from trueup.model.document import DeviceState, DocumentError, document_digest
from trueup.model.health import SubsystemHealth
from trueup.model.order import natural_sorted
from trueup.model.reasons import Finding, ReasonCode
from trueup.reconcile.classify import ClassifierInput, classify
from trueup.reconcile.committing import last_reported_transaction
from trueup.reconcile.confirm import outcome
from trueup.reconcile.management_tier import management_facts_of
from trueup.reconcile.transaction import Engine
from trueup.reconcile.view import LoopView, fought_finding_inputs
from trueup.subsystems.base import Difference, Subsystem
from trueup.subsystems.registry import scope_for
from trueup.system.fence import read_fences
from trueup.system.sources import Sources

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
    startup: list[dict[str, Any]] = field(default_factory=list)  # the phases, in order
    startup_drift: list[dict[str, Any]] = field(default_factory=list)
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
) -> list[dict[str, Any]]:
    """Refused writes that no later apply or rollback has answered yet.

    A refusal stays after the write it lost to commits (that one began before
    it: the loser's change is still not on the device) and goes once an apply
    or rollback that began after it commits. `begun`: transaction id → begin
    time (read from the journal when not given).
    """
    if begun is None:
        begun = {t.txn: str(t.begin.get("at")) for t in engine.state.journal.transactions()}
    out: list[dict[str, Any]] = []
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
            out.append(record)
            if len(out) >= limit:
                break
    return list(reversed(out))


def _parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def gather(engine: Engine, *, control_plane_version: int | None = None) -> dict[str, Any]:
    """Status from the state directory and the system alone (the CLI, when no agent answers)."""
    return build_status(engine, control_plane_version=control_plane_version)


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
) -> dict[str, Any]:
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
    journal = state.journal
    transactions = journal.transactions()
    open_txn = next((t for t in reversed(transactions) if t.is_open), None)
    last = transactions[-1] if transactions else None
    last_apply = last_reported_transaction(transactions)
    holder = lock_holder(state.root / "lock")
    # An open transaction is "running" only while its own writer holds the lock;
    # while recovery rolls it back it is still reported as not completed.
    live = holder is not None and holder.get("purpose") != "recovery"
    overdue = bool(
        open_txn and datetime.now(UTC) - _parse_time(open_txn.begin["at"]) > TRANSACTION_DEADLINE
    )
    unsupported: str | None = None
    document = None
    differences: dict[str, list[Difference]] = {}
    unobservable: dict[str, str] = {}  # subsystem → why it cannot be observed now
    try:
        document = engine.applied_document()
    except DocumentError as exc:
        unsupported = f"applied revision uses a schema this agent does not support: {exc}"
    except StateFileError:
        document = None  # listed as damaged below
    damaged = [d.to_json() for d in engine.check.damaged()]
    override = _override_status(engine, document)
    observed_at = now_iso()
    reports: dict[str, dict[str, Any]] = {}
    conditions: dict[str, tuple[SubsystemHealth, str]] = {}
    stale: dict[str, dict[str, Any]] = {}
    if document is not None:
        differences, reports, conditions, stale = _observe(engine, document, unobservable)
    limitations = active_limitations(state.root)
    accepted = accept_covered(differences, limitations)
    fences = [fence.to_json() for fence in read_fences(state.root)]
    view = loop or LoopView()
    facts = ClassifierInput(
        applied=applied,
        open_transaction=open_txn.summary() if open_txn else None,
        open_transaction_live=live,
        open_transaction_overdue=overdue,
        open_transaction_recovering=holder is not None and holder.get("purpose") == "recovery",
        last_transaction=last_apply.summary() if last_apply and not last_apply.is_open else None,
        refusals=refusals_since_last_write(
            engine, begun={t.txn: str(t.begin.get("at")) for t in transactions}
        ),
        control_plane_version=control_plane_version,
        unsupported_schema=unsupported,
        differences=differences,
        observed_at=observed_at,
        reconcile_failures=view.reconcile_failures,
        drift_since=view.drift_since,
        attribution=view.attribution,
        damaged=damaged,
        management_override=override,
    )
    findings = classify(facts)
    fought = fought_finding_inputs(view.policies)
    findings += _fought_findings(fought)
    management_diffs = differences.get("management", [])
    missing_mgmt = [v for d in management_diffs if d.path.endswith(".addresses") for v in d.missing]
    mgmt_state_bad = any(d.path.endswith(".state") for d in management_diffs)
    subsystems: dict[str, Any] = {}
    failed = dict(applied.failed) if applied.outcome == "partial" else {}
    # Failing before the applied revision and left out of its transaction: still failing.
    failed.update(applied.carried)
    # Failed its last convergence, its heal since deferred (an operator's write took
    # the writer): still failing, never shown as merely waiting.
    for name, error in (getattr(engine, "failing", None) or {}).items():
        failed.setdefault(name, error)
    for sub in engine.subsystems:
        diffs = differences.get(sub.name, [])
        health = SubsystemHealth.OK
        reason = ""
        if document is None:
            health, reason = SubsystemHealth.PENDING, "nothing applied yet"
            unreadable = [d for d in damaged if d["blocks"] == "writes"]
            if unreadable:
                reason = f"what is applied cannot be read: {unreadable[0]['path']}"
        elif sub.name in unobservable:
            health, reason = SubsystemHealth.FAILED, unobservable[sub.name]
        elif sub.name in failed:
            health, reason = SubsystemHealth.FAILED, failed[sub.name]
        elif view.reconcile_failures.get(sub.name):
            health = SubsystemHealth.FAILED
            reason = str(view.reconcile_failures[sub.name].get("detail"))
        elif diffs:
            health, reason = SubsystemHealth.DEGRADED, f"{len(diffs)} path(s) differ"
        if sub.name in conditions and health != SubsystemHealth.FAILED:
            # A fence outranks drift: what matters first is that it must not act.
            health, reason = conditions[sub.name]
            if diffs:
                reason += f"; {len(diffs)} path(s) differ"
        entry: dict[str, Any] = {
            "tier": sub.tier.value,
            "health": health.value,
            "reason": reason,
            "differences": [d.to_json() for d in diffs],
            "accepted": accepted.get(sub.name, []),
            "policy": document.spec.convergence.policy_for(sub.name) if document else None,
        }
        entry.update(view.policies.get(sub.name, {}))
        if health == SubsystemHealth.DEGRADED and entry.get("waiting"):
            # Waiting on something that does not exist yet (a late link): not failing.
            entry["health"], entry["reason"] = SubsystemHealth.PENDING.value, entry["waiting"]
        if sub.name in stale:
            entry["stale"] = stale[sub.name]
        if reports.get(sub.name):
            entry["system"] = reports[sub.name]
        subsystems[sub.name] = entry
    _lay_startup_verdicts(subsystems, startup_health or {}, forget_startup_verdict)
    management_section: dict[str, Any] = {
        "ready": document is not None and not missing_mgmt and not mgmt_state_bad,
        "interface": document.spec.management.interface if document else None,
        "addresses": document.spec.management.addresses if document else [],
        "missing_addresses": missing_mgmt,
        "override": override,
        # Another writer keeps changing management (path → writer, flips, since):
        # trueup keeps restoring it; find and stop that writer.
        "fought": fought,
    }
    if management is not None:
        # The agent knows more (phase, listeners); the document's addresses stay.
        management_section.update({k: v for k, v in management.items() if k != "addresses"})
    status: dict[str, Any] = {
        "device": document.metadata.device if document else None,
        "observed_at": observed_at,
        "versions": {
            "applied": applied.version,
            "control_plane": control_plane_version,
            "outcome": applied.outcome,
            "applied_at": applied.applied_at,
            "applied_digest": applied.digest,
            "origin": applied.origin,
            "control_plane_applied": applied.cp_version,
            "override": applied.override.to_json() if applied.override else None,
        },
        "management": management_section,
        "subsystems": subsystems,
        "journal": {
            "open": open_txn.summary() if open_txn else None,
            "last": last.summary() if last else None,
            "writer": lock_holder(state.root / "lock"),
        },
        "state_directory": {
            "path": str(state.root),
            "damaged": damaged,
            "writes_refused": any(d["blocks"] == "writes" for d in damaged),
        },
        "reason_codes": [f.model_dump(mode="json") for f in findings],
        "fences": fences,
        "restore": restore_status(state.root),
        "limitations": limitations,
    }
    if stale:
        # Subsystems whose daemon did not answer in time: shown from their last look.
        status["stale"] = sorted(stale)
    if loop is not None:
        status.update(loop.status_extra())
    else:
        # No loop (the CLI without an agent): the pending record as the state directory holds it.
        pending = read_pending(state)
        if pending is not None and pending.get("state") == "pending":
            status["pending_confirmation"] = {
                "version": pending.get("version"),
                "deadline": pending.get("deadline_at"),
                "rollback_to": pending.get("confirmed_version"),
            }
            status["confirmation"] = outcome(
                pending,
                "pending",
                str(pending.get("waiting_for") or "a running agent to confirm or roll it back"),
            )
        else:
            outcome_now = read_outcome(state)
            if outcome_now is not None:
                status["confirmation"] = outcome_now
    if agent is not None:
        status["agent"] = agent.to_json()
        status["agent"]["damaged_state"] = damaged
    if control_plane is not None:
        status["control_plane"] = dict(control_plane)
    return status


# Not the drift action: management cannot be acknowledged and needs no reconcile.
FOUGHT_ACTION = (
    "trueup keeps restoring the management address and route whatever the writer does "
    "(management is never acknowledged or contested). Find the writer named in the "
    "detail and stop it; to change management itself, apply a document or use "
    "`trueup management set`."
)


def _fought_findings(fought: Mapping[str, Mapping[str, Any]]) -> list[Finding]:
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


def _observe(
    engine: Engine, document: DeviceState, unobservable: dict[str, str]
) -> tuple[
    dict[str, list[Difference]],
    dict[str, dict[str, Any]],
    dict[str, tuple[SubsystemHealth, str]],
    dict[str, dict[str, Any]],
]:
    """Differences, reports, conditions and stale marks; never waiting long on a daemon.

    Netlink subsystems are read inline; those that may block are looked at
    through the engine's status probes (`trueup.reconcile.probes`), bounded.
    """
    scope = scope_for(document)
    inline = [s for s in engine.subsystems if not s.may_block]
    probed = [s for s in engine.subsystems if s.may_block]
    differences: dict[str, list[Difference]] = {}
    stale: dict[str, dict[str, Any]] = {}
    with engine.sources() as net:
        observed = engine.observe(net, scope, [s.name for s in inline], errors=unobservable)
        reports = _reports(engine, document, net, inline)
        conditions = _conditions(engine, net, document, inline)
    for sub in inline:
        if sub.name in observed:
            differences[sub.name] = sub.diff(sub.desired(document, scope), observed[sub.name])
    key = (document_digest(document), json.dumps(scope.to_json(), sort_keys=True, default=str))
    for name, served in engine.status_probes.look(probed, document, scope, key).items():
        sub = engine.by_name[name]
        if served.stale is not None:
            stale[name] = served.stale
        look = served.look
        if look is None:
            unobservable[name] = f"cannot observe {name}: {served.stale and served.stale['why']}"
            continue
        if look.facts is None:
            unobservable[name] = look.error or f"cannot observe {name}"
        else:
            differences[name] = sub.diff(sub.desired(document, scope), look.facts)
        if look.report:
            reports[name] = look.report
        if look.condition is not None:
            conditions[name] = look.condition
    return differences, reports, conditions, stale


def _reports(
    engine: Engine, document: DeviceState, net: Sources, subs: Sequence[Subsystem] | None = None
) -> dict[str, dict[str, Any]]:
    """What configured subsystems report beside their facts (`Subsystem.report`)."""
    scope = scope_for(document)
    out: dict[str, dict[str, Any]] = {}
    for sub in engine.subsystems if subs is None else subs:
        if not sub.configured(document):
            continue
        try:
            out[sub.name] = sub.report(net, scope)
        except Exception as exc:  # a report never breaks status
            out[sub.name] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def _conditions(
    engine: Engine, net: Sources, document: DeviceState, subs: Sequence[Subsystem] | None = None
) -> dict[str, tuple[SubsystemHealth, str]]:
    """Each subsystem's health beyond its facts (fenced, pending); one failing is left out."""
    out: dict[str, tuple[SubsystemHealth, str]] = {}
    for sub in engine.subsystems if subs is None else subs:
        try:
            condition = sub.condition(net, document)
        except Exception:  # status never fails because one subsystem cannot say
            log.exception("%s: condition", sub.name)
            continue
        if condition is not None:
            out[sub.name] = condition
    return out


def _override_status(engine: Engine, document: DeviceState | None) -> dict[str, Any] | None:
    """The console management override, whether it is in effect, and what it stands against."""
    record = engine.management_override()
    if record is None:
        return None
    out = {
        k: record.get(k)
        for k in ("interface", "addresses", "gateway", "set_at", "actor", "reason", "writer_lock")
    }
    out["file"] = str(engine.state.root / OVERRIDE_FILE)
    out["in_effect"] = True
    try:
        revision = engine.applied_revision()
    except (DocumentError, StateFileError):
        revision = None
    if revision is not None:
        out["revision"] = management_facts_of(revision)
    if document is not None and not same_facts(record, management_facts_of(document)):
        out["in_effect"] = False
        out["problem"] = (
            "it conflicts with the applied revision (see the agent log); the revision's "
            "management facts are enforced"
        )
    return out


def _lay_startup_verdicts(
    subsystems: dict[str, Any],
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
        if settles and entry["health"] == "ok" and not entry["differences"]:
            if forget is not None:
                forget(name)
            continue
        entry.update({k: v for k, v in verdict.items() if k != "until_in_sync"})


def drift_report(status: dict[str, Any]) -> dict[str, Any]:
    differences = [d for sub in status["subsystems"].values() for d in sub.get("differences", [])]
    # A refused write, or a crash recovery that converged everything back, leaves the
    # system in sync with the applied version: status reports them, drift does not.
    drift = [
        f
        for f in status["reason_codes"]
        if f["code"] != ReasonCode.CONCURRENT_MODIFICATION
        and not f.get("evidence", {}).get("recovery_complete")
    ]
    subsystems = status["subsystems"]
    return {
        "in_sync": not differences and not drift,
        "observed_at": status["observed_at"],
        "applied_version": status["versions"]["applied"],
        "differences": differences,
        "reason_codes": drift,
        # Per subsystem, the drift going on (with who changed what) and the last one that
        # ended, healed or not: what happened stays visible after the heal.
        "drift": {n: sub["drift"] for n, sub in subsystems.items() if sub.get("drift")},
        "last_drift": {
            n: sub["last_drift"] for n, sub in subsystems.items() if sub.get("last_drift")
        },
    }
