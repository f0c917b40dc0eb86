"""The status table and the facts in it, for a human: what `trueup status` prints.

Standard library only, like `trueup.cli.output` (which prints through it):
the fast path renders status with it on every call.
"""

from __future__ import annotations

import json

TYPE_CHECKING = False  # typing's import time is measurable on the fast path
if TYPE_CHECKING:
    from typing import Any

    from trueup.cli.bodies import (
        Acknowledgement,
        Attribution,
        Finding,
        LastDrift,
        StatusBody,
        SubsystemStatus,
    )

__all__ = [
    "VALUE_LIMIT",
    "readable",
    "render_findings",
    "render_last_drift",
    "render_limitations",
    "render_status",
]

# A value printed in a table is cut here, with a pointer to `-o json` for the whole.
VALUE_LIMIT = 300


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


def render_limitations(status: StatusBody) -> list[str]:
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


def render_status(status: StatusBody) -> str:
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


def _status_head(status: StatusBody) -> list[str]:
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


def _subsystem_table(status: StatusBody) -> list[str]:
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
    lines.extend(_gateway_lines(status["subsystems"].get("gateways")))
    lines.extend(_subsystem_details(status["subsystems"], status.get("observed_at")))
    last = {n: drift for n, sub in status["subsystems"].items() if (drift := sub.get("last_drift"))}
    lines.extend(render_last_drift(last, status.get("observed_at")))
    return lines


def _gateway_lines(sub: SubsystemStatus | None) -> list[str]:
    """The gateways' uplinks: state, since when, loss and latency over the window, active."""
    system = (sub or {}).get("system") or {}
    gateways = system.get("gateways")
    if not isinstance(gateways, list) or not gateways:
        return []
    active = system.get("active")
    names = ", ".join(str(a) for a in active) if isinstance(active, list) and active else "-"
    header = f"\ngateways ({system.get('policy')}): active {names}"
    states = {g.get("state") for g in gateways if isinstance(g, dict)}
    if system.get("monitoring") is False:
        header += " (not monitored: no agent probes these uplinks)"
    elif states == {"pending"}:
        header += " (no verdict yet: the route stays there until the probes say)"
    lines = [header]
    for g in gateways:
        if not isinstance(g, dict):
            continue
        latency = g.get("latency_ms")
        lines.append(
            f"  {g.get('name')!s:<12} {g.get('interface')!s:<10} {g.get('gateway')!s:<16} "
            f"{g.get('state')!s:<8} since {g.get('since') or '-'}  loss {g.get('loss_percent')}%  "
            f"latency {f'{latency} ms' if latency is not None else '-'}"
            + ("  ACTIVE" if g.get("active") else "")
        )
    if system.get("all_down"):
        lines.append("  every gateway of a family is down: its last default route is kept")
    return lines


def _status_tail(status: StatusBody) -> list[str]:
    """An open transaction, a pending or last confirmation, a restore, known limitations."""
    lines: list[str] = []
    journal = status.get("journal", {})
    txn = journal.get("open")
    if txn:
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
                drift.append(f"      changed by: {who(event)}")
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
        ended = when(record.get("ended_at"), observed_at)
        healed = record.get("healed_by")
        if healed:
            how = f"healed {ended} by {healed.get('writer') or 'trueup heal'}"
            if healed.get("actor") and healed["actor"] != "reconciler":
                how += f" (requested by {healed['actor']})"
        else:
            how = f"in sync again {ended} without a trueup heal (put back by its writer or the kernel)"
        lines.append(
            f"  {name}: {how}; drifted since {when(record.get('since'), observed_at)}, "
            f"detected by {record.get('detected_by') or '-'}"
        )
        for path in (record.get("paths") or [])[:5]:
            lines.append(f"      path:       {path}")
        for event in (record.get("attribution") or [])[:5]:
            lines.append(f"      changed by: {who(event)}")
    return lines


def when(iso: str | None, now: str | None) -> str:
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


def who(event: Attribution) -> str:
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
