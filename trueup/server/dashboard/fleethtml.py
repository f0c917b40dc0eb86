"""HTML of the fleet-change pages: profiles and the plan of a change (rollouthtml.py:
the rollouts).

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
from trueup.server.service.planio import plan_digest

__all__ = [
    "EXIT_MEANING",
    "SHOWN_TARGETS",
    "PlanView",
    "ProfileRow",
    "RolloutForm",
    "error_box",
    "hidden_field",
    "plan_page",
    "profile_page",
    "profiles_page",
]

SHOWN_TARGETS = 500  # devices whose paths a plan page lists (every refusal is listed)
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


def _value(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 160 else text[:157] + "…"


def error_box(message: str) -> str:
    return (
        f'<div class="error" role="alert" id="form-error">{esc(message)}</div>' if message else ""
    )


def hidden_field(name: str, value: Any) -> str:
    return f'<input type="hidden" name="{esc(name)}" value="{esc(value)}">'


def _yaml(document: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(document), sort_keys=False, allow_unicode=True)


# -- profiles ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProfileRow:
    """One line of the profiles table."""

    name: str
    version: int
    priority: object  # as the profile's metadata says (a number once validated)
    selector: str
    description: object
    selected: int  # devices the selector selects now


def profiles_page(
    rows: Sequence[ProfileRow],
    *,
    csrf: str,
    operator: bool,
    draft: str = "",
    error: str = "",
) -> str:
    """The tenant's profiles (name, version, priority, selector, devices selected) and a form
    for a new one."""
    body = "".join(
        f'<tr><td><a href="/ui/profiles/{quote(r.name)}">{esc(r.name)}</a></td>'
        f"<td>v{esc(r.version)}</td><td>{esc(r.priority)}</td>"
        f"<td><code>{esc(r.selector or '(every device)')}</code></td>"
        f'<td><a href="/?{urlencode({"selector": r.selector})}">{esc(r.selected)}</a></td>'
        f"<td>{esc(r.description)}</td></tr>"
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
    return f"<h1>Profiles</h1>{table}<h2>New profile</h2>{error_box(error)}{form}"


def _edit_form(
    text: str, *, csrf: str, expected: int, comment: str, operator: bool, new: bool = False
) -> str:
    save = (
        '<button type="submit" name="action" value="save">Save</button>'
        if operator
        else '<span class="muted">saving needs the operator role</span>'
    )
    return (
        '<form method="post" action="/ui/profiles" class="apply-form" id="profile-form">'
        f"{hidden_field('csrf', csrf)}{hidden_field('expected', expected)}"
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
        f'<h2 id="edit">Edit</h2>{error_box(error)}{form}'
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
        f"{hidden_field('csrf', csrf)}{hidden_field('document', view.document)}"
        f"{hidden_field('expected', view.expected)}{hidden_field('comment', view.comment)}"
        f"{hidden_field('selector', view.selector)}"
        f"{hidden_field('plan_digest', plan_digest(view.plan))}"
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
        for t in plan.targets[:SHOWN_TARGETS]
    )
    if len(plan.targets) > SHOWN_TARGETS:
        rows += (
            f'<tr><td colspan="4" class="muted">and {len(plan.targets) - SHOWN_TARGETS} more '
            "devices (all of them: <code>trueup fleet plan -o json</code>)</td></tr>"
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
    return f"<h1>{esc(view.title)}</h1>{filter_form}{error_box(error)}{counts}{changed}{refusals}{action}"
