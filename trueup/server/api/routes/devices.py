"""Devices and the fleet view: list (filtered by condition or reason code), create, show,
report history, enrollment through the API, acknowledgements."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Query
from starlette.concurrency import run_in_threadpool

from trueup.server.api.context import Api, role
from trueup.server.api.models import AckCreate, DeviceCreate
from trueup.server.api.responses import DEVICE, answers
from trueup.server.limits import QUERY_LENGTH
from trueup.server.service import Principal

__all__ = ["register"]


def register(app: FastAPI, api: Api) -> None:
    plane = api.plane
    viewer, operator, admin = api.viewer, api.operator, api.admin

    @app.get("/api/v1/devices", openapi_extra=role("viewer"), responses=answers())
    async def list_devices(
        status: str | None = Query(
            None,
            max_length=QUERY_LENGTH,
            description="in_sync | drift | version_skew | local_override | …",
        ),
        reason: str | None = Query(
            None, max_length=QUERY_LENGTH, description="a reason code, e.g. STATE_VERSION_SKEW"
        ),
        p: Principal = viewer,
    ) -> dict[str, Any]:
        entries = await run_in_threadpool(plane.fleet, p.tenant_id)
        if status:
            entries = [e for e in entries if status in e["conditions"]]
        if reason:
            entries = [e for e in entries if reason in e["reason_codes"]]
        return {"devices": entries, "count": len(entries)}

    @app.post(
        "/api/v1/devices", status_code=201, openapi_extra=role("operator"), responses=answers()
    )
    def create_device(body: DeviceCreate, p: Principal = operator) -> dict[str, Any]:
        plane.create_device(p.tenant_id, body.name, p.actor)
        return {"device": body.name}

    @app.get("/api/v1/devices/{device}", openapi_extra=role("viewer"), responses=answers(404))
    def get_device(device: DEVICE, p: Principal = viewer) -> dict[str, Any]:
        entry = plane.fleet(p.tenant_id, device)[0]
        entry["last_report"] = plane.last_report(p.tenant_id, device)
        return entry

    @app.get(
        "/api/v1/devices/{device}/reports", openapi_extra=role("viewer"), responses=answers(404)
    )
    def list_reports(
        device: DEVICE, limit: int = Query(50, ge=1, le=1000), p: Principal = viewer
    ) -> dict[str, Any]:
        return {"reports": plane.report_history(p.tenant_id, device, limit)}

    @app.post(
        "/api/v1/devices/{device}/enrollment",
        status_code=201,
        openapi_extra=role("admin"),
        responses=answers(404),
    )
    def enroll(device: DEVICE, p: Principal = admin) -> dict[str, Any]:
        return plane.enroll(p.tenant_id, device, p.actor, url=api.public_url, create_missing=False)

    @app.post(
        "/api/v1/devices/{device}/acks",
        status_code=201,
        openapi_extra=role("operator"),
        responses=answers(404),
    )
    def acknowledge(device: DEVICE, body: AckCreate, p: Principal = operator) -> dict[str, Any]:
        return plane.acknowledge(
            p.tenant_id, device, body.subsystem, body.for_seconds, body.reason, p.actor
        )
