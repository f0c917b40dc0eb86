"""The dashboard's rollout routes: the list, one rollout with its live stream (the
`_live` server-sent events of routes.py: a rollout that does not change sends nothing
new), starting one from the plan page's form (a proposed profile edit is stored first,
with its If-Match version), and pause, resume, approve, abort.

Registered by routes.register with its session helpers like fleetroutes.py: viewers
read, operators (with the form's CSRF token) act; a rollout of another tenant is 404.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from trueup.server.api.context import Api
from trueup.server.dashboard.fleetforms import (
    change_name,
    comment_of,
    decoded,
    expected_of,
    is_operator,
    plan_for,
    problems_of,
    rollout_form,
    rollout_id_of,
    rollout_spec,
)
from trueup.server.dashboard.fleethtml import plan_page
from trueup.server.dashboard.html import layout
from trueup.server.dashboard.rollouthtml import rollout_live, rollout_page, rollouts_page
from trueup.server.service import Busy, Conflict, Invalid, NotFound, WrongState
from trueup.server.service.planio import checked_selector, unseen

__all__ = ["ROLLOUT_STREAM_SECONDS", "register"]

ROLLOUT_STREAM_SECONDS = 1.0  # how often a rollout page's stream looks for changes
_ACTIONS = ("pause", "resume", "approve", "abort")


def register(
    app: FastAPI,
    api: Api,
    *,
    caller: Callable[..., Any],
    posted: Callable[..., Any],
    guarded: Callable[[Request, str, Any], Awaitable[Response]],
    live: Callable[..., Response],
    principal_of: Callable[[Any], Awaitable[Any]],
    html: Callable[[str, int], HTMLResponse],
    session_role: dict[str, Any],
    document_role: dict[str, Any],
    headers: dict[str, str],
) -> None:
    plane = api.plane

    def redirect(to: str) -> Response:
        return RedirectResponse(to, status_code=303, headers=headers)

    plan_view = partial(plan_for, plane)

    # -- rollouts -------------------------------------------------------------------------------

    @app.post("/ui/rollouts", include_in_schema=False, openapi_extra=document_role)
    async def start_rollout(request: Request) -> Response:
        async def work() -> Response:
            principal, session, form = await posted(request, "operator")
            wanted = rollout_form(form)

            def attempt() -> tuple[int, str]:
                stored = ""
                try:
                    spec = rollout_spec(wanted)
                    reason = comment_of(form, "reason")
                    text = form.get("document", "")
                    if text.strip():
                        data = decoded(text)
                        name = change_name(data)
                        version = plane.put_profile(
                            principal.tenant_id,
                            name,
                            expected_of(form),
                            data,
                            actor=principal.actor,
                            comment=comment_of(form) or reason,
                        ).version
                        stored = f"profile {name} stored as version {version}; "
                    plan = plane.plan(
                        principal.tenant_id, selector=checked_selector(form.get("selector", ""))
                    )
                    unseen(plan, form.get("plan_digest") or None)
                    started = plane.start_rollout(
                        principal.tenant_id,
                        plan,
                        actor=principal.actor,
                        comment=reason or comment_of(form),
                        **spec,
                    )
                except (Conflict, Busy, WrongState, Invalid) as exc:
                    status = 422 if isinstance(exc, Invalid) else 409
                    why = problems_of(exc) if isinstance(exc, Invalid) else str(exc)
                    after = f"{stored}no rollout was started: " if stored else "nothing changed: "
                    form_now = {**form, "document": ""} if stored else form
                    try:
                        view = plan_view(principal, form_now)
                    except Invalid:
                        view = plan_view(principal, {"selector": ""})
                    body = plan_page(
                        view, csrf=session.csrf, operator=True, form=wanted, error=after + why
                    )
                    return status, body
                return 303, f"/ui/rollouts/{int(started['id'])}?started=1"

            status, out = await run_in_threadpool(attempt)
            if status == 303:
                return redirect(out)
            return html(layout("Plan", out, principal, session.csrf), status)

        return await guarded(request, "operator", work)

    @app.get("/ui/rollouts", include_in_schema=False, openapi_extra=session_role)
    async def rollouts(request: Request) -> Response:
        async def work() -> Response:
            principal, session = await caller(request)
            entries = await run_in_threadpool(plane.rollouts, principal.tenant_id)
            return html(layout("Rollouts", rollouts_page(entries), principal, session.csrf), 200)

        return await guarded(request, "viewer", work)

    @app.get("/ui/rollouts/{rid}", include_in_schema=False, openapi_extra=session_role)
    async def rollout(request: Request, rid: str) -> Response:
        async def work() -> Response:
            principal, session = await caller(request)
            view = await run_in_threadpool(plane.rollout, principal.tenant_id, rollout_id_of(rid))
            q = request.query_params
            notice = "rollout started" if q.get("started") else ""
            if q.get("done") in _ACTIONS:
                notice = f"{q.get('done')}: done"
            body = rollout_page(
                view, csrf=session.csrf, operator=is_operator(principal), notice=notice
            )
            return html(layout(f"Rollout {rid}", body, principal, session.csrf), 200)

        return await guarded(request, "viewer", work)

    @app.get("/ui/rollouts/{rid}/stream", include_in_schema=False, openapi_extra=session_role)
    async def rollout_stream(request: Request, rid: str) -> Response:
        """The rollout page's live parts (`rollout_live`), sent when they change."""

        async def work() -> Response:
            principal, session = await caller(request)
            rollout_id = rollout_id_of(rid)
            # Not found outside the caller's tenant: answered before the stream starts.
            await run_in_threadpool(plane.rollout, principal.tenant_id, rollout_id)

            async def look() -> str | None:
                try:
                    view = await run_in_threadpool(plane.rollout, principal.tenant_id, rollout_id)
                except NotFound:
                    return None
                parts = rollout_live(view, csrf=session.csrf, operator=is_operator(principal))
                return json.dumps(parts, sort_keys=True)

            async def signed_in() -> bool:
                return await principal_of(session) is not None

            return live(request, signed_in, "rollout", ROLLOUT_STREAM_SECONDS, look)

        return await guarded(request, "viewer", work)

    @app.post(
        "/ui/rollouts/{rid}/actions/{action}", include_in_schema=False, openapi_extra=session_role
    )
    async def rollout_action(request: Request, rid: str, action: str) -> Response:
        async def work() -> Response:
            if action not in _ACTIONS:
                raise HTTPException(404, detail=f"no rollout action {action!r}")
            principal, session, form = await posted(request, "operator")
            rollout_id = rollout_id_of(rid)

            def attempt() -> tuple[int, str]:
                t, who = principal.tenant_id, principal.actor
                try:
                    reason = comment_of(form, "reason")
                    if action == "pause":
                        plane.pause_rollout(t, rollout_id, actor=who, reason=reason)
                    elif action == "resume":
                        plane.resume_rollout(t, rollout_id, actor=who)
                    elif action == "approve":
                        plane.approve_rollout(t, rollout_id, actor=who)
                    else:
                        plane.abort_rollout(t, rollout_id, actor=who, reason=reason)
                except (WrongState, Invalid) as exc:
                    why = problems_of(exc) if isinstance(exc, Invalid) else str(exc)
                    view = plane.rollout(t, rollout_id)
                    body = rollout_page(view, csrf=session.csrf, operator=True, error=why)
                    return (409 if isinstance(exc, WrongState) else 422), body
                return 303, f"/ui/rollouts/{rollout_id}?done={action}"

            status, out = await run_in_threadpool(attempt)
            if status == 303:
                return redirect(out)
            return html(layout(f"Rollout {rid}", out, principal, session.csrf), status)

        return await guarded(request, "operator", work)
