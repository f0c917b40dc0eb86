"""Probes, metrics and the OpenAPI document.

`/healthz` and `/readyz` are the only routes without a token: a load balancer
must be able to ask. `/readyz` answers 503 while the database does not.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Response
from fastapi.responses import JSONResponse
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool

from trueup.server.api.context import Api, role
from trueup.server.service import Principal

__all__ = ["register"]


def register(app: FastAPI, api: Api) -> None:

    @app.get("/healthz", openapi_extra=role("public"))
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", openapi_extra=role("public"))
    async def readyz() -> JSONResponse:
        def probe() -> None:
            with api.database.read() as conn:
                conn.exec_driver_sql("SELECT 1")

        try:
            await run_in_threadpool(probe)
        except Exception as exc:
            return JSONResponse({"status": "unavailable", "detail": str(exc)}, status_code=503)
        return JSONResponse({"status": "ready"})

    @app.get("/metrics", openapi_extra=role("admin"))
    async def prometheus(_p: Principal = api.admin) -> Response:
        return Response(generate_latest(api.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/openapi.json", openapi_extra=role("viewer"))
    async def openapi(_p: Principal = api.viewer) -> dict[str, Any]:
        return app.openapi()
