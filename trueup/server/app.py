"""The HTTP API (FastAPI): settings, wiring, and errors as status codes.

Every route declares who may call it in its OpenAPI operation as
`x-trueup-role`: `public` (health probes only), `viewer`, `operator` or
`admin` (user tokens; roles are ordered), `device` (a device credential; the
device sees only itself) or `enrollment` (a one-time enrollment token). The
authorisation tests read these from /openapi.json.

Another tenant's device, user or token is answered with 404, never 403, so a
caller cannot learn what exists outside its tenant.

The routes live in `trueup.server.api.routes`, one module per area; this
module builds the parts they share (`Api`) and maps service errors:
NotFound 404, Invalid 422, Conflict 409 (with the current version as ETag).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy import exc as sa_exc
from starlette.concurrency import run_in_threadpool

from trueup.model.jsontypes import JSONObject
from trueup.model.limits import PROBLEM_CHARS
from trueup.server import dashboard
from trueup.server.api.allow import AllowMiddleware
from trueup.server.api.context import MAX_PROBLEMS, Api, problems
from trueup.server.api.edge import EdgeMiddleware
from trueup.server.api.metrics import MeasureMiddleware, Metrics
from trueup.server.api.models import AgentReport
from trueup.server.api.routes import (
    agents,
    backups,
    devices,
    evidence,
    identity,
    labels,
    notifications,
    probes,
    profiles,
    revisions,
    rollouts,
    secrets,
)
from trueup.server.api.watcher import RevisionWatcher
from trueup.server.db import Database, is_unavailable
from trueup.server.ingest import ReportIngest
from trueup.server.keys import load_or_create_server_key
from trueup.server.limits import (
    BACKUP_BODY_BYTES,
    BACKUP_KEEP,
    EVIDENCE_BODY_BYTES,
    EVIDENCE_KEEP,
    excerpt,
)
from trueup.server.service import (
    Busy,
    Conflict,
    ControlPlane,
    Invalid,
    NotFound,
    Tampered,
    WrongState,
)

__all__ = ["SETTINGS_ENV", "AgentReport", "Settings", "create_app", "create_app_from_env"]

SETTINGS_ENV = "TRUEUP_SERVER_SETTINGS"

log = logging.getLogger("trueup.server")


@dataclass
class Settings:
    db_url: str
    key_file: str
    # Writable directory for the audit checkpoint and the upload spool ("": the key
    # file's directory); whether a missing key file is created or refused.
    data_dir: str = ""
    create_key: bool = True
    public_url: str = ""
    stale_intervals: int = 3
    ingest_mode: str = "batch"
    revision_poll_seconds: float = 0.5
    auth_cache_seconds: float = 2.0
    migrate: bool = True
    # Device backups: the upload's body limit, how many each device keeps (the newest),
    # and where uploads are spooled while they are hashed ("": beside the key file).
    backup_max_bytes: int = BACKUP_BODY_BYTES
    backup_keep: int = BACKUP_KEEP
    # Device evidence bundles: the upload's body limit and how many each device keeps.
    evidence_max_bytes: int = EVIDENCE_BODY_BYTES
    evidence_keep: int = EVIDENCE_KEEP
    spool_dir: str = ""
    # Notifications (docs/notifications.md): the first retry's delay (doubling up to
    # notify_max_delay), attempts before the dead-letter list, how often the notifier
    # looks for due deliveries and scans for stale heartbeats and escalations, and
    # the webhook request timeout, and the lease on a delivery being sent: a delivery
    # whose sender died is sent again once it runs out (never shorter than the timeout).
    notify_base_delay: float = 5.0
    notify_max_delay: float = 600.0
    notify_max_attempts: int = 8
    notify_poll_seconds: float = 1.0
    notify_scan_seconds: float = 5.0
    notify_timeout: float = 10.0
    notify_lease_seconds: float = 60.0
    # Rollouts (docs/fleet.md): how often the controller ticks, and how long its lease on
    # a rollout lasts (another process takes over once it runs out).
    rollout_tick_seconds: float = 1.0
    rollout_lease_seconds: float = 15.0

    def to_env(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_env(cls) -> Settings:
        return cls(**json.loads(os.environ[SETTINGS_ENV]))


def _add_error_handlers(app: FastAPI, metrics: Metrics) -> None:
    @app.exception_handler(NotFound)
    async def _not_found(_request: Request, exc: NotFound) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=404)

    @app.exception_handler(Invalid)
    async def _invalid(_request: Request, exc: Invalid) -> JSONResponse:
        return JSONResponse(
            {
                "detail": "invalid input; nothing was changed",
                # Document problems quote excerpts of the input themselves: never cut here.
                "problems": [excerpt(p, PROBLEM_CHARS) for p in exc.problems[:MAX_PROBLEMS]],
            },
            status_code=422,
        )

    @app.exception_handler(Tampered)
    async def _tampered(_request: Request, exc: Tampered) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=409)

    @app.exception_handler(Conflict)
    async def _conflict(_request: Request, exc: Conflict) -> JSONResponse:
        metrics.conflicts.inc()
        return JSONResponse(exc.body(), status_code=409, headers={"ETag": f'"{exc.current}"'})

    @app.exception_handler(Busy)
    async def _busy(_request: Request, exc: Busy) -> JSONResponse:
        metrics.conflicts.inc()
        return JSONResponse(exc.body(), status_code=409)

    @app.exception_handler(WrongState)
    async def _wrong_state(_request: Request, exc: WrongState) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=409)

    @app.exception_handler(sa_exc.DBAPIError)
    async def _database(_request: Request, exc: sa_exc.DBAPIError) -> JSONResponse:
        # A database that cannot be reached is nobody's input: 503 and a retry,
        # never the driver's message (it names the host, port and role).
        if not is_unavailable(exc):
            raise exc
        log.error("database unavailable: %s", exc)
        return JSONResponse(
            {"detail": "database unavailable; retry"},
            status_code=503,
            headers={"Retry-After": "5"},
        )

    @app.exception_handler(RequestValidationError)
    async def _request_invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(
            {"detail": "invalid request; nothing was changed", "problems": problems(exc)},
            status_code=422,
        )


def _with_report_schemas(app: FastAPI) -> None:
    """OpenAPI with the agent report's schemas as components (the report route refers to
    `#/components/schemas/AgentReport`; it parses the body itself, for speed)."""
    generate = app.openapi

    def openapi() -> JSONObject:  # the OpenAPI document
        if app.openapi_schema is None:
            schema = generate()
            report = AgentReport.model_json_schema(ref_template="#/components/schemas/{model}")
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            components.update(report.pop("$defs", {}))
            components["AgentReport"] = report
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def create_app(settings: Settings) -> FastAPI:
    metrics = Metrics()
    database = Database(settings.db_url)
    plane = ControlPlane(
        database,
        load_or_create_server_key(
            Path(settings.key_file),
            create=settings.create_key,
            data_dir=Path(settings.data_dir) if settings.data_dir else None,
        ),
        stale_intervals=settings.stale_intervals,
        auth_cache_seconds=settings.auth_cache_seconds,
        backup_keep=settings.backup_keep,
        notify={
            "base_delay": settings.notify_base_delay,
            "max_delay": settings.notify_max_delay,
            "max_attempts": settings.notify_max_attempts,
            "poll_seconds": settings.notify_poll_seconds,
            "scan_seconds": settings.notify_scan_seconds,
            "timeout": settings.notify_timeout,
            "lease_seconds": max(settings.notify_lease_seconds, settings.notify_timeout + 1.0),
        },
        evidence_keep=settings.evidence_keep,
        rollout={
            "tick_seconds": settings.rollout_tick_seconds,
            "lease_seconds": settings.rollout_lease_seconds,
        },
    )
    ingest = ReportIngest(
        database,
        mode=settings.ingest_mode,
        stale_intervals=settings.stale_intervals,
        on_batch=metrics.ingested,
        on_committed=plane.notifier.submit,
        server_key=plane.key,
    )
    watcher = RevisionWatcher(plane.desired_revisions, settings.revision_poll_seconds)
    api = Api(
        plane=plane,
        database=database,
        ingest=ingest,
        watcher=watcher,
        metrics=metrics,
        public_url=settings.public_url,
        backup_max_bytes=settings.backup_max_bytes,
        evidence_max_bytes=settings.evidence_max_bytes,
        spool_dir=settings.spool_dir
        or settings.data_dir
        or str(Path(settings.key_file).resolve().parent),
    )

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if settings.migrate:
            await run_in_threadpool(database.migrate)
        ingest.start()
        plane.notifier.start()
        plane.rollout_controller.start()
        await watcher.start()
        try:
            yield
        finally:
            await watcher.stop()
            await run_in_threadpool(plane.rollout_controller.stop)
            await run_in_threadpool(ingest.stop)
            await run_in_threadpool(plane.notifier.stop)
            database.dispose()

    app = FastAPI(
        title="trueup control plane",
        version="1",
        lifespan=lifespan,
        openapi_url=None,  # served by probes.py, behind a viewer token
        docs_url=None,
        redoc_url=None,
    )
    app.state.plane = plane
    app.state.ingest = ingest
    app.add_middleware(EdgeMiddleware, router=app.router, authenticate=api.authenticate)
    app.add_middleware(AllowMiddleware, routes=app.router.routes)
    app.add_middleware(MeasureMiddleware, metrics=metrics)
    _add_error_handlers(app, metrics)
    for area in (
        probes,
        devices,
        revisions,
        labels,
        secrets,
        identity,
        agents,
        backups,
        notifications,
        evidence,
        profiles,
        rollouts,
        dashboard,
    ):
        area.register(app, api)
    _with_report_schemas(app)
    return app


def create_app_from_env() -> FastAPI:
    """uvicorn factory for `trueup server run` (settings passed through the environment)."""
    return create_app(Settings.from_env())
