"""The runbook as checks: `trueup doctor` and its stop conditions (`--until-stable`).

Who calls this: the CLI (`trueup.cli.evidence`). Every check is safe (reads
only): desired vs observed, versions on both sides, errors in the agent's
log, concurrent operations, heartbeat and control-plane connection, changes
made outside trueup (drift, edited state files, a broken audit chain), and
whether an agent runs at all. Each finding carries a code and the corrective
action; the status' reason codes come with the runbook's actions
(`trueup.model.reasons`), the doctor's own codes with the actions below.

`stop_conditions` is what `--until-stable` waits for: desired equals observed,
versions aligned, no reconciliation error, an agent running; the caller
keeps them true for the whole window.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypedDict

from trueup.model.jsontypes import JSONObject
from trueup.model.reasons import ReasonCode

__all__ = [
    "DOCTOR_ACTIONS",
    "AgentPresence",
    "DoctorFinding",
    "log_errors",
    "run_checks",
    "stop_conditions",
]

AGENT_NOT_RUNNING = "AGENT_NOT_RUNNING"
AGENT_NOT_ANSWERING = "AGENT_NOT_ANSWERING"
AGENT_LOG_ERRORS = "AGENT_LOG_ERRORS"
CONTROL_PLANE_DISCONNECTED = "CONTROL_PLANE_DISCONNECTED"
HEARTBEAT_STALE = "HEARTBEAT_STALE"
WRITE_IN_PROGRESS = "WRITE_IN_PROGRESS"
AUDIT_CHAIN_BROKEN = "AUDIT_CHAIN_BROKEN"
STATE_FILES_EDITED = "STATE_FILES_EDITED"
MANAGEMENT_NOT_READY = "MANAGEMENT_NOT_READY"
STARTUP_BLOCKER = "STARTUP_BLOCKER"

DOCTOR_ACTIONS: dict[str, str] = {
    AGENT_NOT_RUNNING: (
        "No agent runs on this state directory: nothing heals drift or follows the control "
        "plane. Start it (`systemctl start trueup-agent`, or `trueup agent run --state-dir DIR`) "
        "and run `trueup doctor` again."
    ),
    AGENT_NOT_ANSWERING: (
        "An agent process holds this state directory but does not answer on its socket (hung "
        "or starting). Collect `trueup evidence --out FILE` (works without it), read its log, "
        "then restart it."
    ),
    AGENT_LOG_ERRORS: (
        "The agent logged errors recently. Read them (`trueup evidence` includes the last 200 "
        "lines) and fix the cause they name."
    ),
    CONTROL_PLANE_DISCONNECTED: (
        "The agent cannot reach the control plane. Check the URL, the device credential and "
        "the network path; the agent keeps its applied version meanwhile."
    ),
    HEARTBEAT_STALE: (
        "The agent's last report to the control plane is older than three heartbeats; the "
        "fleet view is out of date. Check the connection (last_error) and the agent's log."
    ),
    WRITE_IN_PROGRESS: (
        "Another writer holds the state directory's lock. Wait for it to finish (or find the "
        "holder's pid and what it runs) before applying; do not remove the lock file."
    ),
    AUDIT_CHAIN_BROKEN: (
        "The audit log was edited, truncated or reordered. Keep the file as evidence (`trueup "
        "evidence`), find who had access, and do not repair it by hand."
    ),
    STATE_FILES_EDITED: (
        "A stored revision no longer matches its digest: a state file was changed outside "
        "trueup. Keep it as evidence and apply the desired revision again."
    ),
    STARTUP_BLOCKER: (
        "An agent could not start cleanly here (`trueup preflight` names the blocker: a damaged "
        "state file, an unreadable document). Fix it before restarting or replacing the agent."
    ),
    MANAGEMENT_NOT_READY: (
        "The management interface lacks its addresses. Restore them (`trueup management set` "
        "from the console) before changing anything else."
    ),
}

LOG_ERROR_WINDOW = timedelta(minutes=10)
_ERROR_MARKERS = (" ERROR ", " CRITICAL ", "Traceback (most recent call last)")


@dataclass(frozen=True)
class AgentPresence:
    """Whether an agent runs on the state directory and answers on its socket."""

    running: bool  # a live process holds the agent lock
    answering: bool  # it answered the health check
    pid: int | None = None


class DoctorFindingJSON(TypedDict):
    """A finding as `trueup doctor -o json` prints it."""

    check: str
    ok: bool
    message: str
    code: str | None
    action: str
    subsystem: str | None
    paths: list[str]


@dataclass(frozen=True)
class DoctorFinding:
    check: str
    ok: bool
    message: str
    code: str | None = None
    action: str = ""
    subsystem: str | None = None
    paths: list[str] = field(default_factory=list)

    def to_json(self) -> DoctorFindingJSON:
        return {
            "check": self.check,
            "ok": self.ok,
            "message": self.message,
            "code": self.code,
            "action": self.action,
            "subsystem": self.subsystem,
            "paths": self.paths,
        }


def _fail(check: str, code: str, message: str, **kw: Any) -> DoctorFinding:
    return DoctorFinding(check, False, message, code, DOCTOR_ACTIONS[code], **kw)


def _ok(check: str, message: str) -> DoctorFinding:
    return DoctorFinding(check, True, message)


def _when(value: Any) -> datetime | None:
    if isinstance(value, int | float):
        return datetime.fromtimestamp(float(value), UTC)
    if isinstance(value, str) and value:
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    return None


def _iso(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ") if moment else "never"


def log_errors(lines: list[str], now: datetime | None = None) -> tuple[list[str], list[str]]:
    """(recent, older) error lines; recent = within LOG_ERROR_WINDOW (or undated)."""
    now = now or datetime.now(UTC)
    recent: list[str] = []
    older: list[str] = []
    for line in lines:
        if not any(marker in f" {line} " for marker in _ERROR_MARKERS):
            continue
        when = _when(line.split(" ", 1)[0])
        (older if when is not None and now - when > LOG_ERROR_WINDOW else recent).append(line)
    return recent, older


def run_checks(
    status: JSONObject,
    agent: AgentPresence,
    *,
    log_lines: list[str] | None = None,
    log_source: str | None = None,
    tampered: list[str] | None = None,
    audit_problems: list[str] | None = None,
    blockers: list[tuple[str, str]] | None = None,
    now: datetime | None = None,
) -> list[DoctorFinding]:
    """Every runbook check over one status document and what was read beside it.

    `status` is the document as served (an agent's `/v1/status`, or `gather`'s),
    read key by key: doctor also runs on what an older agent or a damaged state
    directory gives, where a key may be missing.
    """
    now = now or datetime.now(UTC)
    out = [_agent_check(agent)]
    # desired vs observed, versions, concurrency, partial/open transactions: the reason codes
    out.extend(_reason_code_checks(status))
    out.extend(_state_checks(status))
    out.extend(_control_plane(status, now))
    out.extend(_log_check(log_lines, log_source, now))
    if tampered:
        out.append(_fail("changes outside trueup", STATE_FILES_EDITED, "; ".join(tampered[:5])))
    for check, message in blockers or []:
        out.append(_fail(check, STARTUP_BLOCKER, message))
    if audit_problems:
        out.append(_fail("audit log", AUDIT_CHAIN_BROKEN, audit_problems[0]))
    elif audit_problems is not None:
        out.append(_ok("audit log", "hash chain intact"))
    return out


def _agent_check(agent: AgentPresence) -> DoctorFinding:
    if agent.answering:
        return _ok("agent", f"agent pid {agent.pid} running and answering")
    if agent.running:
        return _fail(
            "agent", AGENT_NOT_ANSWERING, f"agent pid {agent.pid} runs but does not answer"
        )
    return _fail("agent", AGENT_NOT_RUNNING, "no agent runs on this state directory: healing off")


def _reason_code_checks(status: JSONObject) -> list[DoctorFinding]:
    return [
        DoctorFinding(
            _CHECK_OF.get(str(f.get("code")), "reason code"),
            False,
            str(f.get("detail") or f.get("code")),
            str(f.get("code")),
            str(f.get("action") or ""),
            f.get("subsystem"),
            list(f.get("paths") or []),
        )
        for f in status.get("reason_codes", [])
    ]


def _state_checks(status: JSONObject) -> list[DoctorFinding]:
    """Desired vs observed, versions, concurrent writers and management, where no reason
    code already says it."""
    out: list[DoctorFinding] = []
    codes = {str(f.get("code")) for f in status.get("reason_codes", [])}
    diffs = [d for s in status.get("subsystems", {}).values() for d in s.get("differences", [])]
    accepted = [d for s in status.get("subsystems", {}).values() for d in s.get("accepted", [])]
    if not diffs and ReasonCode.DRIFT_DETECTED.value not in codes:
        out.append(
            _ok(
                "desired vs observed",
                "observed equals desired"
                + (
                    f" ({len(accepted)} accepted difference(s), known limitations)"
                    if accepted
                    else ""
                ),
            )
        )
    elif diffs and ReasonCode.DRIFT_DETECTED.value not in codes:
        out.append(
            DoctorFinding(
                "desired vs observed",
                False,
                f"{len(diffs)} differing path(s)",
                ReasonCode.DRIFT_DETECTED.value,
                _runbook(ReasonCode.DRIFT_DETECTED),
                paths=[str(d.get("path")) for d in diffs][:20],
            )
        )
    versions = status.get("versions", {})
    if ReasonCode.VERSION_SKEW.value not in codes:
        out.append(
            _ok(
                "versions",
                f"applied {versions.get('applied')}, control plane "
                f"{versions.get('control_plane') or '-'}",
            )
        )
    writer = status.get("journal", {}).get("writer")
    if writer:
        out.append(
            _fail(
                "concurrent operations",
                WRITE_IN_PROGRESS,
                f"writer lock held by pid {writer.get('pid')} ({writer.get('purpose')}) since "
                f"{writer.get('since') or writer.get('at') or '?'}",
            )
        )
    elif ReasonCode.CONCURRENT_MODIFICATION.value not in codes:
        out.append(_ok("concurrent operations", "no write in progress, no refused write"))
    management = status.get("management", {})
    if versions.get("applied") and not management.get("ready", True):
        out.append(
            _fail(
                "management",
                MANAGEMENT_NOT_READY,
                f"missing {', '.join(management.get('missing_addresses') or []) or 'its state'}",
            )
        )
    return out


_CHECK_OF = {
    ReasonCode.DRIFT_DETECTED.value: "desired vs observed",
    ReasonCode.VERSION_SKEW.value: "versions",
    ReasonCode.CONCURRENT_MODIFICATION.value: "concurrent operations",
    ReasonCode.APPLY_NOT_COMPLETED.value: "journal",
    ReasonCode.PARTIAL_UPDATE.value: "journal",
    ReasonCode.RECONCILIATION_FAILED.value: "reconciliation",
}


def _runbook(code: ReasonCode) -> str:
    from trueup.model.reasons import CORRECTIVE_ACTIONS

    return CORRECTIVE_ACTIONS[code]


def _control_plane(status: JSONObject, now: datetime) -> list[DoctorFinding]:
    plane = status.get("control_plane")
    if not plane:
        return [_ok("control plane", "not managed by a control plane")]
    last = _when(plane.get("last_report_at"))
    where = f"{plane.get('url')}: last report {_iso(last)}"
    if plane.get("last_error"):
        where += f"; {plane['last_error']}"
    if not plane.get("connected"):
        return [_fail("control plane", CONTROL_PLANE_DISCONNECTED, where)]
    interval = float(plane.get("heartbeat_interval") or 30.0)
    if last is None or now - last > timedelta(seconds=3 * interval):
        return [_fail("heartbeat", HEARTBEAT_STALE, where)]
    return [_ok("control plane", where)]


def _log_check(lines: list[str] | None, source: str | None, now: datetime) -> list[DoctorFinding]:
    if lines is None:
        return [_ok("agent log", f"not read: {source or 'no log found'}")]
    recent, older = log_errors(lines, now)
    if recent:
        return [
            _fail(
                "agent log",
                AGENT_LOG_ERRORS,
                f"{len(recent)} error line(s) in the last {len(lines)} lines of {source}; "
                f"latest: {recent[-1][:300]}",
            )
        ]
    return [
        _ok(
            "agent log",
            f"no recent error in the last {len(lines)} lines of {source}"
            + (f" ({len(older)} older)" if older else ""),
        )
    ]


_RECONCILE_ERRORS = {
    ReasonCode.RECONCILIATION_FAILED.value,
    ReasonCode.APPLY_NOT_COMPLETED.value,
    ReasonCode.PARTIAL_UPDATE.value,
}


def stop_conditions(status: JSONObject, agent: AgentPresence) -> dict[str, tuple[bool, str]]:
    """The runbook's stop conditions now: name → (met, what is seen)."""
    codes = {str(f.get("code")) for f in status.get("reason_codes", [])}
    diffs = [
        str(d.get("path"))
        for s in status.get("subsystems", {}).values()
        for d in s.get("differences", [])
    ]
    versions = status.get("versions", {})
    failing = sorted(
        name for name, s in status.get("subsystems", {}).items() if s.get("health") == "failed"
    )
    errors = sorted(codes & _RECONCILE_ERRORS)
    cp = versions.get("control_plane")
    aligned = ReasonCode.VERSION_SKEW.value not in codes and cp in (None, versions.get("applied"))
    return {
        "agent running": (
            agent.answering,
            f"pid {agent.pid}" if agent.answering else "no agent answers",
        ),
        "desired equals observed": (
            not diffs and ReasonCode.DRIFT_DETECTED.value not in codes,
            "in sync" if not diffs else f"{len(diffs)} path(s) differ: {', '.join(diffs[:3])}",
        ),
        "versions aligned": (
            aligned,
            f"applied {versions.get('applied')}, control plane {cp if cp is not None else '-'}",
        ),
        "no reconciliation error": (
            not errors and not failing,
            "none"
            if not errors and not failing
            else ", ".join(errors + [f"{n} failed" for n in failing]),
        ),
    }
