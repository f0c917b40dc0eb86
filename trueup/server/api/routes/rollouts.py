"""Rollouts: publish a change wave by wave, watch its gates, pause, resume, approve, abort.

`POST /api/v1/plan/rollout` rolls the stored profiles and variables out: the
fleet plan of the devices a selector picks, each target with its provenance.
`POST /api/v1/rollouts` takes the plan's targets (each device's full document;
the version it was planned against, else its current desired version) and the
wave spec; a target whose document is the device's desired one already is left
out, and one whose agent reports that it does not support the document (its
apiVersion, a section it uses) is refused: listed under `refused`, never sent.
A device another unfinished rollout holds is refused (409, naming the
rollout), as is a target whose version has moved (409). The controller does
the rest in whichever control-plane process holds the rollout's lease.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import FastAPI, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from trueup.model.document import document_digest
from trueup.model.jsontypes import JSONObject
from trueup.model.layering import Provenance
from trueup.server.api.context import Api, role
from trueup.server.api.records import RolloutPlanAnswer, RolloutsAnswer, ServiceRecord
from trueup.server.api.responses import TOKEN_ID, answers
from trueup.server.fleet import agent_support
from trueup.server.inputs import Comment, DeviceName
from trueup.server.limits import MAX_VERSION
from trueup.server.service import ControlPlane, Invalid, Principal
from trueup.server.service.fleettypes import Plan, Refusal, Target
from trueup.server.service.planio import checked_selector, plan_json, unseen

__all__ = ["PlanRollout", "RolloutAction", "RolloutCreate", "RolloutSpec", "register"]

MAX_TARGETS = 10_000
ROLLOUT_BODY_BYTES = 64 * 1024 * 1024


class RolloutTarget(BaseModel):
    model_config = ConfigDict(extra="forbid")
    device: DeviceName
    # A desired-state document before validation (`_plan` validates it like `PUT …/desired`).
    document: JSONObject = Field(
        description="the device's full desired-state document (the published DeviceState schema)"
    )
    from_version: int | None = Field(
        None,
        ge=0,
        le=MAX_VERSION,
        description="the desired version the change was planned against (0: none; "
        "default: its current one)",
    )


class RolloutWave(BaseModel):
    model_config = ConfigDict(extra="forbid")
    devices: list[DeviceName] | None = Field(None, min_length=1, max_length=MAX_TARGETS)
    selector: Annotated[str, Field(max_length=1000)] | None = None
    percent: int | None = Field(None, ge=1, le=100)
    approval: bool = False


class RolloutSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    waves: list[RolloutWave] | None = Field(None, min_length=1, max_length=20)
    max_unavailable: (
        Annotated[int, Field(ge=1, le=1_000_000)]
        | Annotated[str, Field(pattern=r"^(100|[1-9][0-9]?)%$")]
    ) = "25%"
    soak_seconds: float = Field(0.0, ge=0, le=7 * 86400, allow_inf_nan=False)
    failure_budget: int = Field(0, ge=0, le=1_000_000)
    confirm_within: int | None = Field(None, ge=1, le=86400)
    approval: bool = False
    gate_timeout: float = Field(900.0, ge=1, le=7 * 86400, allow_inf_nan=False)
    comment: Comment = ""


class RolloutCreate(RolloutSpec):
    targets: list[RolloutTarget] = Field(min_length=1, max_length=MAX_TARGETS)


class PlanRollout(RolloutSpec):
    selector: Annotated[str, Field(max_length=1000)] = Field(
        "", description='only the devices whose labels this selector matches ("": every one)'
    )
    expect_digest: Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$")] | None = Field(
        None,
        description="the `digest` of the plan shown (`POST /api/v1/plan`): refused (409) when "
        "the plan the rollout would send is another one",
    )


class RolloutAction(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: Comment = ""


def _plan(api: Api, tenant_id: int, body: RolloutCreate) -> Plan:
    """The plan the body's targets make: each document validated like `PUT …/desired`."""
    plane = api.plane
    problems: list[str] = []
    targets = []
    refused = []
    seen: set[str] = set()
    unchanged = 0
    for i, item in enumerate(body.targets):
        if item.device in seen:
            problems.append(f"targets[{i}].device: {item.device!r} is named twice")
            continue
        seen.add(item.device)
        try:
            document = plane.desired_revisions.validated(item.device, item.document)
        except Invalid as exc:
            problems.extend(f"targets[{i}].document: {p}" for p in exc.problems)
            continue
        current = plane.desired(tenant_id, item.device)
        digest = document_digest(document)
        if current is not None and current.content_hash == digest:
            unchanged += 1
            continue
        canonical = document.canonical()
        # The sections the document names (the canonical one adds every default section).
        report = plane.last_report(tenant_id, item.device)
        lacking = agent_support(report, item.document)["unsupported"]
        if lacking:  # the agent says it cannot apply this document: never sent
            refused.append(
                Refusal(
                    device_id=plane.device_id(tenant_id, item.device),
                    device=item.device,
                    kind="agent-version",
                    problems=tuple(f"{u['path']}: {u['detail']}" for u in lacking),
                )
            )
            continue
        targets.append(
            Target(
                device_id=plane.device_id(tenant_id, item.device),
                device=item.device,
                from_version=item.from_version
                if item.from_version is not None
                else (current.version if current is not None else 0),
                document=canonical,
                digest=digest,
                provenance=Provenance(profiles=(), variables_digest="", own_digest=None),
                changes=(),
            )
        )
    if problems:
        raise Invalid(problems)
    return Plan(targets=tuple(targets), refused=tuple(refused), unchanged=unchanged)


def _started(plane: ControlPlane, p: Principal, plan: Plan, body: RolloutSpec) -> ServiceRecord:
    """Start the rollout of `plan` with the body's wave spec."""
    return dict(
        plane.start_rollout(
            p.tenant_id,
            plan,
            waves=[w.model_dump(exclude_none=True, exclude_defaults=True) for w in body.waves]
            if body.waves is not None
            else None,
            max_unavailable=body.max_unavailable,
            soak_seconds=body.soak_seconds,
            failure_budget=body.failure_budget,
            confirm_within=body.confirm_within,
            approval=body.approval,
            gate_timeout=body.gate_timeout,
            actor=p.actor,
            comment=body.comment,
        )
    )


def register(app: FastAPI, api: Api) -> None:
    _register_start(app, api)
    _register_control(app, api)


def _register_start(app: FastAPI, api: Api) -> None:
    plane, operator = api.plane, api.operator

    @app.post(
        "/api/v1/rollouts",
        status_code=201,
        openapi_extra=role("operator", max_body=ROLLOUT_BODY_BYTES),
        responses=answers(404, 409, conflict="state"),
    )
    async def start_rollout(body: RolloutCreate, p: Principal = operator) -> ServiceRecord:
        return await run_in_threadpool(
            lambda: _started(plane, p, _plan(api, p.tenant_id, body), body)
        )

    @app.post(
        "/api/v1/plan/rollout",
        status_code=201,
        openapi_extra=role("operator"),
        responses={
            **answers(404, 409, conflict="state"),
            200: {"description": "The plan changes no device: no rollout was started."},
        },
    )
    async def rollout_plan(
        body: PlanRollout, response: Response, p: Principal = operator
    ) -> RolloutPlanAnswer:
        """Roll the stored profiles and variables out: the plan `POST /api/v1/plan` shows
        for them (refused devices are never sent it), wave by wave. 201 with the rollout;
        200 without one when the plan changes no device."""

        def start() -> RolloutPlanAnswer:
            plan = plane.plan(p.tenant_id, selector=checked_selector(body.selector))
            unseen(plan, body.expect_digest)
            answer: RolloutPlanAnswer = {"plan": dict(plan_json(plan)), "rollout": None}
            if plan.targets:
                answer["rollout"] = _started(plane, p, plan, body)
            else:
                response.status_code = 200
            return answer

        return await run_in_threadpool(start)


def _register_control(app: FastAPI, api: Api) -> None:
    plane, viewer, operator = api.plane, api.viewer, api.operator

    @app.get("/api/v1/rollouts", openapi_extra=role("viewer"), responses=answers())
    def list_rollouts(p: Principal = viewer) -> RolloutsAnswer:
        entries = plane.rollouts(p.tenant_id)
        return {"rollouts": [dict(e) for e in entries], "count": len(entries)}

    @app.get("/api/v1/rollouts/{rollout_id}", openapi_extra=role("viewer"), responses=answers(404))
    def get_rollout(rollout_id: TOKEN_ID, p: Principal = viewer) -> ServiceRecord:
        return dict(plane.rollout(p.tenant_id, rollout_id))

    @app.post(
        "/api/v1/rollouts/{rollout_id}/pause",
        openapi_extra=role("operator"),
        responses=answers(404, 409, conflict="state"),
    )
    def pause(rollout_id: TOKEN_ID, body: RolloutAction, p: Principal = operator) -> ServiceRecord:
        return dict(plane.pause_rollout(p.tenant_id, rollout_id, actor=p.actor, reason=body.reason))

    @app.post(
        "/api/v1/rollouts/{rollout_id}/resume",
        openapi_extra=role("operator"),
        responses=answers(404, 409, conflict="state"),
    )
    def resume(rollout_id: TOKEN_ID, body: RolloutAction, p: Principal = operator) -> ServiceRecord:
        return dict(plane.resume_rollout(p.tenant_id, rollout_id, actor=p.actor))

    @app.post(
        "/api/v1/rollouts/{rollout_id}/approve",
        openapi_extra=role("operator"),
        responses=answers(404, 409, conflict="state"),
    )
    def approve(
        rollout_id: TOKEN_ID, body: RolloutAction, p: Principal = operator
    ) -> ServiceRecord:
        return dict(plane.approve_rollout(p.tenant_id, rollout_id, actor=p.actor))

    @app.post(
        "/api/v1/rollouts/{rollout_id}/abort",
        openapi_extra=role("operator"),
        responses=answers(404, 409, conflict="state"),
    )
    def abort(rollout_id: TOKEN_ID, body: RolloutAction, p: Principal = operator) -> ServiceRecord:
        return dict(plane.abort_rollout(p.tenant_id, rollout_id, actor=p.actor, reason=body.reason))
