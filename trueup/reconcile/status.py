"""Gather facts from the state directory and the kernel into status and drift reports.

Who calls this: the agent API (`/v1/status`, `/v1/drift`) and the CLI when no
agent runs. The reason codes come from `classify()`; this module only
collects its inputs.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from trueup.journal.audit import now_iso
from trueup.journal.lock import lock_holder
from trueup.model.document import DocumentError
from trueup.model.health import SubsystemHealth
from trueup.model.reasons import ReasonCode
from trueup.reconcile.classify import ClassifierInput, classify
from trueup.reconcile.transaction import Engine
from trueup.subsystems.base import Difference

__all__ = ["TRANSACTION_DEADLINE", "drift_report", "gather", "refusals_since_last_write"]

TRANSACTION_DEADLINE = timedelta(minutes=5)
REFUSAL_WINDOW = timedelta(minutes=10)
_WRITE_EVENTS = {"apply", "rollback", "recovered", "reconcile"}


def refusals_since_last_write(engine: Engine, limit: int = 10) -> list[dict[str, Any]]:
    """Refused writes since the last write, and any in the last REFUSAL_WINDOW.

    A refusal stays visible for a while after the winning write commits: the
    loser's change is still not on the device, and the operator needs to know.
    """
    out: list[dict[str, Any]] = []
    cutoff = datetime.now(UTC) - REFUSAL_WINDOW
    passed_write = False
    for record in reversed(engine.state.audit.tail()):
        event = record.get("event")
        if event in _WRITE_EVENTS:
            passed_write = True
        if passed_write and "at" in record and _parse_time(str(record["at"])) < cutoff:
            break
        if event == "refused" and record.get("details", {}).get("code") == (
            ReasonCode.CONCURRENT_MODIFICATION.value
        ):
            out.append(record)
            if len(out) >= limit:
                break
    return list(reversed(out))


def _parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def gather(
    engine: Engine,
    *,
    extra: dict[str, Any] | None = None,
    control_plane_version: int | None = None,
    reconcile_failures: dict[str, dict[str, Any]] | None = None,
    drift_since: dict[str, str] | None = None,
    attribution: dict[str, list[dict[str, Any]]] | None = None,
    policies: dict[str, dict[str, Any]] | None = None,
    subsystem_health: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    state = engine.state
    applied = state.applied()
    journal = state.journal
    transactions = journal.transactions()
    open_txn = next((t for t in reversed(transactions) if t.is_open), None)
    last = transactions[-1] if transactions else None
    # Reconcile passes converge to the applied version; they do not clear what
    # the last apply (or its crash recovery) left to report.
    last_apply = next((t for t in reversed(transactions) if t.kind != "reconcile"), None)
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
    try:
        document = engine.applied_document()
    except DocumentError as exc:
        unsupported = f"applied revision uses a schema this agent does not support: {exc}"
    observed_at = now_iso()
    if document is not None:
        with engine.netlink() as net:
            differences = engine.differences(document, net)
    facts = ClassifierInput(
        applied=applied,
        open_transaction=open_txn.summary() if open_txn else None,
        open_transaction_live=live,
        open_transaction_overdue=overdue,
        last_transaction=last_apply.summary() if last_apply and not last_apply.is_open else None,
        refusals=refusals_since_last_write(engine),
        control_plane_version=control_plane_version,
        unsupported_schema=unsupported,
        differences=differences,
        observed_at=observed_at,
        reconcile_failures=reconcile_failures or {},
        drift_since=drift_since or {},
        attribution=attribution or {},
    )
    findings = classify(facts)
    management_diffs = differences.get("management", [])
    missing_mgmt = [v for d in management_diffs if d.path.endswith(".addresses") for v in d.missing]
    mgmt_state_bad = any(d.path.endswith(".state") for d in management_diffs)
    subsystems: dict[str, Any] = {}
    failed = dict(applied.get("failed", {})) if applied.get("outcome") == "partial" else {}
    for sub in engine.subsystems:
        diffs = differences.get(sub.name, [])
        health = SubsystemHealth.OK
        reason = ""
        if document is None:
            health, reason = SubsystemHealth.PENDING, "nothing applied yet"
        elif sub.name in failed:
            health, reason = SubsystemHealth.FAILED, failed[sub.name]
        elif (reconcile_failures or {}).get(sub.name):
            health = SubsystemHealth.FAILED
            reason = str((reconcile_failures or {})[sub.name].get("detail"))
        elif diffs:
            health, reason = SubsystemHealth.DEGRADED, f"{len(diffs)} path(s) differ"
        entry: dict[str, Any] = {
            "tier": sub.tier.value,
            "health": health.value,
            "reason": reason,
            "differences": [d.to_json() for d in diffs],
            "policy": document.spec.convergence.policy_for(sub.name) if document else None,
        }
        entry.update((policies or {}).get(sub.name, {}))
        entry.update((subsystem_health or {}).get(sub.name, {}))
        subsystems[sub.name] = entry
    management = {
        "ready": document is not None and not missing_mgmt and not mgmt_state_bad,
        "interface": document.spec.management.interface if document else None,
        "addresses": document.spec.management.addresses if document else [],
        "missing_addresses": missing_mgmt,
    }
    status: dict[str, Any] = {
        "device": document.metadata.device if document else None,
        "observed_at": observed_at,
        "versions": {
            "applied": int(applied.get("version", 0)),
            "control_plane": control_plane_version,
            "outcome": applied.get("outcome"),
            "applied_at": applied.get("applied_at"),
            "applied_digest": applied.get("digest"),
            "origin": applied.get("origin"),
            "control_plane_applied": applied.get("cp_version"),
            "override": applied.get("override"),
        },
        "management": management,
        "subsystems": subsystems,
        "journal": {
            "open": open_txn.summary() if open_txn else None,
            "last": last.summary() if last else None,
            "writer": lock_holder(state.root / "lock"),
        },
        "fences": state.read("fences.json", []),
        "reason_codes": [f.model_dump(mode="json") for f in findings],
    }
    if extra:
        status.update(extra)
    return status


def drift_report(status: dict[str, Any]) -> dict[str, Any]:
    differences = [d for sub in status["subsystems"].values() for d in sub.get("differences", [])]
    drift = [f for f in status["reason_codes"] if f["code"] != ReasonCode.CONCURRENT_MODIFICATION]
    return {
        "in_sync": not differences and not drift,
        "observed_at": status["observed_at"],
        "applied_version": status["versions"]["applied"],
        "differences": differences,
        "reason_codes": drift,
    }
