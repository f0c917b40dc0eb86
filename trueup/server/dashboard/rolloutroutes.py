"""The dashboard's rollout pages: every rollout of the tenant, and one rollout's waves,
gates and live progress per device, with its pause / resume / approve / abort forms.

`register` is called by routes.register with its session helpers (`caller`, `posted`,
`guarded`, `stream`), so these pages check the session, the role and the CSRF token
exactly as the other dashboard pages do. The page follows the rollout over the same
server-sent events the device page uses (`#device-live`, event `device`: the parts
to replace by id), so dashboard.js needs nothing new.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from trueup.server.dashboard.html import esc, layout, short_digest
from trueup.server.inputs import IDENTIFIER
from trueup.server.service import ControlPlane, Invalid, WrongState

__all__ = ["members_table", "register", "rollout_page", "rollouts_page", "waves_table"]

ACTIONS = {
    "pause": ("running", "waiting-approval"),
    "resume": ("paused",),
    "approve": ("waiting-approval",),
    "abort": ("running", "paused", "waiting-approval"),
}


def rollouts_page(rollouts: list[dict[str, Any]]) -> str:
    rows = (
        "".join(
            f'<tr><td><a href="/ui/rollouts/{r["id"]}">{r["id"]}</a></td>'
            f'<td><span class="badge r-{esc(r["state"])}">{esc(r["state"])}</span></td>'
            f"<td>{r['current_wave']}</td><td>{esc(r['created_by'])}</td>"
            f"<td>{esc(r['created_at'])}</td><td>{esc(r.get('comment') or '')}</td>"
            f"<td>{esc(r.get('reason') or '')}</td></tr>"
            for r in rollouts
        )
        or '<tr><td colspan="7" class="muted">no rollout yet</td></tr>'
    )
    return (
        '<h1>Rollouts</h1><p><a href="/">back to the fleet</a></p>'
        '<table class="fleet"><thead><tr><th>Id</th><th>State</th><th>Wave</th>'
        "<th>Started by</th><th>Started at</th><th>Comment</th><th>Reason</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
    )


def waves_table(view: dict[str, Any]) -> str:
    rows = []
    for wave in view["waves"]:
        what = (
            ", ".join(wave["devices"])
            if wave.get("devices")
            else wave.get("selector") or f"{wave.get('percent')} % of the rest"
        )
        counts = ", ".join(f"{n} {s}" for s, n in sorted(wave["counts"].items()))
        rows.append(
            f"<tr><td>{wave['index']}</td><td>{esc(what)}"
            f"{' (approval)' if wave.get('approval') else ''}</td>"
            f"<td>{esc(wave['state'])}</td><td>{wave['members']}</td><td>{esc(counts)}</td></tr>"
        )
    return "".join(rows)


def _gates(member: dict[str, Any]) -> str:
    gates = member.get("gates")
    if not gates:
        return ""
    return " ".join(
        f'<span class="gate {"ok" if ok else "wait" if ok is None else "no"}">{esc(name)}</span>'
        for name, ok in gates["checks"].items()
    )


def members_table(view: dict[str, Any]) -> str:
    rows = []
    for m in view["members"]:
        versions = f"{m['from_version']} → {m['sent_version'] or '-'}"
        if m.get("reverted_version"):
            versions += f" → {m['reverted_version']} (put back)"
        reason = m.get("reason") or (m.get("gates") or {}).get("reason") or ""
        rows.append(
            f'<tr><td><a href="/ui/devices/{esc(m["device"])}">{esc(m["device"])}</a></td>'
            f"<td>{m['wave']}</td><td>{esc(m['state'])}</td><td>{esc(versions)}</td>"
            f"<td>{esc(short_digest(m['digest']))}</td><td>{_gates(m)}</td>"
            f"<td>{esc(reason)}</td></tr>"
        )
    return "".join(rows)


def _state(view: dict[str, Any]) -> str:
    reason = f" — {esc(view['reason'])}" if view.get("reason") else ""
    return f'<span class="badge r-{esc(view["state"])}">{esc(view["state"])}</span>{reason}'


def rollout_page(view: dict[str, Any], csrf: str, error: str = "") -> str:
    rid = view["id"]
    spec = view["spec"]
    forms = "".join(
        f'<form method="post" action="/ui/rollouts/{rid}/{action}" class="inline">'
        f'<input type="hidden" name="csrf" value="{esc(csrf)}">'
        + (
            '<input name="reason" placeholder="reason" aria-label="reason">'
            if action in ("pause", "abort")
            else ""
        )
        + f'<button type="submit">{action.capitalize()}</button></form>'
        for action, states in ACTIONS.items()
        if view["state"] in states
    )
    problem = f'<p class="error" role="alert">{esc(error)}</p>' if error else ""
    return (
        f'<h1>Rollout {rid}</h1><p><a href="/ui/rollouts">all rollouts</a></p>{problem}'
        f'<p id="rollout-state">{_state(view)}</p>'
        f"<p class=muted>started {esc(view['created_at'])} by {esc(view['created_by'])}"
        f"{(': ' + esc(view['comment'])) if view.get('comment') else ''} · max unavailable "
        f"{esc(spec.get('max_unavailable'))} · soak {esc(spec.get('soak_seconds'))} s · "
        f"failure budget {esc(spec.get('failure_budget'))} · confirm within "
        f"{esc(spec.get('confirm_within') or '-')} · gate timeout "
        f"{esc(spec.get('gate_timeout'))} s"
        ' · <span id="live" class="live">live</span></p>'
        f"<div>{forms}</div>"
        f'<div id="device-live" data-stream="/ui/rollouts/{rid}/stream"></div>'
        '<h2>Waves</h2><table class="fleet"><thead><tr><th>Wave</th><th>Devices</th>'
        "<th>State</th><th>Members</th><th>Progress</th></tr></thead>"
        f'<tbody id="rollout-waves">{waves_table(view)}</tbody></table>'
        '<h2>Devices</h2><table class="fleet"><thead><tr><th>Device</th><th>Wave</th>'
        "<th>State</th><th>Versions</th><th>Digest</th><th>Gates</th><th>Reason</th></tr>"
        f'</thead><tbody id="rollout-members">{members_table(view)}</tbody></table>'
    )


def register(
    app: FastAPI,
    plane: ControlPlane,
    *,
    caller: Callable[..., Any],
    posted: Callable[..., Any],
    guarded: Callable[[Request, str, Any], Awaitable[Response]],
    stream: Callable[[Request, Any, Callable[[], Awaitable[str | None]]], Response],
    html: Callable[[str, int], HTMLResponse],
    session_role: dict[str, Any],
    headers: dict[str, str],
) -> None:
    @app.get("/ui/rollouts", include_in_schema=False, openapi_extra=session_role)
    async def rollouts(request: Request) -> Response:
        async def work() -> Response:
            principal, session = await caller(request)
            found = await run_in_threadpool(plane.rollouts, principal.tenant_id)
            return html(layout("Rollouts", rollouts_page(found), principal, session.csrf), 200)

        return await guarded(request, "viewer", work)

    @app.get("/ui/rollouts/{rollout_id}", include_in_schema=False, openapi_extra=session_role)
    async def rollout(request: Request, rollout_id: str) -> Response:
        async def work() -> Response:
            principal, session = await caller(request)
            rid = IDENTIFIER.parse("rollout id", rollout_id)
            view = await run_in_threadpool(plane.rollout, principal.tenant_id, rid)
            body = rollout_page(view, session.csrf)
            return html(layout(f"Rollout {rid}", body, principal, session.csrf), 200)

        return await guarded(request, "viewer", work)

    @app.get(
        "/ui/rollouts/{rollout_id}/stream", include_in_schema=False, openapi_extra=session_role
    )
    async def rollout_stream(request: Request, rollout_id: str) -> Response:
        async def work() -> Response:
            principal, session = await caller(request)
            rid = IDENTIFIER.parse("rollout id", rollout_id)

            async def look() -> str | None:
                view = await run_in_threadpool(plane.rollout, principal.tenant_id, rid)
                return json.dumps(
                    {
                        "rollout-state": _state(view),
                        "rollout-waves": waves_table(view),
                        "rollout-members": members_table(view),
                    }
                )

            return stream(request, session, look)

        return await guarded(request, "viewer", work)

    @app.post(
        "/ui/rollouts/{rollout_id}/{action}", include_in_schema=False, openapi_extra=session_role
    )
    async def act(request: Request, rollout_id: str, action: str) -> Response:
        async def work() -> Response:
            principal, session, form = await posted(request, "operator")
            rid = IDENTIFIER.parse("rollout id", rollout_id)
            if action not in ACTIONS:
                raise HTTPException(404, detail=f"{action!r} is not one of {', '.join(ACTIONS)}")
            reason = form.get("reason", "")[:1000]

            def attempt() -> str:
                try:
                    if action == "pause":
                        plane.pause_rollout(
                            principal.tenant_id, rid, actor=principal.actor, reason=reason
                        )
                    elif action == "resume":
                        plane.resume_rollout(principal.tenant_id, rid, actor=principal.actor)
                    elif action == "approve":
                        plane.approve_rollout(principal.tenant_id, rid, actor=principal.actor)
                    else:
                        plane.abort_rollout(
                            principal.tenant_id, rid, actor=principal.actor, reason=reason
                        )
                except (WrongState, Invalid) as exc:
                    return str(exc)
                return ""

            error = await run_in_threadpool(attempt)
            if not error:
                return RedirectResponse(f"/ui/rollouts/{rid}", status_code=303, headers=headers)
            view = await run_in_threadpool(plane.rollout, principal.tenant_id, rid)
            body = rollout_page(view, session.csrf, error)
            return html(layout(f"Rollout {rid}", body, principal, session.csrf), 409)

        return await guarded(request, "operator", work)
