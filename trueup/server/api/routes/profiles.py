"""Profiles, a device's variables and own layer, and the fleet plan.

`PUT /api/v1/profiles/{name}` takes a profile document (JSON or YAML, like a
desired document) with If-Match: 0 creates it, N replaces version N; without
If-Match it is 428, a stale one 409. `DELETE` takes If-Match too. Every
version stays readable (`…/versions`, `GET …?version=N`). Storing a profile or
a device's variables changes no device: `POST /api/v1/plan` shows what a
change (proposed in the body, or the stored inputs as they are) would do to
each device; `POST /api/v1/plan/publish` stores the stored inputs' plan as the
devices' next desired revisions. Roles: viewer reads and plans, operator
writes and publishes (like `PUT …/desired`).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, HTTPException, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from trueup.model.jsontypes import JSONObject
from trueup.server.api.context import Api, role
from trueup.server.api.models import (
    LabelsProposal,
    PlanChange,
    PlanRequest,
    ProfileDeletion,
    ProfileProposal,
    PublishRequest,
    VariablesProposal,
    VariablesPut,
)
from trueup.server.api.records import ProfilesAnswer, ProfileVersionsAnswer, ServiceRecord
from trueup.server.api.responses import DEVICE, NAME_PARAM, answers
from trueup.server.api.routes.revisions import parse_body, parse_comment, parse_if_match
from trueup.server.inputs import COMMENT_HEADER, IF_MATCH
from trueup.server.limits import DOCUMENT_BYTES, MAX_VERSION
from trueup.server.service import Principal
from trueup.server.service.fleettypes import Change
from trueup.server.service.planio import checked_selector, plan_json, proposed_change

__all__ = ["register"]

_IF_MATCH_PARAMS = [IF_MATCH.header("If-Match"), COMMENT_HEADER.header("X-Trueup-Comment")]


def _document_body() -> JSONObject:
    return {
        "required": True,
        "content": {
            "application/json": {"schema": {"type": "object"}},
            "application/yaml": {"schema": {"type": "object"}},
        },
    }


def register(app: FastAPI, api: Api) -> None:
    _register_profiles(app, api)
    _register_variables(app, api)
    _register_plan(app, api)


def _proposed(c: PlanChange | None) -> Change | None:
    """The change a plan request proposes (None: the stored inputs as they are)."""
    if isinstance(c, ProfileProposal):
        return proposed_change("profile", document=c.document)
    if isinstance(c, ProfileDeletion):
        return proposed_change("profile-delete", name=c.name)
    if isinstance(c, VariablesProposal):
        return proposed_change(
            "variables",
            device=c.device,
            variables=c.variables,
            own=c.own,
            replace_own=c.replace_own,
        )
    if isinstance(c, LabelsProposal):
        return proposed_change("labels", device=c.device, labels=c.labels)
    return None


def _register_profiles(app: FastAPI, api: Api) -> None:
    plane = api.plane
    viewer, operator = api.viewer, api.operator

    @app.get("/api/v1/profiles", openapi_extra=role("viewer"), responses=answers())
    def list_profiles(p: Principal = viewer) -> ProfilesAnswer:
        found = plane.profile_list(p.tenant_id)
        return {
            "profiles": [
                {
                    **v.summary(),
                    "priority": v.document.get("metadata", {}).get("priority"),
                    "selector": v.document.get("spec", {}).get("selector", ""),
                    "description": v.document.get("metadata", {}).get("description", ""),
                }
                for v in found
            ]
        }

    @app.get("/api/v1/profiles/{name}", openapi_extra=role("viewer"), responses=answers(404))
    def get_profile(
        name: NAME_PARAM,
        response: Response,
        version: int | None = Query(None, ge=1, le=MAX_VERSION),
        p: Principal = viewer,
    ) -> ServiceRecord:
        shown = plane.profile(p.tenant_id, name, version)
        response.headers["ETag"] = f'"{shown.version}"'
        return {**shown.summary(), "document": shown.document}

    @app.get(
        "/api/v1/profiles/{name}/versions", openapi_extra=role("viewer"), responses=answers(404)
    )
    def profile_versions(name: NAME_PARAM, p: Principal = viewer) -> ProfileVersionsAnswer:
        return {"versions": [dict(v.summary()) for v in plane.profile_history(p.tenant_id, name)]}

    @app.put(
        "/api/v1/profiles/{name}",
        status_code=201,
        responses=answers(404, 409, 413, 428, conflict="profile"),
        openapi_extra={
            **role("operator", max_body=DOCUMENT_BYTES),
            "parameters": _IF_MATCH_PARAMS,
            "requestBody": _document_body(),
        },
    )
    async def put_profile(
        name: NAME_PARAM, request: Request, response: Response, p: Principal = operator
    ) -> ServiceRecord:
        expected = parse_if_match(request.headers.get("if-match"))
        comment = parse_comment(request.headers.get("x-trueup-comment", ""))
        data = parse_body(await request.body(), request.headers.get("content-type", ""))
        stored = await run_in_threadpool(
            lambda: plane.put_profile(
                p.tenant_id, name, expected, data, actor=p.actor, comment=comment
            )
        )
        response.headers["ETag"] = f'"{stored.version}"'
        return dict(stored.summary())

    @app.delete(
        "/api/v1/profiles/{name}",
        responses=answers(404, 409, 428, conflict="profile"),
        openapi_extra={**role("operator"), "parameters": _IF_MATCH_PARAMS},
    )
    def delete_profile(name: NAME_PARAM, request: Request, p: Principal = operator) -> Any:
        value = request.headers.get("if-match")
        if value is None:
            raise HTTPException(
                428, detail="If-Match is required: send the profile version you delete"
            )
        expected = parse_if_match(value)
        comment = parse_comment(request.headers.get("x-trueup-comment", ""))
        return plane.delete_profile(
            p.tenant_id, name, expected, actor=p.actor, comment=comment
        ).summary()


def _register_variables(app: FastAPI, api: Api) -> None:
    plane = api.plane
    viewer, operator = api.viewer, api.operator

    @app.get(
        "/api/v1/devices/{device}/variables", openapi_extra=role("viewer"), responses=answers(404)
    )
    def get_variables(device: DEVICE, response: Response, p: Principal = viewer) -> ServiceRecord:
        stored = plane.device_variables(p.tenant_id, device)
        response.headers["ETag"] = f'"{stored.version}"'
        return dict(stored.summary())

    @app.put(
        "/api/v1/devices/{device}/variables",
        responses=answers(404, 409, 413, 428),
        openapi_extra={
            **role("operator", max_body=DOCUMENT_BYTES),
            "parameters": [IF_MATCH.header("If-Match")],
        },
    )
    def put_variables(
        device: DEVICE,
        body: VariablesPut,
        request: Request,
        response: Response,
        p: Principal = operator,
    ) -> ServiceRecord:
        expected = parse_if_match(request.headers.get("if-match"))
        stored = plane.put_device_variables(
            p.tenant_id,
            device,
            expected,
            variables=body.variables,
            own=body.own,
            actor=p.actor,
            keep_own="own" not in body.model_fields_set,
        )
        response.headers["ETag"] = f'"{stored.version}"'
        return dict(stored.summary())


def _register_plan(app: FastAPI, api: Api) -> None:
    plane = api.plane
    viewer, operator = api.viewer, api.operator

    @app.post(
        "/api/v1/plan",
        responses=answers(404),
        openapi_extra=role("viewer", max_body=DOCUMENT_BYTES),
    )
    def plan(body: PlanRequest, p: Principal = viewer) -> ServiceRecord:
        selector = checked_selector(body.selector)
        change = _proposed(body.change)
        return dict(plan_json(plane.plan(p.tenant_id, selector=selector, change=change)))

    @app.post("/api/v1/plan/publish", responses=answers(), openapi_extra=role("operator"))
    def publish(body: PublishRequest, p: Principal = operator) -> ServiceRecord:
        selector = checked_selector(body.selector)
        planned = plane.plan(p.tenant_id, selector=selector)
        published = plane.publish_plan(
            p.tenant_id, planned, actor=p.actor, comment=body.comment, expect=body.expect
        )
        for target in planned.targets:
            if any(device == target.device for device, _ in published.stored):
                api.watcher.wake(target.device_id)
        api.metrics.revisions.inc(len(published.stored))
        answer = plan_json(planned)
        answer["published"] = [{"device": d, "version": v} for d, v in published.stored]
        answer["refused"] += [
            {"device": r.device, "kind": r.kind, "problems": list(r.problems)}
            for r in published.refused
        ]
        return dict(answer)
