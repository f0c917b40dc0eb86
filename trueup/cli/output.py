"""Rendering for CLI output: json, yaml and human tables.

Standard library only (yaml is imported when yaml output is asked for): the
typer commands in `trueup.cli.main` and the fast path in `trueup.cli.fast`
print through the same functions, so both render the same bytes.

Why this module is over 400 lines: the status table is one reading of the
whole status document (versions, management, subsystems, drift with its
attribution, healing, acknowledgements, limitations, confirmations), and the
fast path imports this one module with the standard library only; split, the
fast CLI would pay for a second import on every call.
"""

from __future__ import annotations

import json
import sys

TYPE_CHECKING = False  # typing's import time is measurable on the fast path
if TYPE_CHECKING:
    from typing import Any, TextIO

    from trueup.cli.bodies import (
        Acknowledgement,
        ApplyBody,
        Attribution,
        Finding,
        LastDrift,
        MessageBody,
        PlanBody,
        PlanStep,
        SubsystemStatus,
    )

__all__ = [
    "REFUSAL_EXIT_CODES",
    "api_result",
    "echo",
    "emit",
    "print_acknowledged",
    "print_apply",
    "print_confirmed",
    "print_drift",
    "print_plan",
    "print_status",
    "readable",
    "render_findings",
    "render_status",
]

# A value printed in a table is cut here, with a pointer to `-o json` for the whole.
VALUE_LIMIT = 300

# trueup.model.reasons.EXIT_CODES by value (a unit test keeps the two equal): the
# process exit code of a refused write.
REFUSAL_EXIT_CODES = {"STATE_CONCURRENT_MODIFICATION": 3, "STATE_VERSION_SKEW": 4}
# trueup.model.reasons.ReasonCode.PARTIAL_UPDATE (the same unit test keeps them equal).
PARTIAL_UPDATE = "STATE_PARTIAL_UPDATE"


def echo(message: str = "", err: bool = False) -> None:
    """What `typer.echo` does with a string: a line, ANSI codes stripped when not a terminal."""
    stream: TextIO | None = sys.stderr if err else sys.stdout
    if stream is None:
        return
    text = message + "\n"
    isatty = getattr(stream, "isatty", None)
    if "\033" in text and not (isatty is not None and isatty()):
        import re  # click's strip_ansi

        text = re.sub(r"\033\[[;?0-9]*[a-zA-Z]", "", text)
    encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "")
    buffer = getattr(stream, "buffer", None)
    if encoding in ("ascii", "usascii", "ansix3.41968", "646") and buffer is not None:
        stream.flush()
        buffer.write(text.encode("utf-8", "replace"))
        buffer.flush()
        return
    stream.write(text)
    stream.flush()


def emit(value: Any, output: str) -> None:
    if output == "json":
        echo(json.dumps(value, indent=2, sort_keys=False))
    elif output == "yaml":
        import yaml

        echo(yaml.safe_dump(value, sort_keys=False).rstrip())
    else:
        import typer

        raise typer.BadParameter(f"unknown output format {output!r}")


def api_result(response: Any) -> dict[str, Any] | int:
    """The body of an agent's answer, or the exit code after printing why it failed."""
    try:
        body = response.json()
    except ValueError:
        echo(f"trueup: agent answered {response.status_code}: {response.text[:200]}", err=True)
        return 1
    if response.status_code == 409:
        echo(f"{body['code']}: {body['message']}", err=True)
        return REFUSAL_EXIT_CODES.get(body["code"], 1)
    if response.status_code == 422:
        echo("request body: invalid document", err=True)
        for problem in body.get("problems", []):
            echo(f"  {problem}", err=True)
        return 1
    if response.status_code == 507 or (response.status_code >= 400 and "ok" not in body):
        message = str(body.get("message") or f"agent answered {response.status_code}: {body}")
        echo(f"trueup: {message}", err=True)
        return 1
    return dict(body)


def print_apply(result: ApplyBody, output: str) -> int:
    """`apply`, `rollback` and `reconcile`'s output; the exit code: 0 done, 1 not."""
    if output != "table":
        emit(result, output)
    else:
        _apply_table(result)
    if result["outcome"] == "partial":
        echo(
            f"{PARTIAL_UPDATE}: failed subsystems: {', '.join(result.get('failed', {}))}", err=True
        )
    return 0 if result["ok"] else 1


def _apply_table(result: ApplyBody) -> None:
    for step in result.get("steps", []):
        echo(f"  {step}")
    outcome = result["outcome"]
    txn = f" ({result['txn']})" if result.get("txn") else ""
    if outcome == "rolled_back":
        why = "; ".join(f"{n}: {e}" for n, e in result.get("failed", {}).items())
        tried = result.get("attempted_version")
        echo(
            (f"version {tried} was not applied; " if tried is not None else "not applied; ")
            + f"version {result['version']} remains (rolled back: {why or 'a step failed'})"
            + txn
        )
    else:
        echo(f"version {result['version']}: {outcome}{txn}")
    for name, error in result.get("failed", {}).items():
        echo(f"  failed {name}: {error}", err=True)
    for name, why in result.get("waiting", {}).items():
        echo(f"  waiting {name}: {why}", err=True)
    for name, error in result.get("carried", {}).items():
        echo(
            f"  still failing {name} (unchanged by this write; the agent keeps healing it): "
            f"{error}",
            err=True,
        )
    for error in result.get("rollback_errors", []):
        echo(f"  rollback error: {error}", err=True)
    for cleared in result.get("cleared", []):
        echo(f"  {cleared}")
    pending = result.get("pending_confirmation")
    if pending:
        echo(
            f"pending confirmation: run `trueup confirm` before {pending['deadline']}"
            " or this version is rolled back"
        )


def print_confirmed(body: MessageBody) -> int:
    """`trueup confirm`'s output: the agent's line; exit 1 when nothing was confirmed."""
    echo(body.get("message", json.dumps(body)))
    return 0 if body.get("ok", True) else 1


def print_acknowledged(body: MessageBody) -> int:
    """`trueup ack`'s output: the agent's line (stderr and exit 1 when it did not)."""
    if not body.get("ok", True):
        echo(f"trueup: {body.get('message', json.dumps(body))}", err=True)
        return 1
    echo(body.get("message", json.dumps(body)))
    return 0


def print_plan(body: PlanBody, output: str, source: str = "the document") -> int:
    """`trueup plan`'s output; the exit code: 1 a subsystem refuses the document, 2 changes, 0 none."""
    steps = [s for p in body["plans"] for s in p["steps"]]
    failed: dict[str, str] = body.get("failed") or {}
    if output != "table":
        emit(body, output)
        return 1 if failed else 2 if steps else 0
    where = body.get("observed_by", {})
    if where.get("agent_pid"):
        echo(
            f"observed by the agent (pid {where['agent_pid']}, state {where['state_dir']}, "
            f"applied version {where.get('applied_version')})"
        )
    else:
        echo(
            f"observed by this process (no agent answers on {where.get('state_dir')}/agent.sock): "
            f"network namespace {where.get('netns')}; run plan where the agent runs"
        )
    for p in body["plans"]:
        if p.get("error"):
            echo(f"  ! {p['subsystem']}: {p['error']}", err=True)
        elif p["steps"]:
            for step in p["steps"]:
                echo(f"  {_step_line(step)}")
        else:
            for reason in p["noop"]:
                echo(f"  = {p['subsystem']}: {reason}")
    changes = body.get("management_changes", [])
    for change in changes:
        echo(f"  ! management: {change}", err=True)
    if changes:
        echo(
            "  ! this changes management access: apply with --confirm-within SECONDS "
            "(rolled back unless `trueup confirm` arrives in time)",
            err=True,
        )
    if body.get("managed_by"):
        echo(
            f"  ! managed by the control plane at {body['managed_by']}: applying locally "
            'needs --override "REASON"',
            err=True,
        )
    if failed:
        echo(
            f"{source}: refused by {', '.join(failed)}: applying it would fail and change "
            "nothing; fix the path named above",
            err=True,
        )
        return 1
    echo(f"{len(steps)} change(s)" if steps else "no changes")
    return 2 if steps else 0


def _step_line(step: PlanStep) -> str:
    """`~ links: set-mtu lan0: 1500 → 1400` for a value that changes, `+ …` for what is added,
    `- …` for what goes."""
    old, new = step.get("old"), step.get("new")
    if (
        "old" not in step
        or old == new
        or isinstance(old, (dict, list))
        or isinstance(new, (dict, list))
    ):
        # A step on one element of a list or a record: its description says which.
        return f"+ {step['describe']}"
    args = step.get("args") or {}
    subject = next(
        (str(args[k]) for k in ("ifname", "name", "interface") if args.get(k)), step["path"]
    )
    head = f"{step['subsystem']}: {step['action']} {subject}"
    if old is None or old == "absent":
        return f"+ {head}: {readable(new, 120)}"
    if new is None or new == "absent":
        return f"- {head}: {readable(old, 120)}"
    return f"~ {head}: {readable(old, 120)} → {readable(new, 120)}"


def print_status(status: dict[str, Any], output: str) -> None:
    if output == "table":
        echo(render_status(status))
    else:
        emit(status, output)


def print_drift(report: dict[str, Any], output: str) -> int:
    """`trueup drift`'s output; the exit code: 0 in sync, 2 drift."""
    if output == "table":
        if report["in_sync"]:
            echo(f"in sync with version {report['applied_version']}")
        else:
            for d in report["differences"]:
                echo(
                    f"  {d['subsystem']}: {d['path']}: desired {readable(d['desired'])} "
                    f"observed {readable(d['observed'])}"
                )
            for name, record in (report.get("drift") or {}).items():
                echo(
                    f"  {name}: drifting since {_when(record.get('since'), report.get('observed_at'))}"
                    f", detected by {record.get('detected_by') or '-'}"
                )
                for event in (record.get("attribution") or [])[:5]:
                    echo(f"      changed by: {_who(event)}")
            echo("\n".join(render_findings(report["reason_codes"])))
        echo(
            "\n".join(render_last_drift(report.get("last_drift") or {}, report.get("observed_at")))
        )
    else:
        emit(report, output)
    return 0 if report["in_sync"] else 2


def readable(value: Any, limit: int = VALUE_LIMIT) -> str:
    """A fact for a human: `key: value, …` (JSON scalars, nulls left out), cut at `limit`.

    Never Python's repr (`{'via': …, 'dev': None}`) and never a 14 KB line: what
    is cut says so and points at `-o json`.
    """
    text = _flat(value)
    if len(text) > limit:
        text = text[: limit - 1].rstrip() + f"… ({len(text)} chars; `-o json` shows all)"
    return text


def _flat(value: Any) -> str:
    if isinstance(value, dict):
        parts = [f"{k}: {_flat(v)}" for k, v in value.items() if v is not None and v != []]
        return "{" + ", ".join(parts) + "}" if parts else "{}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_flat(v) for v in value) + "]"
    if isinstance(value, str):
        return value
    return json.dumps(value)


def render_findings(findings: list[Finding]) -> list[str]:
    lines = []
    for f in findings:
        head = f["code"] + (f" [{f['subsystem']}]" if f.get("subsystem") else "")
        lines.append(f"  {head} since {f.get('since') or '-'}")
        if f.get("detail"):
            lines.append(f"      {readable(f['detail'])}")
        for path in f.get("paths", [])[:10]:
            lines.append(f"      path: {path}")
        if f.get("action"):
            lines.append(f"      action: {f['action']}")
    return lines


def render_limitations(status: dict[str, Any]) -> list[str]:
    """Known limitations in force and the differences they cover (accepted, not drift)."""
    limitations = status.get("limitations") or []
    if not limitations:
        return []
    covered: dict[str, list[str]] = {}
    for sub in status.get("subsystems", {}).values():
        for diff in sub.get("accepted", []):
            covered.setdefault(str(diff.get("limitation")), []).append(str(diff.get("path")))
    lines = ["", "known limitations (accepted differences, not drift):"]
    for item in limitations:
        paths = covered.get(str(item.get("id")), [])
        lines.append(
            f"  {item.get('id')} [{item.get('subsystem')}] {item.get('path')}: "
            f"{item.get('reason')} (reviewed by {item.get('reviewed_by')}"
            + (f", {item['ticket']}" if item.get("ticket") else "")
            + f"; {len(paths)} accepted difference(s) now)"
        )
    return lines


def render_status(status: dict[str, Any]) -> str:
    """`trueup status` as a table: who answers, versions and management, the subsystems,
    then what is open, pending or accepted, and the reason codes."""
    lines = _status_head(status)
    lines += _subsystem_table(status)
    lines += _status_tail(status)
    findings = status.get("reason_codes", [])
    lines.append("")
    lines.append("reason codes:" if findings else "reason codes: none")
    lines.extend(render_findings(findings))
    return "\n".join(lines)


def _status_head(status: dict[str, Any]) -> list[str]:
    """The agent's presence, the device, its versions, management, startup, a missed confirm."""
    versions = status["versions"]
    mgmt = status["management"]
    agent = status.get("agent") or {}
    lines = []
    if agent.get("answering") is False and agent.get("running"):
        lines += [
            f"WARNING: the agent (pid {agent.get('pid')}) on {agent.get('state_dir')} does not "
            "answer on its socket (hung, or still starting): healing may be stalled;",
            "         the health below was observed now by this command "
            "(check: trueup doctor, the agent's log)",
            "",
        ]
    elif agent.get("running") is False:
        lines += [
            f"WARNING: no agent is running on {agent.get('state_dir') or 'this state directory'}: "
            "healing is off and nothing reports to the control plane;",
            "         the health below is the last known state, observed now by this command "
            "(start the agent: trueup agent run)",
            "",
        ]
    lines += [
        f"device:      {status.get('device') or '-'}",
        f"applied:     version {versions['applied']} ({versions.get('outcome') or 'nothing applied'})"
        + (
            f"   control plane: {versions['control_plane']}"
            if versions.get("control_plane")
            else ""
        ),
        f"management:  {'READY' if mgmt['ready'] else 'NOT READY'} "
        f"{mgmt.get('interface') or ''} {' '.join(mgmt.get('addresses') or [])}"
        + (
            f"  missing: {', '.join(mgmt['missing_addresses'])}"
            if mgmt.get("missing_addresses")
            else ""
        ),
    ]
    if agent.get("startup"):
        phases = " → ".join(f"{p['name']}:{p['state']}" for p in agent.get("startup", []))
        lines.append(f"startup:     {phases}")
    lines.append("")
    if versions.get("origin") == "confirm-timeout":
        lines.append(
            f"confirmation: MISSED — version {versions['applied']} is the last confirmed revision "
            "applied again because a --confirm-within deadline passed without `trueup confirm`"
        )
    return lines


def _subsystem_table(status: dict[str, Any]) -> list[str]:
    """One row per subsystem, then their drift, healing and acknowledgement details."""
    lines = [f"{'SUBSYSTEM':<12} {'TIER':<11} {'HEALTH':<9} {'POLICY':<7} REASON"]
    for name, sub in status["subsystems"].items():
        policy = sub.get("policy") or "-"
        extra = []
        if sub.get("breaker") and sub["breaker"] != "closed":
            extra.append(f"breaker {sub['breaker']}")
        if sub.get("acknowledged_until"):
            extra.append(f"acked until {sub['acknowledged_until']}")
        if sub.get("contested"):
            extra.append(f"contested {', '.join(sub['contested'])}")
        if sub.get("fought"):
            extra.append(f"FOUGHT by another writer, still restored: {', '.join(sub['fought'])}")
        stale = sub.get("stale")
        if stale:
            age = stale.get("age_seconds")
            extra.append(
                f"STALE: last look {age:.1f}s old, its daemon did not answer in time"
                if age is not None
                else "STALE: its daemon has not answered yet"
            )
        reason = sub.get("reason") or ""
        if extra:
            reason = (reason + " (" + "; ".join(extra) + ")").strip()
        lines.append(f"{name:<12} {sub['tier']:<11} {sub['health']:<9} {policy:<7} {reason}")
    lines.extend(_subsystem_details(status["subsystems"], status.get("observed_at")))
    last = {
        n: sub["last_drift"] for n, sub in status["subsystems"].items() if sub.get("last_drift")
    }
    lines.extend(render_last_drift(last, status.get("observed_at")))
    return lines


def _status_tail(status: dict[str, Any]) -> list[str]:
    """An open transaction, a pending or last confirmation, a restore, known limitations."""
    lines: list[str] = []
    journal = status.get("journal", {})
    if journal.get("open"):
        txn = journal["open"]
        lines.append(f"\nopen transaction: {txn['txn']} version {txn.get('version')}")
    pending = status.get("pending_confirmation")
    confirmation = status.get("confirmation") or {}
    if pending:
        waits = confirmation.get("reason") if confirmation.get("state") == "pending" else None
        lines.append(
            f"\npending confirmation: version {pending['version']} "
            f"rolls back at {pending['deadline']} unless {waits or '`trueup confirm`'}"
        )
    elif confirmation.get("state") in ("confirmed", "rolled-back"):
        lines.append(
            f"\nlast confirmation: version {confirmation.get('version')} "
            f"{confirmation['state']}: {confirmation.get('reason')}"
        )
    restore = status.get("restore")
    if restore:
        lines.append(
            f"\nrestore:     {restore['state']} ({restore.get('mode')} of {restore.get('archive')})"
            + (f"\n  problem:   {restore['problem']}" if restore.get("problem") else "")
            + f"\n  next:      {restore.get('next')}"
        )
    lines.extend(render_limitations(status))
    return lines


def _subsystem_details(
    subsystems: dict[str, SubsystemStatus], observed_at: str | None = None
) -> list[str]:
    """Drift records with who changed what, back-off and breaker, acknowledgements."""
    drift: list[str] = []
    healing: list[str] = []
    acks: list[str] = []
    for name, sub in subsystems.items():
        record = sub.get("drift")
        diffs = sub.get("differences") or []
        if record or diffs:
            since = f" since {record['since']}" if record and record.get("since") else ""
            how = f", detected by {record['detected_by']}" if record else ""
            drift.append(f"  {name}{since}: {len(diffs)} differing path(s){how}")
            for d in diffs[:5]:
                drift.append(f"      path:     {d['path']}")
                drift.append(f"      desired:  {readable(d.get('desired'))}")
                drift.append(f"      observed: {readable(d.get('observed'))}")
            if len(diffs) > 5:
                drift.append(f"      … {len(diffs) - 5} more (`trueup drift -o json`)")
            for event in (record or {}).get("attribution", [])[:5]:
                drift.append(f"      changed by: {_who(event)}")
        failures = sub.get("consecutive_failures") or 0
        breaker = sub.get("breaker")
        if failures or (breaker and breaker != "closed") or sub.get("backoff_seconds"):
            parts = [f"breaker {breaker or '-'}", f"{failures} consecutive failure(s)"]
            if sub.get("backoff_seconds"):
                parts.append(f"back-off {sub['backoff_seconds']:g}s")
            if sub.get("next_attempt_at"):
                parts.append(f"next attempt at {sub['next_attempt_at']}")
            budget = sub.get("retry_budget")
            if budget:
                parts.append(f"retry budget {budget.get('used')}/{budget.get('limit')}")
            healing.append(f"  {name}: " + ", ".join(parts))
        ack = sub.get("acknowledgement")
        if ack or sub.get("acknowledged_until"):
            acks.append(_ack_line(name, sub, ack or {}, observed_at))
    out: list[str] = []
    for title, block in (("drift:", drift), ("healing:", healing), ("acknowledged:", acks)):
        if block:
            out += ["", title, *block]
    return out


def _ack_line(
    name: str, sub: SubsystemStatus, ack: Acknowledgement, observed_at: str | None
) -> str:
    """An acknowledgement: the subsystem, until when (and how long that is), by whom, why."""
    until = sub.get("acknowledged_until") or ack.get("until_at")
    return (
        f"  {name}: healing paused until {until}"
        + (f" ({_age(until, observed_at, future=True)})" if until else "")
        + (f" by {ack['actor']}" if ack.get("actor") else "")
        + (f": {ack['reason']}" if ack.get("reason") else "")
        + f"; drift is still detected (withdraw: trueup ack {name} --clear)"
    )


def render_last_drift(last: dict[str, LastDrift], observed_at: str | None) -> list[str]:
    """The last drift of each subsystem that ended, healed or not: what differed, who, when.

    `addresses: healed 09:34:07Z (2 min ago) by trueup heal TXN; drifted since …`,
    then its paths and who changed them (`changed by:`).
    """
    if not last:
        return []
    lines = ["", "last drift (ended):"]
    for name, record in last.items():
        ended = _when(record.get("ended_at"), observed_at)
        healed = record.get("healed_by")
        if healed:
            how = f"healed {ended} by {healed.get('writer') or 'trueup heal'}"
            if healed.get("actor") and healed["actor"] != "reconciler":
                how += f" (requested by {healed['actor']})"
        else:
            how = f"in sync again {ended} without a trueup heal (put back by its writer or the kernel)"
        lines.append(
            f"  {name}: {how}; drifted since {_when(record.get('since'), observed_at)}, "
            f"detected by {record.get('detected_by') or '-'}"
        )
        for path in (record.get("paths") or [])[:5]:
            lines.append(f"      path:       {path}")
        for event in (record.get("attribution") or [])[:5]:
            lines.append(f"      changed by: {_who(event)}")
    return lines


def _when(iso: str | None, now: str | None) -> str:
    """`09:34:07Z (2 min ago)` for an ISO time; `-` when there is none."""
    if not iso:
        return "-"
    clock = iso.split("T", 1)[-1].split(".", 1)[0].rstrip("Z") + "Z"
    age = _age(iso, now)
    return f"{clock} ({age})" if age else clock


def _age(iso: str | None, now: str | None, future: bool = False) -> str:
    """How long ago `iso` was at `now` (`2 min ago`), or how long until it (`in 9 min`)."""
    if not iso or not now:
        return ""
    from datetime import datetime

    try:
        then = datetime.fromisoformat(iso.replace("Z", "+00:00"))
        at = datetime.fromisoformat(now.replace("Z", "+00:00"))
    except ValueError:
        return ""
    seconds = (then - at).total_seconds() if future else (at - then).total_seconds()
    seconds = max(seconds, 0.0)
    if seconds < 60:
        span = f"{seconds:.0f} s"
    elif seconds < 3600:
        span = f"{seconds / 60:.0f} min"
    elif seconds < 172800:
        span = f"{seconds / 3600:.1f} h"
    else:
        span = f"{seconds / 86400:.0f} days"
    return f"in {span}" if future else f"{span} ago"


def _who(event: Attribution) -> str:
    """One attribution entry: what arrived, from whom, when."""
    if not event.get("message") and event.get("detail"):
        return f"{event['detail']} (at {event.get('received_at') or '-'})"
    who = event.get("sender")
    if event.get("sender_port") is not None:
        who = f"{who or 'unknown'} (netlink port {event['sender_port']})"
    subject = " ".join(
        str(event[k]) for k in ("ifname", "address", "destination") if event.get(k) is not None
    )
    text = f"{event.get('message') or event.get('kind') or 'change'}"
    if subject:
        text += f" {subject}"
    if who:
        text += f" from {who}"
    if event.get("match") == "related":
        text += " (related notification)"
    return readable(f"{text} at {event.get('received_at') or '-'}", 200)
