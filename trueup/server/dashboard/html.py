"""HTML building blocks: escaping, the page layout, the login page, the fleet table.

Plain strings, every value escaped with `esc` (no template engine to install;
nothing to build). Pages link only files served from this package.
"""

from __future__ import annotations

import time
from html import escape
from typing import Any
from urllib.parse import quote, urlencode

from trueup.model.reasons import ReasonCode
from trueup.server.api.records import ServiceRecord
from trueup.server.dashboard.data import LABELS, STATUSES, FleetPage, epoch, iso
from trueup.server.service import Principal

__all__ = [
    "ago",
    "esc",
    "fleet_body",
    "fleet_page",
    "last_drift_text",
    "layout",
    "login_page",
    "short_digest",
]


def esc(value: Any) -> str:
    return escape("" if value is None else str(value), quote=True)


def short_digest(digest: str | None) -> str:
    if not digest:
        return "-"
    return digest.removeprefix("sha256:")[:12]


def badge(status: str) -> str:
    return f'<span class="badge s-{esc(status)}">{esc(LABELS.get(status, status))}</span>'


def layout(title: str, body: str, principal: Principal | None = None, csrf: str = "") -> str:
    who = ""
    if principal is not None:
        who = (
            '<nav class="tabs" aria-label="pages"><a href="/">Fleet</a> '
            '<a href="/ui/profiles">Profiles</a> <a href="/ui/plan">Plan</a> '
            '<a href="/ui/rollouts">Rollouts</a></nav>'
            f'<span class="who">{esc(principal.user)} · {esc(principal.role)} · '
            f"tenant {esc(principal.tenant)}</span>"
            f'<form method="post" action="/ui/logout" class="inline">'
            f'<input type="hidden" name="csrf" value="{esc(csrf)}">'
            f'<button type="submit">Log out</button></form>'
        )
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<title>{esc(title)} · trueup</title>"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<link rel="stylesheet" href="/ui/static/dashboard.css">'
        '<script src="/ui/static/dashboard.js" defer></script>'
        "</head><body>"
        f'<header><a href="/" class="brand">trueup</a>{who}</header>'
        f"<main>{body}</main></body></html>"
    )


def login_page(login_csrf: str, error: str = "") -> str:
    """The sign-in form; `login_csrf` is the pre-session token's field (session.LoginTokens)."""
    problem = f'<p class="error" role="alert">{esc(error)}</p>' if error else ""
    body = (
        '<section class="login"><h1>Sign in</h1>'
        "<p>Paste a user token (from <code>trueup server token create</code>). "
        "It is kept in an encrypted, HttpOnly session cookie, never in a page or URL.</p>"
        f"{problem}"
        '<form method="post" action="/ui/login">'
        f'<input type="hidden" name="login_csrf" value="{esc(login_csrf)}">'
        '<label>Token <input type="password" name="token" autocomplete="off" required '
        'autofocus></label><button type="submit">Sign in</button></form></section>'
    )
    return layout("Sign in", body)


def ago(seconds: float) -> str:
    """A time in the past in words: `12 s ago`, `2 min ago`, `3 h ago`, `4 d ago`."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{int(seconds)} s ago"
    if seconds < 3600:
        return f"{int(seconds // 60)} min ago"
    if seconds < 86400:
        return f"{int(seconds // 3600)} h ago"
    return f"{int(seconds // 86400)} d ago"


def last_drift_text(record: ServiceRecord | None, now: float) -> str:
    """`healed 2 min ago (addresses)` or `drifting since … (addresses)`; '' without drift."""
    if not record:
        return ""
    what = esc(record.get("subsystem"))
    if record.get("healed_at"):
        return f"healed {ago(now - epoch(record['healed_at']))} ({what})"
    return f"drifting since {esc(iso(record.get('since')))} ({what})"


def _last_drift_cell(record: ServiceRecord | None, now: float) -> str:
    if not record:
        return '<td class="last-drift" data-state="none">-</td>'
    state = "healed" if record.get("healed_at") else "ongoing"
    who = "; ".join(record.get("changed_by") or []) or "writer unknown"
    healer = record.get("healed_by") or {}
    if healer:
        who += f"; healed by {healer.get('by')} {healer.get('action')} {healer.get('txn') or ''}"
    return (
        f'<td class="last-drift" data-state="{state}" title="{esc(who)}">'
        f"{last_drift_text(record, now)}</td>"
    )


def _labels_cell(labels: Any) -> str:
    if not isinstance(labels, dict) or not labels:
        return '<td class="labels muted">-</td>'
    chips = " ".join(f"<code>{esc(k)}={esc(labels[k])}</code>" for k in sorted(labels))
    return f'<td class="labels">{chips}</td>'


def fleet_row(e: ServiceRecord, now: float | None = None) -> str:
    device = esc(e["device"])
    desired = f"v{e['desired_version']} <code>{esc(short_digest(e['desired_digest']))}</code>"
    applied_version = "-" if e["applied_version"] is None else f"v{e['applied_version']}"
    mismatch = (
        e["applied_version"] != e["desired_version"] or e.get("digest_match") is False
    ) and e["applied_version"] is not None
    applied = (
        f'<span class="{"differs" if mismatch else ""}">{applied_version} '
        f"<code>{esc(short_digest(e['applied_digest']))}</code></span>"
    )
    heartbeat = esc(iso(e["last_report_at"])) or "never"
    if e.get("missed_heartbeats"):
        heartbeat += f' <span class="muted">({e["missed_heartbeats"]} missed)</span>'
    conditions = " ".join(badge(c) for c in e["conditions"][1:])
    codes = " ".join(f'<code class="code">{esc(c)}</code>' for c in e["reason_codes"])
    acks = e.get("acknowledgements") or []
    acked = (
        f' <span class="ack" title="acknowledged">ack {esc(", ".join(a["subsystem"] for a in acks))}'
        "</span>"
        if acks
        else ""
    )
    return (
        f'<tr data-device="{device}" data-status="{esc(e["status"])}">'
        f'<td><a href="/ui/devices/{quote(e["device"])}">{device}</a></td>'
        f"<td>{badge(e['status'])} {conditions}{acked}</td>"
        f"<td>{codes}</td><td>{desired}</td><td>{applied}</td>"
        f"<td>{heartbeat}</td><td>{esc(iso(e['in_sync_since'])) or '-'}</td>"
        f"{_last_drift_cell(e.get('last_drift'), time.time() if now is None else now)}"
        f"{_labels_cell(e.get('labels'))}</tr>"
    )


def fleet_body(page: FleetPage) -> str:
    if not page.rows:
        return '<tr><td colspan="9" class="muted">no device matches</td></tr>'
    now = time.time()
    return "".join(fleet_row(e, now) for e in page.rows)


def _query(**params: Any) -> str:
    return urlencode({k: v for k, v in params.items() if v not in ("", None, 1)})


def fleet_page(
    page: FleetPage,
    *,
    status: str,
    reason: str,
    search: str,
    selector: str = "",
    problems: list[str] | None = None,
) -> str:
    """The fleet table with its filters; with `problems` (unknown filter values in the
    URL) the problems and the filter form instead of a table that would not match them."""
    chips = [
        f'<a class="chip{" on" if not status else ""}" href="/?{_query(reason=reason, q=search, selector=selector)}">'
        f"all <b>{page.total}</b></a>"
    ]
    for s in STATUSES:
        on = " on" if s == status else ""
        chips.append(
            f'<a class="chip{on}" data-count="{s}" href="/?{_query(status=s, reason=reason, q=search, selector=selector)}">'
            f"{badge(s)} <b>{page.counts.get(s, 0)}</b></a>"
        )
    status_options = "".join(
        f'<option value="{s}"{" selected" if s == status else ""}>{esc(LABELS[s])}</option>'
        for s in STATUSES
    )
    reason_options = "".join(
        f'<option value="{c.value}"{" selected" if c.value == reason else ""}>{c.value}</option>'
        for c in ReasonCode
    )
    nav = ""
    if page.pages > 1:
        links = []
        if page.page > 1:
            links.append(
                f'<a href="/?{_query(status=status, reason=reason, q=search, selector=selector, page=page.page - 1)}">'
                "← previous</a>"
            )
        links.append(f"page {page.page} of {page.pages}")
        if page.page < page.pages:
            links.append(
                f'<a href="/?{_query(status=status, reason=reason, q=search, selector=selector, page=page.page + 1)}">'
                "next →</a>"
            )
        nav = f'<nav class="pages">{" · ".join(links)}</nav>'
    stream = "/ui/fleet/stream?" + urlencode(
        {"status": status, "reason": reason, "q": search, "selector": selector, "page": page.page}
    )
    head = (
        f'<h1>Fleet</h1><div class="chips" id="fleet-counts">{"".join(chips)}</div>'
        '<form class="filters" method="get" action="/">'
        f'<input type="search" name="q" value="{esc(search)}" placeholder="search devices" '
        'aria-label="search devices">'
        f'<input type="search" name="selector" value="{esc(selector)}" '
        'placeholder="labels, e.g. site=ams,role in (edge)" aria-label="label selector">'
        f'<select name="status" aria-label="status"><option value="">any status</option>'
        f"{status_options}</select>"
        f'<select name="reason" aria-label="reason code"><option value="">any reason code</option>'
        f"{reason_options}</select>"
        '<button type="submit">Filter</button></form>'
    )
    if problems:
        listed = "".join(f"<li>{esc(p)}</li>" for p in problems)
        return head + (
            '<div class="error" role="alert" id="filter-error"><p>The filter in this URL is not '
            f"valid; no device list is shown for it:</p><ul>{listed}</ul></div>"
        )
    return (
        head + f'<p class="muted"><span id="fleet-matched">{page.matched}</span> of '
        f"{page.total} devices"
        + (
            f' · <a href="/ui/plan?{urlencode({"selector": selector})}">plan these devices</a>'
            if selector
            else ""
        )
        + ' · <span id="live" class="live">live</span></p>'
        '<table class="fleet"><thead><tr><th>Device</th><th>Status</th><th>Reason codes</th>'
        "<th>Desired</th><th>Applied</th><th>Last heartbeat</th><th>In sync since</th>"
        "<th>Last drift</th><th>Labels</th></tr>"
        f'</thead><tbody id="fleet-body" data-stream="{esc(stream)}">{fleet_body(page)}</tbody>'
        f"</table>{nav}"
    )
