"""HTML of the rollout pages: the list, one rollout and its live parts (plain strings like
html.py, every value escaped with `esc`; the controls only for operators)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

from trueup.server.dashboard.fleethtml import error_box, hidden_field
from trueup.server.dashboard.html import esc

__all__ = ["SHOWN_MEMBERS", "rollout_live", "rollout_page", "rollouts_page"]

SHOWN_MEMBERS = 500  # devices listed on a rollout's page
# the operators' actions each state allows
_ACTIONS = {
    "running": ("pause", "abort"),
    "paused": ("resume", "abort"),
    "waiting-approval": ("approve", "pause", "abort"),
}


def _wave_what(wave: Mapping[str, Any]) -> str:
    parts = []
    if wave.get("devices"):
        parts.append("devices " + ", ".join(str(d) for d in wave["devices"]))
    if wave.get("selector") is not None:
        parts.append(f"selector {wave['selector']}")
    if wave.get("percent") is not None:
        parts.append(f"{wave['percent']} % of the rest")
    if wave.get("approval"):
        parts.append("after an approval")
    return esc("; ".join(parts))


def rollouts_page(entries: Sequence[Mapping[str, Any]]) -> str:
    rows = "".join(
        f'<tr><td><a href="/ui/rollouts/{int(e["id"])}">rollout {int(e["id"])}</a></td>'
        f'<td><span class="state r-{esc(e["state"])}">{esc(e["state"])}</span></td>'
        f"<td>{int(e['current_wave']) + 1} of {len(e['spec'].get('waves', []))}</td>"
        f"<td>{esc(e['created_by'])}</td><td>{esc(e['created_at'])}</td>"
        f"<td>{esc(e['comment'])}</td><td>{esc(e['reason'] or '')}</td></tr>"
        for e in entries
    )
    if not rows:
        rows = '<tr><td colspan="7" class="muted">no rollout yet</td></tr>'
    return (
        f"<h1>Rollouts</h1>"
        "<table><thead><tr><th>Rollout</th><th>State</th><th>Wave</th><th>By</th><th>Started</th>"
        f"<th>Comment</th><th>Reason</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def _gates(gates: Mapping[str, Any] | None) -> str:
    """Each gate marked passed, failed or not yet, in words too (never by colour alone)."""
    if not gates:
        return '<span class="muted">-</span>'
    words = {True: ("ok", "passed"), False: ("no", "failed"), None: ("wait", "not yet")}
    marks = " ".join(
        f'<span class="gate {words[v][0]}">{esc(k)}</span><span class="vh"> {words[v][1]}</span>'
        for k, v in (gates.get("checks") or {}).items()
    )
    return f"<b>{esc(gates.get('verdict'))}</b> {marks}"


def rollout_live(view: Mapping[str, Any], *, csrf: str, operator: bool) -> dict[str, str]:
    """The rollout page's parts that follow the rollout, by element id (sent by the stream
    whenever one changes: nothing in them depends on the clock)."""
    rid = int(view["id"])
    spec = view["spec"]
    state = str(view["state"])
    summary = (
        f'<dt>State</dt><dd><span class="state r-{esc(state)}">{esc(state)}</span></dd>'
        f"<dt>Wave</dt><dd>{int(view['current_wave']) + 1} of {len(view['waves'])}</dd>"
        f"<dt>Max unavailable</dt><dd>{esc(spec.get('max_unavailable'))}</dd>"
        f"<dt>Soak</dt><dd>{esc(spec.get('soak_seconds', 0))} s</dd>"
        f"<dt>Failure budget</dt><dd>{esc(spec.get('failure_budget', 0))} per wave</dd>"
        f"<dt>Confirm within</dt><dd>{esc(spec.get('confirm_within') or '-')}</dd>"
        f"<dt>Reason</dt><dd>{esc(view.get('reason') or '-')}</dd>"
        f"<dt>Finished</dt><dd>{esc(view.get('finished_at') or '-')}</dd>"
    )
    waves = "".join(
        f'<tr data-wave="{int(w["index"])}"><td>{int(w["index"]) + 1}</td>'
        f"<td>{_wave_what(w)}</td><td>{esc(w['state'])}</td><td>{int(w['members'])}</td>"
        "<td>"
        + ", ".join(f"{esc(k)} {int(n)}" for k, n in sorted(w["counts"].items()))
        + "</td></tr>"
        for w in view["waves"]
    )
    # The devices that need a look first (failed, then sent), then the rest, at most
    # SHOWN_MEMBERS of them: a page (and each update of it) stays small for a large fleet.
    ordered = sorted(
        view["members"], key=lambda m: {"failed": 0, "sent": 1}.get(str(m["state"]), 2)
    )
    shown, hidden = ordered[:SHOWN_MEMBERS], max(0, len(ordered) - SHOWN_MEMBERS)
    members = "".join(
        f'<tr data-device="{esc(m["device"])}" data-state="{esc(m["state"])}">'
        f'<td><a href="/ui/devices/{quote(str(m["device"]))}">{esc(m["device"])}</a></td>'
        f"<td>{int(m['wave']) + 1}</td><td>{esc(m['state'])}</td>"
        f"<td>v{esc(m['from_version'])} → "
        f"{'v' + esc(m['sent_version']) if m['sent_version'] is not None else '-'}"
        f"{' → v' + esc(m['reverted_version']) + ' (put back)' if m.get('reverted_version') else ''}"
        "</td>"
        f"<td>{_gates(m.get('gates'))}</td>"
        f"<td>{esc(m['reason'] or (m.get('gates') or {}).get('reason') or '')}</td></tr>"
        for m in shown
    )
    if hidden:
        members += (
            f'<tr><td colspan="6" class="muted">and {hidden} more devices (all of them: '
            f"<code>trueup fleet rollout status {rid} -o json</code>)</td></tr>"
        )
    controls = ""
    if operator:
        for action in _ACTIONS.get(state, ()):
            reason = (
                f'<label for="reason-{action}">Reason</label>'
                f'<input id="reason-{action}" name="reason" maxlength="500">'
                if action in ("pause", "abort")
                else ""
            )
            controls += (
                f'<form method="post" action="/ui/rollouts/{rid}/actions/{action}" class="inline action">'
                f"{hidden_field('csrf', csrf)}{reason}"
                f'<button type="submit" class="{action}">{action.capitalize()}</button></form> '
            )
    elif state in _ACTIONS:
        controls = (
            '<span class="muted">pausing, approving or aborting needs the operator role</span>'
        )
    return {
        "rollout-summary": summary,
        "rollout-waves": waves,
        "rollout-members": members,
        "rollout-controls": controls or '<span class="muted">finished</span>',
    }


def rollout_page(
    view: Mapping[str, Any], *, csrf: str, operator: bool, error: str = "", notice: str = ""
) -> str:
    rid = int(view["id"])
    parts = rollout_live(view, csrf=csrf, operator=operator)
    ok = f'<p class="notice" role="status">{esc(notice)}</p>' if notice else ""
    return (
        f"<h1>Rollout {rid}</h1>{ok}{error_box(error)}"
        f'<p class="muted">{esc(view["comment"]) + " · " if view.get("comment") else ""}started by '
        f"{esc(view['created_by'])} at {esc(view['created_at'])}"
        ' · <span id="live" class="live">live</span></p>'
        f'<div id="rollout-live" data-stream="/ui/rollouts/{rid}/stream">'
        f'<dl class="summary" id="rollout-summary" aria-live="polite">{parts["rollout-summary"]}'
        f'</dl><div id="rollout-controls" class="controls">{parts["rollout-controls"]}</div>'
        "<h2>Waves</h2><table><thead><tr><th>Wave</th><th>Devices</th><th>State</th>"
        f'<th>Members</th><th>By state</th></tr></thead><tbody id="rollout-waves" '
        f'aria-live="polite">{parts["rollout-waves"]}</tbody></table>'
        "<h2>Devices</h2><table><thead><tr><th>Device</th><th>Wave</th><th>State</th>"
        "<th>Version</th><th>Gates</th><th>Reason</th></tr></thead>"
        f'<tbody id="rollout-members" aria-live="polite">{parts["rollout-members"]}</tbody>'
        "</table></div>"
    )
