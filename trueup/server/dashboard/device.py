"""The device page: versions, findings, desired vs observed, subsystems, drift history (who
changed what, who healed it), timeline, acknowledgements (the router's and the control
plane's), apply (If-Match), revision history with diffs, audit trail.

The parts that follow the device (`live_parts`) are pushed to an open page by the
device stream (`/ui/devices/{device}/stream`, dashboard.js) without a reload; the
forms are not, so nothing typed into them is lost.

Why this module is over 400 lines: the page is one document whose sections
share the caller's role checks and the report's shapes; each section is a short
function next to the others, and splitting them would scatter one page's markup.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import yaml

from trueup.server.api.records import ServiceRecord
from trueup.server.dashboard.agentinfo import agent_summary
from trueup.server.dashboard.data import iso, report_conditions
from trueup.server.dashboard.html import badge, esc, short_digest
from trueup.server.dashboard.limitations import limitations_section
from trueup.server.dashboard.records import AuditRow, Difference
from trueup.server.dashboard.timeline import timeline_events, timeline_svg
from trueup.server.service import Principal
from trueup.server.service.evidence import EvidenceListing
from trueup.server.tokens import Role, role_at_least

__all__ = [
    "DevicePage",
    "differences",
    "document_text",
    "live_parts",
    "render_device",
    "revision_diff",
]

ACK_CHOICES = [
    ("900", "15 minutes"),
    ("3600", "1 hour"),
    ("14400", "4 hours"),
    ("86400", "1 day"),
    ("604800", "7 days"),
]


@dataclass
class DevicePage:
    principal: Principal
    csrf: str
    entry: ServiceRecord  # the fleet view of the device
    report: ServiceRecord | None  # its last report, as stored
    reports: list[ServiceRecord]
    desired: ServiceRecord | None  # the desired revision's summary + document
    revisions: list[ServiceRecord]
    audit: list[AuditRow] | None  # None: the caller may not read the audit log
    now: float
    diff: tuple[int, int, str] | None = None  # (a, b, unified diff)
    conflict: ServiceRecord | None = None  # the 409 body of a stale apply
    notice: str = ""
    error: str = ""
    draft: str | None = None  # the document the user submitted (kept on a conflict)
    expected: int | None = None
    evidence: EvidenceListing = field(
        default_factory=lambda: EvidenceListing(evidence=[], pending_requests=[])
    )
    drift: list[ServiceRecord] = field(default_factory=list)  # drift history, newest first
    agent_acks: list[ServiceRecord] = field(default_factory=list)  # the router's `trueup ack`s


def document_text(document: Any) -> str:
    return yaml.safe_dump(document, sort_keys=False, default_flow_style=False)


def revision_diff(a: ServiceRecord, b: ServiceRecord, va: int, vb: int) -> str:
    """The unified diff of two revisions' documents (as the revisions service returns them)."""
    return "".join(
        difflib.unified_diff(
            document_text(a).splitlines(keepends=True),
            document_text(b).splitlines(keepends=True),
            fromfile=f"revision {va}",
            tofile=f"revision {vb}",
        )
    )


def differences(report: ServiceRecord | None) -> list[Difference]:
    """Every differing path the last report carries, with desired and observed values
    when the agent sent them (drift findings' evidence)."""
    if not report:
        return []
    out: list[Difference] = []
    seen: set[tuple[str, str]] = set()
    for finding in report.get("findings") or []:
        for d in (finding.get("evidence") or {}).get("differences") or []:
            key = (str(d.get("subsystem")), str(d.get("path")))
            if key not in seen:
                seen.add(key)
                out.append(_difference(d, finding.get("code")))
        for path in finding.get("paths") or []:
            key = (str(finding.get("subsystem")), str(path))
            if key not in seen:
                seen.add(key)
                out.append(
                    {
                        "subsystem": finding.get("subsystem"),
                        "path": path,
                        "code": finding.get("code"),
                    }
                )
    for path in (report.get("diff_summary") or {}).get("paths") or []:
        if not any(p == str(path) for _, p in seen):
            seen.add(("", str(path)))
            out.append({"subsystem": None, "path": path})  # named by the diff summary only
    return out


def _difference(d: ServiceRecord, code: str | None) -> Difference:
    """A drift finding's evidence of one path (as the agent sent it), with the finding's code."""
    out: Difference = {"subsystem": d.get("subsystem"), "path": d["path"], "code": code}
    if "desired" in d:
        out["desired"] = d["desired"]
    if "observed" in d:
        out["observed"] = d["observed"]
    if "missing" in d:
        out["missing"] = d["missing"]
    if "extra" in d:
        out["extra"] = d["extra"]
    return out


def _value(value: Any, marked: list[Any], cls: str) -> str:
    if isinstance(value, list):
        items = []
        for item in value:
            text = esc(json.dumps(item, sort_keys=True) if not isinstance(item, str) else item)
            items.append(f'<li class="{cls}">{text}</li>' if item in marked else f"<li>{text}</li>")
        return f'<ul class="val">{"".join(items)}</ul>' if items else "<code>[]</code>"
    if value is None:
        return '<span class="muted">absent</span>'
    return f"<code>{esc(json.dumps(value, sort_keys=True))}</code>"


def _side_by_side(diffs: list[Difference], page: DevicePage) -> str:
    head = "<h2>Desired vs observed</h2>"
    if not diffs:
        note = "no differing path in the last report" if page.report else "no report yet"
        return head + f'<p class="muted">{note}</p>'
    rows = []
    for d in diffs:
        has_values = "desired" in d or "observed" in d
        desired = _value(d.get("desired"), d.get("missing") or [], "missing") if has_values else "-"
        observed = _value(d.get("observed"), d.get("extra") or [], "extra") if has_values else "-"
        rows.append(
            f'<tr class="differs" data-path="{esc(d["path"])}"><td>{esc(d.get("subsystem") or "")}'
            f'</td><td><code class="path">{esc(d["path"])}</code></td>'
            f"<td>{desired}</td><td>{observed}</td></tr>"
        )
    return (
        head + '<p class="muted">Highlighted: paths where the router differs from the applied '
        'revision (from the agent\'s last report); <span class="missing">missing</span> '
        'desired items, <span class="extra">extra</span> observed items.</p>'
        '<table class="sbs"><thead><tr><th>Subsystem</th><th>Path</th><th>Desired</th>'
        f"<th>Observed</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def _management(ready: Any) -> str:
    if ready is None:
        return "not reported"
    return "ready" if ready is True else "NOT READY"


def _summary(page: DevicePage) -> str:
    e = page.entry
    report = page.report or {}
    override = e.get("override")
    rows = [
        ("Status", " ".join(badge(c) for c in e["conditions"])),
        (
            "Reason codes",
            " ".join(f'<code class="code">{esc(c)}</code>' for c in e["reason_codes"]) or "none",
        ),
        (
            "Desired",
            f"v{e['desired_version']} <code>{esc(short_digest(e['desired_digest']))}</code>",
        ),
        (
            "Applied",
            f"v{e['applied_version'] if e['applied_version'] is not None else '-'} "
            f"<code>{esc(short_digest(e['applied_digest']))}</code> from "
            f"{esc(e.get('applied_origin') or '-')}"
            + (" (digests differ)" if e.get("digest_match") is False else ""),
        ),
        (
            "Override",
            esc(f"v{override['version']} by {override.get('actor')}: {override.get('reason')}")
            if override
            else "none",
        ),
        (
            "Last heartbeat",
            (esc(iso(e["last_report_at"])) or "never")
            + (f" ({e['missed_heartbeats']} intervals ago)" if e.get("missed_heartbeats") else ""),
        ),
        ("In sync since", esc(iso(e["in_sync_since"])) or "-"),
        ("Agent", agent_summary(e.get("agent") or {})),
        (
            "Management",
            _management(report.get("management_ready")),
        ),
    ]
    return '<dl class="summary">' + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in rows) + "</dl>"


def _findings(report: ServiceRecord | None) -> str:
    findings = (report or {}).get("findings") or []
    if not findings:
        return ""
    items = []
    for f in findings:
        paths = "".join(f"<li><code>{esc(p)}</code></li>" for p in (f.get("paths") or [])[:20])
        items.append(
            f'<li><code class="code">{esc(f.get("code"))}</code> '
            f"{esc(f.get('subsystem') or '')} since {esc(f.get('since') or '-')}"
            f"<div>{esc(f.get('detail') or '')}</div>"
            f'<div class="action">action: {esc(f.get("action") or "-")}</div>'
            f"<ul>{paths}</ul></li>"
        )
    return f'<h2>Findings</h2><ul class="findings">{"".join(items)}</ul>'


def _subsystems(page: DevicePage) -> str:
    report = page.report or {}
    subs = report.get("subsystems") or {}
    if not subs:
        return '<h2>Subsystems</h2><p class="muted">no report yet</p>'
    acks: dict[str, list[ServiceRecord]] = {}
    for ack in page.entry.get("acknowledgements") or []:
        acks.setdefault(ack["subsystem"], []).append(ack)
    counts = (report.get("diff_summary") or {}).get("subsystems") or {}
    rows = []
    for name, sub in sorted(subs.items()):
        breaker = sub.get("breaker") or "not reported"
        ack = "; ".join(f"until {iso(a['expires_at'])}: {a['reason']}" for a in acks.get(name, []))
        if sub.get("acknowledged_until"):
            held = f"on the router until {iso(sub['acknowledged_until'])}"
            ack = f"{ack}; {held}" if ack else held
        fence = esc(sub.get("reason")) if sub.get("health") == "fenced" else "-"
        rows.append(
            f'<tr data-subsystem="{esc(name)}"><td>{esc(name)}</td>'
            f'<td><span class="health h-{esc(sub.get("health"))}">{esc(sub.get("health"))}</span>'
            f"</td><td>{esc(sub.get('reason') or '')}</td><td>{esc(breaker)}</td>"
            f'<td class="acked">{esc(ack) or "-"}</td><td>{fence}</td>'
            f"<td>{esc(counts.get(name, 0))}</td></tr>"
        )
    restore = report.get("restore")
    pending = "restore_pending" in report_conditions(report)
    journal = report.get("journal") or {}
    open_txn = journal.get("open")
    notes = [
        f"<p>Restore: {'PENDING' if pending else 'none pending'}"
        + (f" ({esc(json.dumps(restore, sort_keys=True))})" if isinstance(restore, dict) else "")
        + "</p>",
        f"<p>Open transaction: {esc(json.dumps(open_txn, sort_keys=True)) if open_txn else 'none'}"
        "</p>",
    ]
    return (
        '<h2>Subsystems</h2><table class="subs"><thead><tr><th>Subsystem</th><th>Health</th>'
        "<th>Reason</th><th>Breaker</th><th>Acknowledged</th><th>Fence</th><th>Differences</th>"
        f"</tr></thead><tbody>{''.join(rows)}</tbody></table>{''.join(notes)}"
    )


def _drift_history(page: DevicePage) -> str:
    head = "<h2>Drift history</h2>"
    if not page.drift:
        return head + '<p class="muted" id="drift-none">no drift reported</p>'
    rows = []
    for r in page.drift:
        healed = r.get("healed_at")
        healer = r.get("healed_by") or {}
        if healed:
            state = f"healed {esc(iso(healed))}"
            by = (
                f"{esc(healer.get('by'))} {esc(healer.get('action'))} "
                f"<code>{esc(healer.get('txn') or '')}</code>"
                if healer
                else "in sync again (not trueup's heal)"
            )
        else:
            state, by = "<b>ongoing</b>", "-"
        paths = "".join(f"<li><code>{esc(p)}</code></li>" for p in (r.get("paths") or [])[:10])
        changed = "".join(f"<li>{esc(w)}</li>" for w in r.get("changed_by") or [])
        rows.append(
            f'<tr class="drift-record" data-drift-subsystem="{esc(r.get("subsystem"))}" '
            f'data-state="{"healed" if healed else "ongoing"}">'
            f"<td>{esc(r.get('subsystem'))}</td><td>{esc(iso(r.get('since')))}</td>"
            f"<td>{state}</td><td><ul>{paths}</ul></td>"
            f'<td class="changed-by"><ul>{changed or "<li>not known</li>"}</ul></td>'
            f'<td class="healed-by">{by}</td></tr>'
        )
    return (
        head + '<table class="drift"><thead><tr><th>Subsystem</th><th>Seen</th><th>State</th>'
        "<th>Paths</th><th>Changed by</th><th>Healed by</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _agent_acks(page: DevicePage) -> str:
    head = "<h2>Acknowledged on the router</h2>"
    if not page.agent_acks:
        return head + '<p class="muted" id="agent-acks-none">none (<code>trueup ack</code>)</p>'
    items = []
    for a in page.agent_acks:
        state = a.get("state") or "active"
        if state == "active":
            when = f"healing held until {esc(iso(a.get('until')))}"
        else:
            at = a.get("ended_at") or a.get("until")
            when = f"{esc(state)} {esc(iso(at))} (was held until {esc(iso(a.get('until')))})"
        items.append(
            f'<li class="agent-ack" data-subsystem="{esc(a.get("subsystem"))}" '
            f'data-state="{esc(state)}">{esc(a.get("subsystem"))}: {when} — '
            f"{esc(a.get('reason'))} (by {esc(a.get('by'))}, set {esc(iso(a.get('at')))})</li>"
        )
    return head + f'<ul class="agent-acks">{"".join(items)}</ul>'


def live_parts(page: DevicePage) -> dict[str, str]:
    """The page's parts that follow the device: element id → its HTML."""
    events = timeline_events(page.reports, page.revisions, page.drift, page.now)
    return {
        "live-summary": _summary(page),
        "live-findings": _findings(page.report) + _side_by_side(differences(page.report), page),
        "live-subsystems": limitations_section(page.report) + _subsystems(page),
        "live-drift": _drift_history(page),
        "live-agent-acks": _agent_acks(page),
        "live-timeline": f"<h2>Timeline</h2>{timeline_svg(events, page.now)}",
    }


def _live(part: str, html: str) -> str:
    return f'<div id="{part}" class="live-part">{html}</div>'


def _ack_form(page: DevicePage, device: str) -> str:
    acks = page.entry.get("acknowledgements") or []
    listed = "".join(
        f'<li class="ack-entry">{esc(a["subsystem"])}: acknowledged until '
        f'<time datetime="{iso(a["expires_at"])}">{iso(a["expires_at"])}</time> — {esc(a["reason"])}'
        "</li>"
        for a in acks
    )
    out = "<h2>Acknowledgements</h2>" + (
        f'<ul id="acks">{listed}</ul>' if listed else '<p class="muted" id="acks">none active</p>'
    )
    if not _may(page.principal, Role.OPERATOR):
        return out
    subsystems = sorted(((page.report or {}).get("subsystems") or {}).keys()) or ["management"]
    options = "".join(f'<option value="{esc(s)}">{esc(s)}</option>' for s in subsystems)
    durations = "".join(f'<option value="{v}">{label}</option>' for v, label in ACK_CHOICES)
    return out + (
        f'<form method="post" action="/ui/devices/{quote(device)}/ack" class="ack-form">'
        f'<input type="hidden" name="csrf" value="{esc(page.csrf)}">'
        f'<label>Subsystem <select name="subsystem">{options}</select></label>'
        f'<label>For <select name="for_seconds">{durations}</select></label>'
        '<label>Reason <input name="reason" required placeholder="why this state is acceptable">'
        '</label><button type="submit">Acknowledge</button></form>'
    )


def _evidence_section(page: DevicePage, device: str) -> str:
    from trueup.server.dashboard.evidence import render_evidence_section

    listed = page.evidence
    may_request = _may(page.principal, Role.OPERATOR)
    return render_evidence_section(device, listed, page.csrf if may_request else None)


def _may(principal: Principal, role: Role) -> bool:
    return principal.role is not None and role_at_least(principal.role, role)


def _apply_form(page: DevicePage, device: str) -> str:
    current = page.desired["version"] if page.desired else 0
    conflict = ""
    if page.conflict:
        c = page.conflict
        conflict = (
            '<div class="conflict" role="alert"><b>409 Conflict: '
            f"{esc(c['reason'])}</b><p>{esc(c['detail'])}</p>"
            f"<p>You expected version {c['expected_version']}; the device is at version "
            f"{c['current_version']}. {esc(c['action'])}</p>"
            "<p>Review revision history below; submitting again now replaces version "
            f"{c['current_version']}.</p></div>"
        )
    if not _may(page.principal, Role.OPERATOR):
        return (
            '<h2>Apply a revision</h2><p class="muted" id="apply-denied">Your role '
            f"({esc(page.principal.role)}) may view this device but not apply or acknowledge; "
            "that needs an operator token.</p>"
        )
    draft = page.draft
    if draft is None:
        draft = document_text(page.desired["document"]) if page.desired else ""
    expected = (
        page.conflict["current_version"]
        if page.conflict
        else (page.expected if page.expected is not None else current)
    )
    return (
        f"<h2>Apply a revision</h2>{conflict}"
        f'<form method="post" action="/ui/devices/{quote(device)}/apply" class="apply-form">'
        f'<input type="hidden" name="csrf" value="{esc(page.csrf)}">'
        f'<label>Expected version (If-Match) <input type="number" name="expected" min="0" '
        f'value="{expected}"></label>'
        '<label>Comment <input name="comment" placeholder="why"></label>'
        f'<textarea name="document" rows="18" spellcheck="false">{esc(draft)}</textarea>'
        '<button type="submit">Apply as next revision</button></form>'
    )


def _revisions(page: DevicePage, device: str) -> str:
    if not page.revisions:
        return '<h2>Revisions</h2><p class="muted">no revision yet</p>'
    rows = []
    versions = [r["version"] for r in page.revisions]
    a_default = versions[1] if len(versions) > 1 else versions[0]
    for r in page.revisions:
        v = r["version"]
        rows.append(
            f'<tr><td><input type="radio" name="a" value="{v}"{" checked" if v == a_default else ""}'
            f' aria-label="from {v}"></td><td><input type="radio" name="b" value="{v}"'
            f'{" checked" if v == versions[0] else ""} aria-label="to {v}"></td>'
            f"<td>v{v}</td><td>{esc(iso(r['created_at']))}</td><td>{esc(r['author'])}</td>"
            f"<td>{esc(r['comment'])}</td><td><code>{esc(short_digest(r['content_hash']))}</code>"
            "</td></tr>"
        )
    diff = ""
    if page.diff is not None:
        a, b, text = page.diff
        lines = []
        for line in text.splitlines():
            cls = "add" if line.startswith("+") else "del" if line.startswith("-") else ""
            lines.append(f'<span class="{cls}">{esc(line)}</span>')
        body = "\n".join(lines) or "(identical documents)"
        diff = f'<h3>Diff v{a} → v{b}</h3><pre class="diff" id="revision-diff">{body}</pre>'
    return (
        "<h2>Revisions</h2>"
        f'<form method="get" action="/ui/devices/{quote(device)}#revisions" id="revisions">'
        '<table class="revs"><thead><tr><th>from</th><th>to</th><th>Version</th><th>Created</th>'
        f"<th>Author</th><th>Comment</th><th>Digest</th></tr></thead><tbody>{''.join(rows)}"
        '</tbody></table><button type="submit">Diff selected</button></form>'
        f"{diff}"
    )


def _audit(page: DevicePage) -> str:
    if page.audit is None:
        return '<h2>Audit trail</h2><p class="muted">The audit log needs an admin token.</p>'
    if not page.audit:
        return '<h2>Audit trail</h2><p class="muted">no entry</p>'
    rows = "".join(
        f"<tr><td>{e['seq']}</td><td>{esc(iso(e['at']))}</td><td>{esc(e['actor'])}</td>"
        f"<td>{esc(e['action'])}</td><td><code>{esc(json.dumps(e['detail'], sort_keys=True))}"
        f"</code></td><td><code>{esc(e['row_hash'][:12])}</code></td></tr>"
        for e in page.audit
    )
    return (
        '<h2>Audit trail</h2><table class="audit"><thead><tr><th>#</th><th>At</th><th>Actor</th>'
        f"<th>Action</th><th>Detail</th><th>Hash</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def render_device(page: DevicePage) -> str:
    device = page.entry["device"]
    banner = ""
    if page.notice:
        banner += f'<p class="notice" role="status">{esc(page.notice)}</p>'
    if page.error:
        banner += f'<p class="error" role="alert">{esc(page.error)}</p>'
    live = live_parts(page)
    desired_doc = (
        f"<details><summary>Desired document (v{page.desired['version']})</summary>"
        f"<pre>{esc(document_text(page.desired['document']))}</pre></details>"
        if page.desired
        else ""
    )
    stream = f"/ui/devices/{quote(device)}/stream"
    return (
        f'<p><a href="/">← fleet</a> · <span id="live" class="live">live</span></p>'
        f'<h1 id="device-live" data-stream="{esc(stream)}">{esc(device)}</h1>{banner}'
        f"{_live('live-summary', live['live-summary'])}"
        f"{_evidence_section(page, device)}"
        f"{_live('live-findings', live['live-findings'])}{desired_doc}"
        f"{_live('live-subsystems', live['live-subsystems'])}"
        f"{_live('live-drift', live['live-drift'])}"
        f"{_live('live-timeline', live['live-timeline'])}"
        f"{_live('live-agent-acks', live['live-agent-acks'])}"
        f"{_ack_form(page, device)}{_apply_form(page, device)}{_revisions(page, device)}"
        f"{_audit(page)}"
    )
