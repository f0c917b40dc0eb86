"""The agents' routes: enrollment exchange, the desired-revision long poll, reports, secrets.

Every route but `enroll` takes a device credential and serves only that
device. A report is answered only after the transaction holding it has
committed (ingest.py).
"""

from __future__ import annotations

import time

from fastapi import FastAPI, Header, HTTPException, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from trueup.server.api.bearer import bearer_token
from trueup.server.api.context import Api, problems, role
from trueup.server.api.models import AgentReport
from trueup.server.api.records import ServiceRecord
from trueup.server.api.responses import answers
from trueup.server.ingest import ReportRejected
from trueup.server.limits import MAX_VERSION, REPORT_BYTES
from trueup.server.service import Principal, Unauthorized

__all__ = ["MAX_WAIT", "register"]

MAX_WAIT = 300.0


def register(app: FastAPI, api: Api) -> None:
    plane = api.plane
    device = api.device

    @app.post(
        "/api/v1/agent/enroll",
        openapi_extra=role("enrollment"),
        responses=answers(401, 413, token=False),
    )
    def agent_enroll(authorization: str | None = Header(None)) -> ServiceRecord:
        token = bearer_token(authorization)
        if token is None:
            raise HTTPException(
                401,
                detail="send the enrollment token as Authorization: Bearer TOKEN",
                headers={"WWW-Authenticate": "Bearer"},
            )
        try:
            return dict(plane.exchange_enrollment(token))
        except Unauthorized as exc:
            raise HTTPException(
                401, detail=str(exc), headers={"WWW-Authenticate": "Bearer"}
            ) from None

    @app.get(
        "/api/v1/agent/desired",
        openapi_extra=role("device"),
        responses={
            204: {"description": "no revision newer than `after` within `wait`"},
            **answers(),
        },
    )
    async def agent_desired(
        after: int = Query(0, ge=0, le=MAX_VERSION),
        wait: float = Query(0.0, ge=0, le=MAX_WAIT),
        p: Principal = device,
    ) -> Response:
        assert p.device_id is not None and p.device is not None
        device_id, name = p.device_id, p.device
        deadline = time.monotonic() + wait
        while True:
            revision = await run_in_threadpool(plane.desired_after, device_id, name, after)
            if revision is not None:
                return JSONResponse(
                    {**revision.summary(), "document": revision.document},
                    headers={"ETag": f'"{revision.version}"'},
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return Response(status_code=204)
            await api.watcher.wait(device_id, remaining)

    @app.post(
        "/api/v1/agent/report",
        responses=answers(),
        openapi_extra={
            **role("device", max_body=REPORT_BYTES),
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": {"$ref": "#/components/schemas/AgentReport"}}
                },
            },
        },
    )
    async def agent_report(request: Request, p: Principal = device) -> Response:
        assert p.device_id is not None
        # Parsed here rather than by FastAPI: this is the hot path of every agent heartbeat.
        try:
            report = AgentReport.model_validate_json(await request.body())
        except ValidationError as exc:
            return JSONResponse(
                {"detail": "invalid report; nothing was stored", "problems": problems(exc)},
                status_code=422,
            )
        try:
            await api.ingest.submit(p.device_id, report.model_dump(mode="json"))
        except ReportRejected as exc:  # this report's values, refused by the database alone
            return JSONResponse(
                {"detail": "invalid report; nothing was stored", "problems": [f"body: {exc}"]},
                status_code=422,
            )
        return Response(b'{"stored":true}', media_type="application/json")

    @app.get("/api/v1/agent/secrets", openapi_extra=role("device"), responses=answers())
    def agent_secrets(p: Principal = device) -> ServiceRecord:
        assert p.device_id is not None
        return dict(plane.device_secrets(p.tenant_id, p.device_id))
