"""The dashboard's fleet-change routes: profiles (list, one profile, its edit form), the
plan of a proposed edit or of the stored inputs, and rollouts (list, one rollout with its
live stream, start, pause, resume, approve, abort).

`register` is called by routes.register with its session helpers (`caller`,
`posted`, `guarded`, `live`), so these routes check the session, the role and
the CSRF token exactly as the other dashboard routes do: viewers read and plan
(planning stores nothing), operators save profiles and drive rollouts. Every
read goes through the control plane with the caller's tenant. Each change is
the service call the JSON API makes (audited there).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from trueup.model.decode import DecodeError, decode_yaml
from trueup.model.layering import parse_selector
from trueup.server.api.context import Api
from trueup.server.dashboard.fleethtml import (
    PlanView,
    RolloutForm,
    plan_page,
    profile_page,
    profiles_page,
    rollout_live,
    rollout_page,
    rollouts_page,
)
from trueup.server.dashboard.html import layout
from trueup.server.inputs import COMMENT, DEVICE, EXPECTED_VERSION, InputError
from trueup.server.limits import DOCUMENT_BYTES
from trueup.server.service import Busy, Conflict, Invalid, NotFound, Principal, WrongState
from trueup.server.service.planio import checked_selector, proposed_change
from trueup.server.service.rolloutplan import parse_spec

__all__ = ["ROLLOUT_STREAM_SECONDS", "register"]

ROLLOUT_STREAM_SECONDS = 1.0  # how often a rollout page's stream looks for changes
_ACTIONS = ("pause", "resume", "approve", "abort")


class _Refused(Exception):
    """A form refused: its status and the message shown above the kept form."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _operator(principal: Principal) -> bool:
    return principal.role in ("operator", "admin")


def _problems(exc: Invalid) -> str:
    return "; ".join(exc.problems[:10])


def _rollout_id(raw: str) -> int:
    if not raw.isdigit() or len(raw) > 12:
        raise NotFound(f"rollout {raw!r} not found")
    return int(raw)


def _decoded(text: str) -> Any:
    try:
        return decode_yaml(text, max_bytes=DOCUMENT_BYTES)
    except DecodeError as exc:
        raise Invalid([f"(document): {exc}"]) from None


def _expected(form: dict[str, str]) -> int:
    try:
        return int(EXPECTED_VERSION.parse("expected", form.get("expected", "0") or "0"))
    except InputError as exc:
        raise Invalid([str(exc)]) from None


def _comment(form: dict[str, str], name: str = "comment") -> str:
    try:
        return str(COMMENT.parse(name, form.get(name, "")))
    except InputError as exc:
        raise Invalid([str(exc)]) from None


def rollout_form(form: dict[str, str]) -> RolloutForm:
    return RolloutForm(
        canary_devices=form.get("canary_devices", ""),
        canary_selector=form.get("canary_selector", ""),
        percents=form.get("percents", ""),
        max_unavailable=form.get("max_unavailable", ""),
        soak_seconds=form.get("soak_seconds", ""),
        failure_budget=form.get("failure_budget", ""),
        confirm_within=form.get("confirm_within", ""),
        approval=form.get("approval") == "1",
        reason=form.get("reason", ""),
    )


def rollout_spec(f: RolloutForm) -> dict[str, Any]:
    """The roll-out form as Rollouts.start's arguments; Invalid names each bad field."""
    problems: list[str] = []
    waves: list[dict[str, Any]] = []
    names = [n for n in f.canary_devices.replace(",", " ").split() if n]
    for name in names:
        problems.extend(DEVICE.problems("canary_devices", name))
    if names:
        waves.append({"devices": names})
    if f.canary_selector.strip():
        try:
            waves.append({"selector": parse_selector(f.canary_selector).text})
        except ValueError as exc:
            problems.append(f"canary_selector: {exc}")
    for part in [p.strip().removesuffix("%").strip() for p in f.percents.split(",")]:
        if not part:
            continue
        if not part.isdigit() or not 1 <= int(part) <= 100:
            problems.append(f"percents: {part!r} is not a percentage from 1 to 100")
        else:
            waves.append({"percent": int(part)})
    raw = f.max_unavailable.strip() or "25%"
    max_unavailable: int | str = int(raw) if raw.isdigit() else raw

    def number(name: str, text: str, integer: bool) -> float | None:
        if not text.strip():
            return None
        try:
            return int(text) if integer else float(text)
        except ValueError:
            problems.append(f"{name}: {text!r} is not a{'n integer' if integer else ' number'}")
            return None

    spec = {
        "waves": waves or None,
        "max_unavailable": max_unavailable,
        "soak_seconds": number("soak_seconds", f.soak_seconds, False) or 0.0,
        "failure_budget": int(number("failure_budget", f.failure_budget, True) or 0),
        "confirm_within": number("confirm_within", f.confirm_within, True),
        "approval": f.approval,
    }
    try:
        parse_spec(spec)
    except ValueError as exc:
        problems.extend(exc.args[0])
    if problems:
        raise Invalid(problems)
    return spec


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
            shown, history, selected, csrf=csrf, operator=_operator(principal), **extra
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
            operator=_operator(principal),
            draft=text,
            error=error,
        )

    @app.get("/ui/profiles", include_in_schema=False, openapi_extra=session_role)
    async def profiles(request: Request) -> Response:
        async def work() -> Response:
            principal, session = await caller(request)
            rows = await run_in_threadpool(profile_rows, principal.tenant_id)
            body = profiles_page(rows, csrf=session.csrf, operator=_operator(principal))
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

    @app.post("/ui/profiles/save", include_in_schema=False, openapi_extra=document_role)
    async def save_profile(request: Request) -> Response:
        async def work() -> Response:
            principal, session, form = await posted(request, "operator")

            def attempt() -> tuple[int, str]:
                try:
                    data = _decoded(form.get("document", ""))
                    name = data.get("metadata", {}).get("name") if isinstance(data, dict) else None
                    if not isinstance(name, str):
                        raise Invalid(["metadata.name: a profile names itself (a DNS label)"])
                    stored = plane.put_profile(
                        principal.tenant_id,
                        name,
                        _expected(form),
                        data,
                        actor=principal.actor,
                        comment=_comment(form),
                    )
                except Conflict as exc:
                    return 409, edit_refused(principal, session.csrf, form, str(exc))
                except (Invalid, NotFound) as exc:
                    message = _problems(exc) if isinstance(exc, Invalid) else str(exc)
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

    def plan_view(principal: Principal, form: dict[str, str]) -> PlanView:
        """The plan the form asks for: its proposed profile edit, else the stored inputs
        (of the devices `selector` picks). Raises Invalid."""
        text = form.get("document", "")
        if not text.strip():
            selector = form.get("selector", "")
            plan = plane.plan(principal.tenant_id, selector=checked_selector(selector))
            title = "Plan of the stored profiles and variables" + (
                f" for {selector}" if selector.strip() else ""
            )
            return PlanView(plan, title, selector=selector)
        change = proposed_change("profile", document=_decoded(text))
        plan = plane.plan(principal.tenant_id, change=change)
        name = change.profile.name  # type: ignore[union-attr]
        return PlanView(
            plan,
            f"Plan of profile {name} as edited",
            document=text,
            expected=_expected(form),
            comment=_comment(form),
        )

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
                        empty, csrf=session.csrf, operator=False, error=_problems(exc)
                    )
                return 200, plan_page(view, csrf=session.csrf, operator=_operator(principal))

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
                    message = "cannot plan it, nothing was changed: " + _problems(exc)
                    return 422, edit_refused(principal, session.csrf, form, message)
                return 200, plan_page(view, csrf=session.csrf, operator=_operator(principal))

            status, body = await run_in_threadpool(build)
            return html(layout("Plan", body, principal, session.csrf), status)

        return await guarded(request, "viewer", work)

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
                    reason = _comment(form, "reason")
                    text = form.get("document", "")
                    if text.strip():
                        data = _decoded(text)
                        name = change_name(data)
                        version = plane.put_profile(
                            principal.tenant_id,
                            name,
                            _expected(form),
                            data,
                            actor=principal.actor,
                            comment=_comment(form) or reason,
                        ).version
                        stored = f"profile {name} stored as version {version}; "
                    plan = plane.plan(
                        principal.tenant_id, selector=checked_selector(form.get("selector", ""))
                    )
                    started = plane.start_rollout(
                        principal.tenant_id, plan, actor=principal.actor, comment=reason, **spec
                    )
                except (Conflict, Busy, WrongState, Invalid) as exc:
                    status = 422 if isinstance(exc, Invalid) else 409
                    why = _problems(exc) if isinstance(exc, Invalid) else str(exc)
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

    def change_name(data: Any) -> str:
        change = proposed_change("profile", document=data)
        return str(change.profile.name)  # type: ignore[union-attr]

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
            view = await run_in_threadpool(plane.rollout, principal.tenant_id, _rollout_id(rid))
            q = request.query_params
            notice = "rollout started" if q.get("started") else ""
            if q.get("done") in _ACTIONS:
                notice = f"{q.get('done')}: done"
            body = rollout_page(
                view, csrf=session.csrf, operator=_operator(principal), notice=notice
            )
            return html(layout(f"Rollout {rid}", body, principal, session.csrf), 200)

        return await guarded(request, "viewer", work)

    @app.get("/ui/rollouts/{rid}/stream", include_in_schema=False, openapi_extra=session_role)
    async def rollout_stream(request: Request, rid: str) -> Response:
        """The rollout page's live parts (`rollout_live`), sent when they change."""

        async def work() -> Response:
            principal, session = await caller(request)
            rollout_id = _rollout_id(rid)
            # Not found outside the caller's tenant: answered before the stream starts.
            await run_in_threadpool(plane.rollout, principal.tenant_id, rollout_id)

            async def look() -> str | None:
                try:
                    view = await run_in_threadpool(plane.rollout, principal.tenant_id, rollout_id)
                except NotFound:
                    return None
                parts = rollout_live(view, csrf=session.csrf, operator=_operator(principal))
                return json.dumps(parts, sort_keys=True)

            async def signed_in() -> bool:
                return await principal_of(session) is not None

            return live(request, signed_in, "rollout", ROLLOUT_STREAM_SECONDS, look)

        return await guarded(request, "viewer", work)

    @app.post("/ui/rollouts/{rid}/{action}", include_in_schema=False, openapi_extra=session_role)
    async def rollout_action(request: Request, rid: str, action: str) -> Response:
        async def work() -> Response:
            if action not in _ACTIONS:
                raise HTTPException(404, detail=f"no rollout action {action!r}")
            principal, session, form = await posted(request, "operator")
            rollout_id = _rollout_id(rid)

            def attempt() -> tuple[int, str]:
                t, who = principal.tenant_id, principal.actor
                try:
                    reason = _comment(form, "reason")
                    if action == "pause":
                        plane.pause_rollout(t, rollout_id, actor=who, reason=reason)
                    elif action == "resume":
                        plane.resume_rollout(t, rollout_id, actor=who)
                    elif action == "approve":
                        plane.approve_rollout(t, rollout_id, actor=who)
                    else:
                        plane.abort_rollout(t, rollout_id, actor=who, reason=reason)
                except (WrongState, Invalid) as exc:
                    why = _problems(exc) if isinstance(exc, Invalid) else str(exc)
                    view = plane.rollout(t, rollout_id)
                    body = rollout_page(view, csrf=session.csrf, operator=True, error=why)
                    return (409 if isinstance(exc, WrongState) else 422), body
                return 303, f"/ui/rollouts/{rollout_id}?done={action}"

            status, out = await run_in_threadpool(attempt)
            if status == 303:
                return redirect(out)
            return html(layout(f"Rollout {rid}", out, principal, session.csrf), status)

        return await guarded(request, "operator", work)
