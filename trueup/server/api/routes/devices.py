"""Devices and the fleet view: list (filtered by condition, reason code or label selector),
create (with labels), show,
report history, enrollment through the API, acknowledgements. A device's entry carries its
drift history (who changed what, who healed it) and the router's own acknowledgements."""

from __future__ import annotations

import time

from fastapi import FastAPI, Query
from starlette.concurrency import run_in_threadpool

from trueup.server.api.context import Api, role
from trueup.server.api.models import AckCreate, DeviceCreate
from trueup.server.api.records import DeviceCreated, DevicesAnswer, ReportsAnswer, ServiceRecord
from trueup.server.api.responses import DEVICE, answers
from trueup.server.fleet import FILTER_CHOICES, filter_problems
from trueup.server.limits import QUERY_LENGTH, SELECTOR_LENGTH
from trueup.server.service import Invalid, Principal, agent_acknowledgements
from trueup.server.service.labelrows import checked_selector

__all__ = ["register"]


def register(app: FastAPI, api: Api) -> None:
    plane = api.plane
    viewer, operator, admin = api.viewer, api.operator, api.admin

    @app.get("/api/v1/devices", openapi_extra=role("viewer"), responses=answers())
    async def list_devices(
        status: str | None = Query(
            None,
            max_length=QUERY_LENGTH,
            description="only devices with this condition; another value is refused (422)",
            json_schema_extra={"enum": list(FILTER_CHOICES["status"])},
        ),
        reason: str | None = Query(
            None,
            max_length=QUERY_LENGTH,
            description="only devices reporting this reason code; another value is refused (422)",
            json_schema_extra={"enum": list(FILTER_CHOICES["reason"])},
        ),
        selector: str | None = Query(
            None,
            max_length=SELECTOR_LENGTH,
            description="only devices whose labels this selector matches "
            "(`site=ams,role in (edge,core),!lab`); one that does not parse is refused (422)",
        ),
        p: Principal = viewer,
    ) -> DevicesAnswer:
        problems = filter_problems("query.", status=status, reason=reason)
        if problems:
            raise Invalid(problems)
        parsed = checked_selector(selector, where="query.selector")
        entries = await run_in_threadpool(
            lambda: plane.fleet(p.tenant_id, status=status, reason=reason, selector=parsed)
        )
        return {"devices": [dict(e) for e in entries], "count": len(entries)}

    @app.post(
        "/api/v1/devices", status_code=201, openapi_extra=role("operator"), responses=answers()
    )
    def create_device(body: DeviceCreate, p: Principal = operator) -> DeviceCreated:
        plane.create_device(p.tenant_id, body.name, p.actor, labels=body.labels)
        return {"device": body.name, "labels": plane.labels(p.tenant_id, body.name)}

    @app.get("/api/v1/devices/{device}", openapi_extra=role("viewer"), responses=answers(404))
    def get_device(device: DEVICE, p: Principal = viewer) -> ServiceRecord:
        entry = plane.device_view(p.tenant_id, device)
        return {
            **entry,
            "drift_history": plane.drift_history(p.tenant_id, device),
            "agent_acknowledgements": agent_acknowledgements(entry.get("last_report"), time.time()),
        }

    @app.get(
        "/api/v1/devices/{device}/reports", openapi_extra=role("viewer"), responses=answers(404)
    )
    def list_reports(
        device: DEVICE, limit: int = Query(50, ge=1, le=1000), p: Principal = viewer
    ) -> ReportsAnswer:
        return {"reports": plane.report_history(p.tenant_id, device, limit)}

    @app.post(
        "/api/v1/devices/{device}/enrollment",
        status_code=201,
        openapi_extra=role("admin"),
        responses=answers(404),
    )
    def enroll(device: DEVICE, p: Principal = admin) -> ServiceRecord:
        return dict(
            plane.enroll(p.tenant_id, device, p.actor, url=api.public_url, create_missing=False)
        )

    @app.post(
        "/api/v1/devices/{device}/acks",
        status_code=201,
        openapi_extra=role("operator"),
        responses=answers(404),
    )
    def acknowledge(device: DEVICE, body: AckCreate, p: Principal = operator) -> ServiceRecord:
        return dict(
            plane.acknowledge(
                p.tenant_id, device, body.subsystem, body.for_seconds, body.reason, p.actor
            )
        )
