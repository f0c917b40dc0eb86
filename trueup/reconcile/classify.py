"""Derive the six reason codes from facts — never from guesses.

`classify()` is pure: it takes what the journal, the applied record, the
version sources, the differences and the reconcile history say, and returns
findings. The mapping:

* open transaction past its deadline, or not held by a live writer, or the
  last transaction (an interrupted heal included) was closed by crash
  recovery                                       → STATE_APPLY_NOT_COMPLETED
* last committed transaction had failed subsystems → STATE_PARTIAL_UPDATE
* writes refused since the last commit                   → STATE_CONCURRENT_MODIFICATION
* reconcile errors / breaker open                       → STATE_RECONCILIATION_FAILED
* desired or control-plane version ≠ applied version, or
  an unsupported schema                                 → STATE_VERSION_SKEW
* differences with no transaction open (and not explained by a partial
  update or a running transaction)                      → STATE_DRIFT_DETECTED
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict

from trueup.model.jsontypes import JSONObject
from trueup.model.reasons import Finding, ReasonCode
from trueup.model.records import Applied, DamageRecord, TransactionSummary
from trueup.reconcile.driftbook import Attribution
from trueup.reconcile.view import FailureEntry
from trueup.subsystems.base import Difference

__all__ = ["ClassifierInput", "OverrideStatus", "classify"]


class OverrideStatus(TypedDict):
    """Status' `management.override`: the console override, and whether it is in effect."""

    interface: str
    addresses: list[str]
    gateway: str | None
    set_at: str | None
    actor: str | None
    reason: str | None
    writer_lock: str | None
    file: str
    in_effect: bool
    # The applied revision's management facts (interface, addresses, gateway), when readable.
    revision: NotRequired[JSONObject]
    problem: NotRequired[str]  # why it is not in effect


@dataclass
class ClassifierInput:
    applied: Applied
    open_transaction: TransactionSummary | None = None
    open_transaction_live: bool = False
    open_transaction_overdue: bool = False
    open_transaction_recovering: bool = False  # recovery holds the writer lock right now
    last_transaction: TransactionSummary | None = None
    last_commit_at: str | None = None
    refusals: list[JSONObject] = field(default_factory=list)  # audit lines as read
    desired_version: int | None = None
    control_plane_version: int | None = None
    unsupported_schema: str | None = None
    differences: dict[str, list[Difference]] = field(default_factory=dict)
    observed_at: str | None = None
    reconcile_failures: dict[str, FailureEntry] = field(default_factory=dict)
    drift_since: dict[str, str] = field(default_factory=dict)
    attribution: dict[str, list[Attribution]] = field(default_factory=dict)
    # Damaged state files (`trueup.journal.damage.Damage.to_json()`), and a console
    # management override with the applied revision's management facts beside it.
    damaged: list[DamageRecord] = field(default_factory=list)
    management_override: OverrideStatus | None = None


def classify(facts: ClassifierInput) -> list[Finding]:
    findings = _transaction_findings(facts)
    partial = _partial_findings(facts)
    findings += partial
    findings += _refusal_findings(facts.refusals)
    findings += _failure_findings(facts.reconcile_failures)
    if facts.unsupported_schema:
        findings.append(Finding.of(ReasonCode.VERSION_SKEW, detail=facts.unsupported_schema))
    findings += _damage_findings(facts.damaged)
    if facts.management_override is not None:
        findings.append(_override_finding(facts.management_override, facts.applied.version))
    findings += _skew_findings(facts)
    findings += _drift_findings(facts, explained={f.subsystem for f in partial if f.subsystem})
    return findings


def _transaction_findings(facts: ClassifierInput) -> list[Finding]:
    """An open transaction not completed; the last one closed by crash recovery."""
    findings: list[Finding] = []
    applied_version = facts.applied.version
    open_txn = facts.open_transaction
    if open_txn is not None and (not facts.open_transaction_live or facts.open_transaction_overdue):
        detail, action = _not_completed(open_txn, facts, applied_version)
        findings.append(
            Finding(
                code=ReasonCode.APPLY_NOT_COMPLETED,
                subsystem=",".join(open_txn.get("applied", []) + list(open_txn.get("failed", {})))
                or None,
                since=open_txn.get("began_at"),
                detail=detail,
                action=action,
                evidence={"transaction": open_txn, "recovery": "not run yet"},
            )
        )
    last = facts.last_transaction
    if last is not None and last.get("recovered") and open_txn is None:
        errors = [
            e
            for r in last.get("history", [])
            if r.get("type") == "rolled_back"
            for e in r.get("errors", [])
        ]
        if last.get("kind") == "reconcile":
            what = (
                f"heal {last['txn']} (towards version {last.get('version')}) was interrupted; "
                f"recovery converged the system to version {applied_version}"
            )
        else:
            what = (
                f"transaction {last['txn']} (version {last.get('version')}) was interrupted "
                "and rolled back at recovery; the system holds "
                f"version {applied_version}"
            )
        findings.append(
            Finding.of(
                ReasonCode.APPLY_NOT_COMPLETED,
                subsystem=",".join(last.get("applied", [])) or None,
                since=last.get("began_at"),
                detail=what
                + (f"; the rollback was incomplete: {'; '.join(errors)}" if errors else ""),
                # Complete: every subsystem was converged back (drift does not count it).
                evidence={"transaction": last, "recovery_complete": not errors},
            )
        )
    return findings


def _partial_findings(facts: ClassifierInput) -> list[Finding]:
    """One `STATE_PARTIAL_UPDATE` per subsystem the last transaction committed without."""
    applied = facts.applied
    if applied.outcome != "partial":
        return []
    return [
        Finding.of(
            ReasonCode.PARTIAL_UPDATE,
            subsystem=name,
            paths=[d.path for d in facts.differences.get(name, [])],
            since=applied.applied_at,
            detail=f"version {applied.version} applied without {name}: {error}",
        )
        for name, error in sorted(applied.failed.items())
    ]


def _refusal_findings(refusals: list[JSONObject]) -> list[Finding]:
    return [
        Finding.of(
            ReasonCode.CONCURRENT_MODIFICATION,
            since=refusal.get("at"),
            detail=refusal.get("details", {}).get("message", "write refused"),
            evidence={"actor": refusal.get("actor"), **refusal.get("details", {})},
        )
        for refusal in refusals
    ]


def _failure_findings(failures: dict[str, FailureEntry]) -> list[Finding]:
    return [
        Finding.of(
            ReasonCode.RECONCILIATION_FAILED,
            subsystem=name,
            paths=list(failure.get("paths", [])),
            since=failure.get("since"),
            detail=str(failure.get("detail", "reconcile failed")),
            evidence={k: v for k, v in failure.items() if k not in ("paths", "detail")},
        )
        for name, failure in sorted(failures.items())
    ]


def _skew_findings(facts: ClassifierInput) -> list[Finding]:
    """`STATE_VERSION_SKEW` for each version source the applied revision is not."""
    findings: list[Finding] = []
    applied = facts.applied
    override = applied.override
    for source, version in (
        ("desired", facts.desired_version),
        ("control plane", facts.control_plane_version),
    ):
        if version is None:
            continue
        # Identity, not number: the control plane's revision is applied only when
        # it came from the control plane (a local apply may have taken its number).
        differs = version != applied.version or (
            source == "control plane"
            and applied.cp_version is not None
            and applied.origin != "control-plane"
        )
        if not differs:
            continue
        detail = f"{source} version {version}, applied version {applied.version}"
        if override:
            detail += (
                f" (local override by {override.actor} at {override.at}: "
                f"{override.reason}; the next desired revision replaces it)"
            )
        elif version == applied.version:
            detail += f" applied from {applied.origin}, not the control plane"
        findings.append(
            Finding.of(
                ReasonCode.VERSION_SKEW,
                detail=detail,
                evidence={
                    "source": source,
                    "version": version,
                    "applied": applied.version,
                    "applied_origin": applied.origin,
                    "override": override.to_json() if override else None,
                },
            )
        )
    return findings


def _drift_findings(facts: ClassifierInput, explained: set[str]) -> list[Finding]:
    """`STATE_DRIFT_DETECTED` per subsystem that differs, unless `explained` (a partial
    update) or a running transaction is changing it."""
    if not facts.applied.version:
        return []
    open_txn = facts.open_transaction
    # A running transaction explains differences only in the subsystems it is changing.
    running: set[str] = set()
    if open_txn is not None and facts.open_transaction_live:
        running = set(open_txn.get("subsystems") or facts.differences)
    return [
        Finding.of(
            ReasonCode.DRIFT_DETECTED,
            subsystem=name,
            paths=[d.path for d in diffs],
            since=facts.drift_since.get(name, facts.observed_at),
            detail="; ".join(_describe(d) for d in diffs),
            evidence={
                "differences": [d.to_json() for d in diffs],
                "attribution": facts.attribution.get(name, []),
            },
        )
        for name, diffs in sorted(facts.differences.items())
        if diffs and name not in explained and name not in running
    ]


def _not_completed(
    open_txn: TransactionSummary, facts: ClassifierInput, applied_version: int
) -> tuple[str, str]:
    """An open transaction's detail and action, in the tense of what has happened so far.

    Nothing is rolled back before recovery has run: the text says what will
    happen (or is happening), never "was rolled back".
    """
    what = f"transaction {open_txn['txn']} (version {open_txn.get('version')})"
    if facts.open_transaction_live:
        return (
            f"{what} is still running past its deadline",
            "Its writer still holds the device, so it is not rolled back while it runs. Find "
            "the writer (`trueup status`, journal.writer) and wait for it or stop it; recovery "
            "then rolls the transaction back to the last committed revision.",
        )
    target = f"version {applied_version}" if applied_version else "the state before it"
    if facts.open_transaction_recovering:
        return (
            f"{what} was not completed; recovery is rolling it back to {target} now",
            "Wait for recovery to finish (`trueup status`), then re-run `trueup apply FILE` "
            "and verify exit 0.",
        )
    return (
        f"{what} was not completed: its writer is gone and nothing has rolled it back yet",
        f"Recovery will roll it back to {target} (the last committed revision) at the next "
        "agent start — a running agent does so within seconds — or at the next write "
        "(`trueup apply FILE` recovers first). Then check `trueup status` and re-run `trueup "
        "apply FILE` with the document you want, verifying exit 0.",
    )


def _damage_findings(damaged: list[DamageRecord]) -> list[Finding]:
    """One finding per damaged file that forbids writes or heals (the rest is only listed)."""
    out: list[Finding] = []
    for damage in damaged:
        if damage.get("blocks") not in ("writes", "heals"):
            continue
        if damage["blocks"] == "heals":
            code = ReasonCode.RECONCILIATION_FAILED
        elif damage.get("file") == "pending-confirm.json":
            code = ReasonCode.APPLY_NOT_COMPLETED  # a confirm-or-rollback in an unknown state
        else:
            code = ReasonCode.VERSION_SKEW  # what is applied cannot be told
        out.append(
            Finding(
                code=code,
                detail=f"{damage['path']}: {damage['problem']}",
                action=(
                    f"{damage.get('consequence', '')}. Keep the file as evidence (`trueup "
                    "evidence`), then restore it from a backup or move it aside (mv "
                    f"{damage['path']} {damage['path']}.damaged): the agent sees the repair at "
                    "once. Do not edit it by hand."
                ),
                evidence={"damaged": damage},
            )
        )
    return out


def _override_finding(override: OverrideStatus, applied_version: int) -> Finding:
    facts = f"{override.get('interface')} {', '.join(override.get('addresses') or [])}" + (
        f" via {override['gateway']}" if override.get("gateway") else ""
    )
    revision = override.get("revision") or {}
    against = (
        f"applied revision {applied_version} has {revision.get('interface')} "
        f"{', '.join(revision.get('addresses') or [])}"
        + (f" via {revision['gateway']}" if revision.get("gateway") else "")
        if applied_version and revision
        else "no revision carries management facts yet"
    )
    return Finding(
        code=ReasonCode.VERSION_SKEW,
        subsystem="management",
        paths=["spec.management"],
        since=override.get("set_at"),
        detail=(
            f"management set from the console by {override.get('actor')} at "
            f"{override.get('set_at')} ({facts}); {against}"
            + (
                ""
                if override.get("in_effect", True)
                else f"; not in effect: {override.get('problem')}"
            )
        ),
        action=(
            "The console override wins over the applied revision's management facts until a "
            "committed revision carries the same facts; then it is cleared. Put these facts in "
            "the desired revision (control plane) or apply a document that carries them; a "
            "revision that changes management away from them needs --confirm-within."
        ),
        evidence={"override": override},
    )


def _fact(value: Any) -> str:
    """A fact as `key: value` text (nulls left out), never Python's repr of a dict."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_fact(v)}" for k, v in value.items() if v is not None) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_fact(v) for v in value) + "]"
    return str(value)


def _describe(diff: Difference) -> str:
    if diff.missing or diff.extra:
        parts = []
        if diff.missing:
            parts.append("missing " + ", ".join(map(_fact, diff.missing)))
        if diff.extra:
            parts.append("unexpected " + ", ".join(map(_fact, diff.extra)))
        return f"{diff.path}: " + "; ".join(parts)
    if diff.desired is None:
        return f"{diff.path}: unexpected {_fact(diff.observed)}"
    if diff.observed is None:
        return f"{diff.path}: missing (want {_fact(diff.desired)})"
    return f"{diff.path}: want {_fact(diff.desired)}, have {_fact(diff.observed)}"
