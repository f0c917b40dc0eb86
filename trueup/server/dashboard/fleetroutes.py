"""The dashboard's fleet-change routes for profiles (list, one profile, its edit form) and
the plan of a proposed edit or of the stored inputs; rolloutroutes.py has the rollouts.

`register` is called by routes.register with its session helpers (`caller`,
`posted`, `guarded`, `live`), so these routes check the session, the role and
the CSRF token exactly as the other dashboard routes do: viewers read and plan
(planning stores nothing), operators save profiles and drive rollouts. Every
read goes through the control plane with the caller's tenant. Each change is
the service call the JSON API makes (audited there).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any
from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from trueup.model.decode import DecodeError, decode_yaml
from trueup.model.layering import parse_selector
from trueup.server.api.context import Api
from trueup.server.dashboard.fleetforms import (
    comment_of,
    decoded,
    expected_of,
    is_operator,
    plan_for,
    problems_of,
)
from trueup.server.dashboard.fleethtml import PlanView, plan_page, profile_page, profiles_page
from trueup.server.dashboard.html import layout
from trueup.server.limits import DOCUMENT_BYTES
from trueup.server.service import Conflict, Invalid, NotFound, Principal

__all__ = ["register"]


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

    # -- profiles -------------------------------------------------------------------------------

    def profile_rows(tenant_id: int) -> list[dict[str, Any]]:
        rows = []
        for v in plane.profile_list(tenant_id):
            meta, spec = v.document.get("metadata", {}), v.document.get("spec", {})
            selector = str(spec.get("selector", ""))
            rows.append(
                {
                    "name": v.name,
                    "version": v.version,
                    "priority": meta.get("priority", 100),
                    "selector": selector,
                    "description": meta.get("description", ""),
                    "selected": len(plane.devices_matching(tenant_id, parse_selector(selector))),
                }
            )
        return rows

    def profile_html(principal: Principal, csrf: str, name: str, **extra: Any) -> str:
        shown = plane.profile(principal.tenant_id, name)
        history = plane.profile_history(principal.tenant_id, name)
        selector = parse_selector(str(shown.document.get("spec", {}).get("selector", "")))
        selected = [
            (n, labels) for _id, n, labels in plane.devices_matching(principal.tenant_id, selector)
        ]
        return profile_page(
            shown, history, selected, csrf=csrf, operator=is_operator(principal), **extra
        )

    def edit_refused(principal: Principal, csrf: str, form: dict[str, str], error: str) -> str:
        """The page the edit form came from, with the error and the draft kept."""
        text, comment = form.get("document", ""), form.get("comment", "")
        name = form.get("name", "")
        try:
            data = decode_yaml(text, max_bytes=DOCUMENT_BYTES)
            found = data.get("metadata", {}).get("name") if isinstance(data, dict) else None
            name = found if isinstance(found, str) else name
        except DecodeError:
            pass
        expected = form.get("expected", "0")
        if name and expected not in ("", "0"):
            try:
                return profile_html(
                    principal,
                    csrf,
                    name,
                    draft=text,
                    comment=comment,
                    expected=int(expected) if expected.isdigit() else None,
                    error=error,
                )
            except NotFound:
                pass
        return profiles_page(
            profile_rows(principal.tenant_id),
            csrf=csrf,
            operator=is_operator(principal),
            draft=text,
            error=error,
        )

    @app.get("/ui/profiles", include_in_schema=False, openapi_extra=session_role)
    async def profiles(request: Request) -> Response:
        async def work() -> Response:
            principal, session = await caller(request)
            rows = await run_in_threadpool(profile_rows, principal.tenant_id)
            body = profiles_page(rows, csrf=session.csrf, operator=is_operator(principal))
            return html(layout("Profiles", body, principal, session.csrf), 200)

        return await guarded(request, "viewer", work)

    @app.get("/ui/profiles/{name}", include_in_schema=False, openapi_extra=session_role)
    async def profile(request: Request, name: str) -> Response:
        async def work() -> Response:
            principal, session = await caller(request)
            saved = request.query_params.get("saved", "")
            notice = (
                f"version {saved} stored; no device changes until it is rolled out"
                if (saved.isdigit())
                else ""
            )
            body = await run_in_threadpool(
                lambda: profile_html(principal, session.csrf, name, notice=notice)
            )
            return html(layout(f"Profile {name}", body, principal, session.csrf), 200)

        return await guarded(request, "viewer", work)

    @app.post("/ui/profiles", include_in_schema=False, openapi_extra=document_role)
    async def save_profile(request: Request) -> Response:
        async def work() -> Response:
            principal, session, form = await posted(request, "operator")

            def attempt() -> tuple[int, str]:
                try:
                    data = decoded(form.get("document", ""))
                    name = data.get("metadata", {}).get("name") if isinstance(data, dict) else None
                    if not isinstance(name, str):
                        raise Invalid(["metadata.name: a profile names itself (a DNS label)"])
                    stored = plane.put_profile(
                        principal.tenant_id,
                        name,
                        expected_of(form),
                        data,
                        actor=principal.actor,
                        comment=comment_of(form),
                    )
                except Conflict as exc:
                    return 409, edit_refused(principal, session.csrf, form, str(exc))
                except (Invalid, NotFound) as exc:
                    message = problems_of(exc) if isinstance(exc, Invalid) else str(exc)
                    return 422, edit_refused(
                        principal, session.csrf, form, "not saved, nothing was changed: " + message
                    )
                return 303, f"/ui/profiles/{quote(stored.name)}?saved={stored.version}"

            status, out = await run_in_threadpool(attempt)
            if status == 303:
                return redirect(out)
            return html(layout("Profiles", out, principal, session.csrf), status)

        return await guarded(request, "operator", work)

    # -- the plan -------------------------------------------------------------------------------

    plan_view = partial(plan_for, plane)

    @app.get("/ui/plan", include_in_schema=False, openapi_extra=session_role)
    async def plan_stored(request: Request) -> Response:
        async def work() -> Response:
            principal, session = await caller(request)
            form = {"selector": request.query_params.get("selector", "")}

            def build() -> tuple[int, str]:
                try:
                    view = plan_view(principal, form)
                except Invalid as exc:
                    empty = PlanView(plane.plan(principal.tenant_id), "Plan", selector="")
                    return 422, plan_page(
                        empty, csrf=session.csrf, operator=False, error=problems_of(exc)
                    )
                return 200, plan_page(view, csrf=session.csrf, operator=is_operator(principal))

            status, body = await run_in_threadpool(build)
            return html(layout("Plan", body, principal, session.csrf), status)

        return await guarded(request, "viewer", work)

    @app.post("/ui/plan", include_in_schema=False, openapi_extra=document_role)
    async def plan_edit(request: Request) -> Response:
        async def work() -> Response:
            principal, session, form = await posted(request, "viewer")

            def build() -> tuple[int, str]:
                try:
                    view = plan_view(principal, form)
                except Invalid as exc:
                    message = "cannot plan it, nothing was changed: " + problems_of(exc)
                    return 422, edit_refused(principal, session.csrf, form, message)
                return 200, plan_page(view, csrf=session.csrf, operator=is_operator(principal))

            status, body = await run_in_threadpool(build)
            return html(layout("Plan", body, principal, session.csrf), status)

        return await guarded(request, "viewer", work)
