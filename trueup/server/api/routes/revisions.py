"""Desired revisions: read the desired one, put the next one (If-Match), the history.

`PUT …/desired` takes JSON or YAML. Without If-Match it is 428; a stale
If-Match is 409 with STATE_CONCURRENT_MODIFICATION (app.py maps Conflict).
"""

from __future__ import annotations

import json
from typing import Any

import yaml
from fastapi import FastAPI, Header, HTTPException, Request, Response
from starlette.concurrency import run_in_threadpool

from trueup.server.api.context import Api, role
from trueup.server.service import Invalid, Principal

__all__ = ["parse_if_match", "register"]


def parse_if_match(value: str | None) -> int:
    """The version an If-Match header names (`3`, `"3"` or `W/"3"`)."""
    if value is None:
        raise HTTPException(
            428,
            detail="If-Match is required: send the version you expect to replace "
            "(0 for a device without revisions)",
        )
    text = value.strip()
    if text.startswith("W/"):
        text = text[2:]
    text = text.strip('"')
    if not text.isdigit():
        raise HTTPException(
            422,
            detail={"problems": [f"header.If-Match: {value!r} is not a version number (e.g. 3)"]},
        )
    return int(text)


def register(app: FastAPI, api: Api) -> None:
    plane = api.plane
    viewer, operator = api.viewer, api.operator

    @app.get("/api/v1/devices/{device}/desired", openapi_extra=role("viewer"))
    def get_desired(device: str, response: Response, p: Principal = viewer) -> dict[str, Any]:
        revision = plane.desired(p.tenant_id, device)
        if revision is None:
            response.headers["ETag"] = '"0"'
            return {"device": device, "version": 0, "document": None}
        response.headers["ETag"] = f'"{revision.version}"'
        return {**revision.summary(), "document": revision.document}

    @app.put(
        "/api/v1/devices/{device}/desired",
        status_code=201,
        openapi_extra={
            **role("operator"),
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": {"type": "object"}},
                    "application/yaml": {"schema": {"type": "object"}},
                },
            },
        },
    )
    async def put_desired(
        device: str,
        request: Request,
        response: Response,
        if_match: str | None = Header(None),
        x_trueup_comment: str = Header(""),
        p: Principal = operator,
    ) -> dict[str, Any]:
        expected = parse_if_match(if_match)
        raw = await request.body()
        try:
            if "yaml" in request.headers.get("content-type", ""):
                data = yaml.safe_load(raw)
            else:
                data = json.loads(raw)
        except (ValueError, yaml.YAMLError) as exc:
            raise Invalid([f"(document): not valid JSON or YAML: {exc}"]) from None
        revision = await run_in_threadpool(
            lambda: plane.put_desired(
                p.tenant_id,
                device,
                expected,
                data,
                author=p.actor,
                comment=x_trueup_comment,
            )
        )
        api.metrics.revisions.inc()
        device_id = await run_in_threadpool(plane.device_id, p.tenant_id, device)
        api.watcher.wake(device_id)
        response.headers["ETag"] = f'"{revision.version}"'
        return revision.summary()

    @app.get("/api/v1/devices/{device}/revisions", openapi_extra=role("viewer"))
    def list_revisions(device: str, p: Principal = viewer) -> dict[str, Any]:
        return {"revisions": [r.summary() for r in plane.revisions(p.tenant_id, device)]}

    @app.get("/api/v1/devices/{device}/revisions/{version}", openapi_extra=role("viewer"))
    def get_revision(device: str, version: int, p: Principal = viewer) -> dict[str, Any]:
        revision = plane.revision(p.tenant_id, device, version)
        return {**revision.summary(), "document": revision.document}
