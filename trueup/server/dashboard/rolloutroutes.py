"""The dashboard's rollout routes: the list, one rollout with its live stream (a rollout
that does not change sends nothing new), starting one from the plan page's form (a
proposed profile edit is stored first, with its If-Match version), and pause, resume,
approve, abort.

Declared with `Pages` (pages.py) like every page route: viewers read, operators (with
the form's CSRF token) act; a rollout of another tenant is 404.
"""

from __future__ import annotations

import json

from fastapi import HTTPException, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

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
from trueup.server.dashboard.fleethtml import RolloutForm, plan_page
from trueup.server.dashboard.pages import APPLY_BYTES, PageCall, Pages
from trueup.server.dashboard.rollouthtml import rollout_live, rollout_page, rollouts_page
from trueup.server.service import Busy, Conflict, ControlPlane, Invalid, NotFound, WrongState
from trueup.server.service.planio import checked_selector, unseen

__all__ = ["ROLLOUT_STREAM_SECONDS", "register"]

ROLLOUT_STREAM_SECONDS = 1.0  # how often a rollout page's stream looks for changes
_ACTIONS = ("pause", "resume", "approve", "abort")


def _known_action(request: Request) -> None:
    action = request.path_params["action"]
    if action not in _ACTIONS:
        raise HTTPException(404, detail=f"no rollout action {action!r}")


def _start(plane: ControlPlane, call: PageCall, wanted: RolloutForm) -> tuple[int, str]:
    """Store the proposed profile edit (if any) and start the rollout of the plan shown:
    (303, the rollout's page), or (status, the plan page with the refusal)."""
    form, principal = call.form, call.principal
    stored = ""
    try:
        spec = rollout_spec(wanted)
        reason = comment_of(form, "reason")
        text = form.get("document", "")
        if text.strip():
            data = decoded(text)
            name = change_name(data)
            version = plane.put_profile(
                call.tenant_id,
                name,
                expected_of(form),
                data,
                actor=principal.actor,
                comment=comment_of(form) or reason,
            ).version
            stored = f"profile {name} stored as version {version}; "
        plan = plane.plan(call.tenant_id, selector=checked_selector(form.get("selector", "")))
        unseen(plan, form.get("plan_digest") or None)
        started = plane.start_rollout(
            call.tenant_id,
            plan,
            actor=principal.actor,
            comment=reason or comment_of(form),
            # Each wave as the plain mapping Rollouts.start takes.
            waves=None if spec["waves"] is None else [dict(w) for w in spec["waves"]],
            max_unavailable=spec["max_unavailable"],
            soak_seconds=spec["soak_seconds"],
            failure_budget=spec["failure_budget"],
            confirm_within=spec["confirm_within"],
            approval=spec["approval"],
        )
    except (Conflict, Busy, WrongState, Invalid) as exc:
        status = 422 if isinstance(exc, Invalid) else 409
        why = problems_of(exc) if isinstance(exc, Invalid) else str(exc)
        after = f"{stored}no rollout was started: " if stored else "nothing changed: "
        form_now = {**form, "document": ""} if stored else form
        try:
            view = plan_for(plane, principal, form_now)
        except Invalid:
            view = plan_for(plane, principal, {"selector": ""})
        body = plan_page(view, csrf=call.csrf, operator=True, form=wanted, error=after + why)
        return status, body
    return 303, f"/ui/rollouts/{int(started['id'])}?started=1"


def _act(plane: ControlPlane, call: PageCall, rollout_id: int, action: str) -> tuple[int, str]:
    """Pause, resume, approve or abort: (303, the rollout's page), or (status, the page
    with the refusal)."""
    t, who = call.tenant_id, call.principal.actor
    try:
        reason = comment_of(call.form, "reason")
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
        body = rollout_page(view, csrf=call.csrf, operator=True, error=why)
        return (409 if isinstance(exc, WrongState) else 422), body
    return 303, f"/ui/rollouts/{rollout_id}?done={action}"


def register(pages: Pages) -> None:
    plane = pages.plane

    @pages.post("/ui/rollouts", max_body=APPLY_BYTES)
    async def start_rollout(call: PageCall) -> Response:
        wanted = rollout_form(call.form)
        status, out = await run_in_threadpool(_start, plane, call, wanted)
        if status == 303:
            return call.redirect(out)
        return call.page("Plan", out, status)

    @pages.get("/ui/rollouts")
    async def rollouts(call: PageCall) -> Response:
        entries = await run_in_threadpool(plane.rollouts, call.tenant_id)
        return call.page("Rollouts", rollouts_page(entries))

    @pages.get("/ui/rollouts/{rid}")
    async def rollout(call: PageCall) -> Response:
        rid = call.path("rid")
        view = await run_in_threadpool(plane.rollout, call.tenant_id, rollout_id_of(rid))
        notice = "rollout started" if call.query("started") else ""
        if call.request.query_params.get("done") in _ACTIONS:
            notice = f"{call.query('done')}: done"
        operator = is_operator(call.principal)
        body = rollout_page(view, csrf=call.csrf, operator=operator, notice=notice)
        return call.page(f"Rollout {rid}", body)

    @pages.get("/ui/rollouts/{rid}/stream")
    async def rollout_stream(call: PageCall) -> Response:
        """The rollout page's live parts (`rollout_live`), sent when they change."""
        rollout_id = rollout_id_of(call.path("rid"))
        # Not found outside the caller's tenant: answered before the stream starts.
        await run_in_threadpool(plane.rollout, call.tenant_id, rollout_id)
        operator = is_operator(call.principal)

        async def look() -> str | None:
            try:
                view = await run_in_threadpool(plane.rollout, call.tenant_id, rollout_id)
            except NotFound:
                return None
            parts = rollout_live(view, csrf=call.csrf, operator=operator)
            return json.dumps(parts, sort_keys=True)

        return pages.live(call, "rollout", ROLLOUT_STREAM_SECONDS, look)

    @pages.post("/ui/rollouts/{rid}/actions/{action}", check=_known_action)
    async def rollout_action(call: PageCall) -> Response:
        rid, action = call.path("rid"), call.path("action")
        rollout_id = rollout_id_of(rid)
        status, out = await run_in_threadpool(_act, plane, call, rollout_id, action)
        if status == 303:
            return call.redirect(out)
        return call.page(f"Rollout {rid}", out, status)
