"""HTML of the fleet-change pages: profiles, the plan of a change, rollouts.

Plain strings like html.py, every value escaped with `esc`. The routes are
fleetroutes.py; this module only turns what the control plane answered into
markup. Forms carry the session's CSRF token; forms that change something
are shown only to operators (the routes check the role again).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

import yaml

from trueup.server.dashboard.html import esc, short_digest
from trueup.server.service.fleettypes import Plan

__all__ = [
    "EXIT_MEANING",
    "PlanView",
    "RolloutForm",
    "plan_page",
    "profile_page",
    "profiles_page",
    "rollout_live",
    "rollout_page",
    "rollouts_page",
]

EXIT_MEANING = {
    0: "0 — no device would change",
    2: "2 — devices would change, none refuses",
    1: "1 — some devices refuse the change (they are never sent it)",
}
NEW_PROFILE = """apiVersion: trueup/v1
kind: Profile
metadata:
  name: new-profile
  priority: 100
  description: ""
spec:
  selector: "site=ams"
  variables: {}
  document: {}
"""
_ACTIONS = {
    "running": ("pause", "abort"),
    "paused": ("resume", "abort"),
    "waiting-approval": ("approve", "pause", "abort"),
}


def _value(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 160 else text[:157] + "…"


def _error(message: str) -> str:
    return (
        f'<div class="error" role="alert" id="form-error">{esc(message)}</div>' if message else ""
    )


def _hidden(name: str, value: Any) -> str:
    return f'<input type="hidden" name="{esc(name)}" value="{esc(value)}">'


def _yaml(document: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(document), sort_keys=False, allow_unicode=True)


# -- profiles ----------------------------------------------------------------------------------


def profiles_page(
    rows: Sequence[Mapping[str, Any]],
    *,
    csrf: str,
    operator: bool,
    draft: str = "",
    error: str = "",
) -> str:
    """The tenant's profiles (name, version, priority, selector, devices selected) and a form
    for a new one."""
    body = "".join(
        f'<tr><td><a href="/ui/profiles/{quote(r["name"])}">{esc(r["name"])}</a></td>'
        f"<td>v{esc(r['version'])}</td><td>{esc(r['priority'])}</td>"
        f"<td><code>{esc(r['selector'] or '(every device)')}</code></td>"
        f'<td><a href="/?{urlencode({"selector": r["selector"]})}">{esc(r["selected"])}</a></td>'
        f"<td>{esc(r['description'])}</td></tr>"
        for r in rows
    )
    if not rows:
        body = '<tr><td colspan="6" class="muted">no profile yet</td></tr>'
    table = (
        '<table class="profiles"><thead><tr><th>Profile</th><th>Version</th><th>Priority</th>'
        f"<th>Selector</th><th>Devices selected</th><th>Description</th></tr></thead>"
        f"<tbody>{body}</tbody></table>"
    )
    form = _edit_form(
        draft or NEW_PROFILE, csrf=csrf, expected=0, comment="", operator=operator, new=True
    )
    return f"<h1>Profiles</h1>{table}<h2>New profile</h2>{_error(error)}{form}"


def _edit_form(
    text: str, *, csrf: str, expected: int, comment: str, operator: bool, new: bool = False
) -> str:
    save = (
        '<button type="submit" name="action" value="save">Save</button>'
        if operator
        else '<span class="muted">saving needs the operator role</span>'
    )
    return (
        '<form method="post" action="/ui/profiles/save" class="apply-form" id="profile-form">'
        f"{_hidden('csrf', csrf)}{_hidden('expected', expected)}"
        f'<label for="profile-document">{"New profile" if new else "Profile document"} '
        "(YAML or JSON)</label>"
        f'<textarea id="profile-document" name="document" rows="22" spellcheck="false">'
        f"{esc(text)}</textarea>"
        f'<label for="profile-comment">Comment</label>'
        f'<input id="profile-comment" name="comment" value="{esc(comment)}" maxlength="500">'
        f'<div>{save} <button type="submit" formaction="/ui/plan" name="action" value="plan">'
        "Plan</button></div></form>"
    )


def _variables_table(variables: Mapping[str, Any]) -> str:
    if not variables:
        return '<p class="muted">no variables</p>'
    rows = []
    for name in sorted(variables):
        spec = variables[name] if isinstance(variables[name], Mapping) else {}
        rest = {
            k: v for k, v in spec.items() if k not in ("type", "default", "required", "description")
        }
        rows.append(
            f"<tr><td><code>{esc(name)}</code></td><td>{esc(spec.get('type', 'string'))}</td>"
            f"<td>{'yes' if spec.get('required') else 'no'}</td>"
            f"<td><code>{esc(_value(spec['default'])) if 'default' in spec else '-'}</code></td>"
            f"<td><code>{esc(_value(rest)) if rest else '-'}</code></td>"
            f"<td>{esc(spec.get('description', ''))}</td></tr>"
        )
    return (
        '<table class="variables"><thead><tr><th>Variable</th><th>Type</th><th>Required</th>'
        "<th>Default</th><th>Rules</th><th>Description</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def profile_page(
    shown: Any,
    history: Sequence[Any],
    selected: Sequence[tuple[str, Mapping[str, str]]],
    *,
    csrf: str,
    operator: bool,
    draft: str | None = None,
    comment: str = "",
    expected: int | None = None,
    error: str = "",
    notice: str = "",
) -> str:
    """One profile: its document, variables schema, versions, the devices it selects, and the
    edit form (the draft and comment kept after a refused save)."""
    document = shown.document
    spec = document.get("spec", {}) if isinstance(document, Mapping) else {}
    meta = document.get("metadata", {}) if isinstance(document, Mapping) else {}
    selector = str(spec.get("selector", ""))
    versions = "".join(
        f"<tr><td>v{esc(v.version)}</td><td>{esc(v.created_by)}</td>"
        f"<td><code>{esc(short_digest(v.digest))}</code></td>"
        f"<td>{'deleted' if v.deleted else ''} {esc(v.comment)}</td></tr>"
        for v in reversed(list(history))
    )
    devices = "".join(
        f'<li><a href="/ui/devices/{quote(name)}">{esc(name)}</a> '
        + " ".join(f"<code>{esc(k)}={esc(labels[k])}</code>" for k in sorted(labels))
        + "</li>"
        for name, labels in selected
    )
    form = _edit_form(
        _yaml(document) if draft is None else draft,
        csrf=csrf,
        expected=shown.version if expected is None else expected,
        comment=comment,
        operator=operator,
    )
    ok = f'<p class="notice" role="status">{esc(notice)}</p>' if notice else ""
    return (
        f"<h1>Profile {esc(shown.name)}</h1>{ok}"
        '<dl class="summary">'
        f"<dt>Version</dt><dd>v{esc(shown.version)} by {esc(shown.created_by)}</dd>"
        f"<dt>Priority</dt><dd>{esc(meta.get('priority', 100))}</dd>"
        f"<dt>Selector</dt><dd><code>{esc(selector or '(every device)')}</code></dd>"
        f"<dt>Description</dt><dd>{esc(meta.get('description', ''))}</dd>"
        f"<dt>Digest</dt><dd><code>{esc(shown.digest)}</code></dd></dl>"
        f'<h2>Devices it selects ({len(selected)})</h2><ul id="profile-devices">'
        f"{devices or '<li class=muted>none</li>'}</ul>"
        f"<h2>Variables</h2>{_variables_table(spec.get('variables') or {})}"
        f"<h2>Document</h2><pre>{esc(_yaml(spec.get('document') or {}))}</pre>"
        "<h2>Versions</h2><table><thead><tr><th>Version</th><th>By</th><th>Digest</th>"
        f"<th>Comment</th></tr></thead><tbody>{versions}</tbody></table>"
        f'<h2 id="edit">Edit</h2>{_error(error)}{form}'
    )


# -- the plan ----------------------------------------------------------------------------------


@dataclass
class RolloutForm:
    """What the roll-out form holds (kept as typed after a refusal)."""

    canary_devices: str = ""
    canary_selector: str = ""
    percents: str = "50, 100"
    max_unavailable: str = "25%"
    soak_seconds: str = "0"
    failure_budget: str = "0"
    confirm_within: str = ""
    approval: bool = False
    reason: str = ""
    extra: dict[str, str] = field(default_factory=dict)


@dataclass
class PlanView:
    plan: Plan
    title: str
    # the proposed profile edit (hidden fields of the roll-out form), or none: stored inputs
    document: str = ""
    expected: int = 0
    comment: str = ""
    selector: str = ""


def _changes(changes: Sequence[Any]) -> str:
    items = "".join(
        f'<li><code class="path">{esc(c.path)}</code>: '
        f"<code>{esc(_value(c.old)) if c.op != 'add' else '(none)'}</code> → "
        f"<code>{esc(_value(c.new)) if c.op != 'remove' else '(removed)'}</code></li>"
        for c in changes
    )
    return f'<ul class="val">{items}</ul>' if items else '<span class="muted">-</span>'


def _rollout_form(view: PlanView, form: RolloutForm, csrf: str) -> str:
    def field_(name: str, label: str, value: str, hint: str = "") -> str:
        described = f' aria-describedby="{name}-hint"' if hint else ""
        tip = f' <small id="{name}-hint" class="muted">{esc(hint)}</small>' if hint else ""
        return (
            f'<label for="ro-{name}">{esc(label)}</label>'
            f'<input id="ro-{name}" name="{name}" value="{esc(value)}"{described}>{tip}'
        )

    return (
        '<form method="post" action="/ui/rollouts" class="apply-form" id="rollout-form">'
        f"{_hidden('csrf', csrf)}{_hidden('document', view.document)}"
        f"{_hidden('expected', view.expected)}{_hidden('comment', view.comment)}"
        f"{_hidden('selector', view.selector)}"
        "<fieldset><legend>Waves</legend>"
        + field_("canary_devices", "Canary devices", form.canary_devices, "names, comma-separated")
        + field_("canary_selector", "Canary selector", form.canary_selector, "e.g. role=canary")
        + field_("percents", "Then percentages of the rest", form.percents, "cumulative")
        + "</fieldset>"
        + field_("max_unavailable", "Max unavailable", form.max_unavailable, "N or N%")
        + field_("soak_seconds", "Soak (seconds)", form.soak_seconds)
        + field_("failure_budget", "Failure budget per wave", form.failure_budget)
        + field_("confirm_within", "Confirm within (seconds)", form.confirm_within, "optional")
        + field_("reason", "Comment", form.reason)
        + '<label><input type="checkbox" name="approval" value="1"'
        + (" checked" if form.approval else "")
        + "> wait for an approval before each wave after the first</label>"
        + '<div><button type="submit">Roll out</button></div></form>'
    )


def plan_page(
    view: PlanView,
    *,
    csrf: str,
    operator: bool,
    form: RolloutForm | None = None,
    error: str = "",
) -> str:
    """The plan: counts, each device's paths old → new, refusals and why, the exit code's
    meaning, and (for operators, when something changes) the roll-out form."""
    plan = view.plan
    rows = "".join(
        f'<tr data-device="{esc(t.device)}"><td><a href="/ui/devices/{quote(t.device)}">'
        f"{esc(t.device)}</a></td><td>v{t.from_version}</td>"
        f"<td><code>{esc(short_digest(t.digest))}</code></td><td>{_changes(t.changes)}</td></tr>"
        for t in plan.targets
    )
    refused = "".join(
        f'<tr class="differs" data-device="{esc(r.device)}"><td>{esc(r.device)}</td>'
        f"<td>{esc(r.kind)}</td><td><ul class=val>"
        + "".join(f"<li>{esc(p)}</li>" for p in r.problems)
        + "</ul></td></tr>"
        for r in plan.refused
    )
    counts = (
        f'<dl class="summary" id="plan-counts"><dt>Changed</dt><dd>{len(plan.targets)}</dd>'
        f"<dt>Refused</dt><dd>{len(plan.refused)}</dd><dt>Unchanged</dt><dd>{plan.unchanged}</dd>"
        f"<dt>Exit code</dt><dd>{esc(EXIT_MEANING[plan.exit_code])} "
        "(as <code>trueup fleet plan</code>)</dd></dl>"
    )
    changed = (
        "<h2>Devices that change</h2><table class=plan><thead><tr><th>Device</th><th>From</th>"
        f"<th>New digest</th><th>Paths (old → new)</th></tr></thead><tbody>{rows}</tbody></table>"
        if rows
        else ""
    )
    refusals = (
        "<h2>Refused</h2><table class=plan><thead><tr><th>Device</th><th>Why</th>"
        f"<th>Problems</th></tr></thead><tbody>{refused}</tbody></table>"
        if refused
        else ""
    )
    filter_form = (
        '<form class="filters" method="get" action="/ui/plan">'
        '<label for="plan-selector">Devices</label>'
        f'<input type="search" id="plan-selector" name="selector" value="{esc(view.selector)}" '
        'placeholder="label selector, e.g. site=ams">'
        '<button type="submit">Plan the stored inputs</button></form>'
        if not view.document
        else ""
    )
    if not plan.targets:
        action = ""
    elif operator:
        action = "<h2>Roll out</h2>" + _rollout_form(view, form or RolloutForm(), csrf)
    else:
        action = '<p class="muted">rolling a change out needs the operator role</p>'
    return (
        f"<h1>{esc(view.title)}</h1>{filter_form}{_error(error)}{counts}{changed}{refusals}{action}"
    )


# -- rollouts ----------------------------------------------------------------------------------


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
    if not gates:
        return '<span class="muted">-</span>'
    checks = gates.get("checks") or {}
    marks = " ".join(
        f'<span class="gate g-{"ok" if v is True else "no" if v is False else "wait"}">'
        f"{esc(k.replace('_', ' '))} {'✓' if v is True else '✗' if v is False else '…'}</span>"
        for k, v in checks.items()
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
    members = "".join(
        f'<tr data-device="{esc(m["device"])}" data-state="{esc(m["state"])}">'
        f'<td><a href="/ui/devices/{quote(str(m["device"]))}">{esc(m["device"])}</a></td>'
        f"<td>{int(m['wave']) + 1}</td><td>{esc(m['state'])}</td>"
        f"<td>v{esc(m['from_version'])} → "
        f"{'v' + esc(m['sent_version']) if m['sent_version'] is not None else '-'}</td>"
        f"<td>{_gates(m.get('gates'))}</td><td>{esc(m['reason'] or '')}</td></tr>"
        for m in view["members"]
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
                f'<form method="post" action="/ui/rollouts/{rid}/{action}" class="inline action">'
                f"{_hidden('csrf', csrf)}{reason}"
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
        f"<h1>Rollout {rid}</h1>{ok}{_error(error)}"
        f'<p class="muted">{esc(view.get("comment") or "")} · started by '
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
