"""Probes, metrics and the OpenAPI document.

`/healthz` and `/readyz` are the only routes without a token: a load balancer
must be able to ask. `/readyz` answers 503 while the database does not.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool

from trueup.model.jsontypes import JSONObject
from trueup.server.api.context import Api, role
from trueup.server.api.responses import answers
from trueup.server.service import Principal

__all__ = ["register"]

log = logging.getLogger("trueup.server")


def register(app: FastAPI, api: Api) -> None:

    @app.get("/healthz", openapi_extra=role("public"))
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get(
        "/readyz",
        openapi_extra=role("public"),
        responses={
            503: {
                "description": "the database does not answer (why is in the server's log)",
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "properties": {
                                "status": {"type": "string"},
                                "detail": {"type": "string"},
                            },
                        }
                    }
                },
            }
        },
    )
    async def readyz() -> JSONResponse:
        def probe() -> None:
            with api.database.read() as conn:
                conn.exec_driver_sql("SELECT 1")

        try:
            await run_in_threadpool(probe)
        except Exception:
            # The cause names hosts, ports and roles: for the log, not for anonymous callers.
            log.exception("readiness probe: the database did not answer")
            return JSONResponse(
                {"status": "unavailable", "detail": "database unavailable"}, status_code=503
            )
        return JSONResponse({"status": "ready"})

    @app.get(
        "/metrics",
        openapi_extra=role("admin"),
        response_class=PlainTextResponse,
        responses={
            200: {
                "description": "Prometheus text exposition",
                "content": {"text/plain": {"schema": {"type": "string"}}},
            },
            **answers(),
        },
    )
    async def prometheus(_p: Principal = api.admin) -> Response:
        return Response(generate_latest(api.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/openapi.json", openapi_extra=role("viewer"), responses=answers())
    async def openapi(_p: Principal = api.viewer) -> JSONObject:
        return app.openapi()
