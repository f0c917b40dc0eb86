"""The dashboard's fleet-change routes for profiles (list, one profile, its edit form) and
the plan of a proposed edit or of the stored inputs; rolloutroutes.py has the rollouts.

Declared with `Pages` (pages.py) like every page route, so they check the session, the
role and the CSRF token exactly as the other dashboard routes do: viewers read and plan
(planning stores nothing), operators save profiles and drive rollouts. Every read goes
through the control plane with the caller's tenant. Each change is the service call the
JSON API makes (audited there).
"""

from __future__ import annotations

from urllib.parse import quote

from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from trueup.model.decode import DecodeError, decode_yaml
from trueup.model.layering import parse_selector
from trueup.server.dashboard.fleetforms import (
    comment_of,
    decoded,
    expected_of,
    is_operator,
    plan_for,
    problems_of,
)
from trueup.server.dashboard.fleethtml import (
    PlanView,
    ProfileRow,
    plan_page,
    profile_page,
    profiles_page,
)
from trueup.server.dashboard.pages import APPLY_BYTES, PageCall, Pages
from trueup.server.limits import DOCUMENT_BYTES
from trueup.server.service import Conflict, ControlPlane, Invalid, NotFound

__all__ = ["edit_refused", "profile_rows", "register"]


def profile_rows(plane: ControlPlane, tenant_id: int) -> list[ProfileRow]:
    rows = []
    for v in plane.profile_list(tenant_id):
        meta, spec = v.document.get("metadata", {}), v.document.get("spec", {})
        selector = str(spec.get("selector", ""))
        rows.append(
            ProfileRow(
                name=v.name,
                version=v.version,
                priority=meta.get("priority", 100),
                selector=selector,
                description=meta.get("description", ""),
                selected=len(plane.devices_matching(tenant_id, parse_selector(selector))),
            )
        )
    return rows


def _profile_html(
    plane: ControlPlane,
    call: PageCall,
    name: str,
    *,
    draft: str | None = None,
    comment: str = "",
    expected: int | None = None,
    error: str = "",
    notice: str = "",
) -> str:
    tenant = call.tenant_id
    shown = plane.profile(tenant, name)
    history = plane.profile_history(tenant, name)
    selector = parse_selector(str(shown.document.get("spec", {}).get("selector", "")))
    selected = [(n, labels) for _id, n, labels in plane.devices_matching(tenant, selector)]
    return profile_page(
        shown,
        history,
        selected,
        csrf=call.csrf,
        operator=is_operator(call.principal),
        draft=draft,
        comment=comment,
        expected=expected,
        error=error,
        notice=notice,
    )


def edit_refused(plane: ControlPlane, call: PageCall, form: dict[str, str], error: str) -> str:
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
            return _profile_html(
                plane,
                call,
                name,
                draft=text,
                comment=comment,
                expected=int(expected) if expected.isdigit() else None,
                error=error,
            )
        except NotFound:
            pass
    return profiles_page(
        profile_rows(plane, call.tenant_id),
        csrf=call.csrf,
        operator=is_operator(call.principal),
        draft=text,
        error=error,
    )


def register(pages: Pages) -> None:
    _register_profiles(pages)
    _register_plan(pages)


def _register_profiles(pages: Pages) -> None:
    plane = pages.plane

    @pages.get("/ui/profiles")
    async def profiles(call: PageCall) -> Response:
        rows = await run_in_threadpool(profile_rows, plane, call.tenant_id)
        return call.page(
            "Profiles", profiles_page(rows, csrf=call.csrf, operator=is_operator(call.principal))
        )

    @pages.get("/ui/profiles/{name}")
    async def profile(call: PageCall) -> Response:
        name, saved = call.path("name"), call.query("saved")
        notice = (
            f"version {saved} stored; no device changes until it is rolled out"
            if saved.isdigit()
            else ""
        )
        body = await run_in_threadpool(lambda: _profile_html(plane, call, name, notice=notice))
        return call.page(f"Profile {name}", body)

    @pages.post("/ui/profiles", max_body=APPLY_BYTES)
    async def save_profile(call: PageCall) -> Response:
        form = call.form

        def attempt() -> tuple[int, str]:
            try:
                data = decoded(form.get("document", ""))
                name = data.get("metadata", {}).get("name") if isinstance(data, dict) else None
                if not isinstance(name, str):
                    raise Invalid(["metadata.name: a profile names itself (a DNS label)"])
                stored = plane.put_profile(
                    call.tenant_id,
                    name,
                    expected_of(form),
                    data,
                    actor=call.principal.actor,
                    comment=comment_of(form),
                )
            except Conflict as exc:
                return 409, edit_refused(plane, call, form, str(exc))
            except (Invalid, NotFound) as exc:
                message = problems_of(exc) if isinstance(exc, Invalid) else str(exc)
                return 422, edit_refused(
                    plane, call, form, "not saved, nothing was changed: " + message
                )
            return 303, f"/ui/profiles/{quote(stored.name)}?saved={stored.version}"

        status, out = await run_in_threadpool(attempt)
        if status == 303:
            return call.redirect(out)
        return call.page("Profiles", out, status)


def _register_plan(pages: Pages) -> None:
    plane = pages.plane

    @pages.get("/ui/plan")
    async def plan_stored(call: PageCall) -> Response:
        form = {"selector": call.query("selector")}

        def build() -> tuple[int, str]:
            try:
                view = plan_for(plane, call.principal, form)
            except Invalid as exc:
                empty = PlanView(plane.plan(call.tenant_id), "Plan", selector="")
                return 422, plan_page(empty, csrf=call.csrf, operator=False, error=problems_of(exc))
            return 200, plan_page(view, csrf=call.csrf, operator=is_operator(call.principal))

        status, body = await run_in_threadpool(build)
        return call.page("Plan", body, status)

    @pages.post("/ui/plan", "viewer", max_body=APPLY_BYTES)
    async def plan_edit(call: PageCall) -> Response:
        def build() -> tuple[int, str]:
            try:
                view = plan_for(plane, call.principal, call.form)
            except Invalid as exc:
                message = "cannot plan it, nothing was changed: " + problems_of(exc)
                return 422, edit_refused(plane, call, call.form, message)
            return 200, plan_page(view, csrf=call.csrf, operator=is_operator(call.principal))

        status, body = await run_in_threadpool(build)
        return call.page("Plan", body, status)
