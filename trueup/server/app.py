"""The HTTP API (FastAPI).

Every route declares who may call it in its OpenAPI operation as
`x-trueup-role`: `public` (health probes only), `viewer`, `operator` or
`admin` (user tokens; roles are ordered), `device` (a device credential; the
device sees only itself) or `enrollment` (a one-time enrollment token). The
authorisation tests read these from /openapi.json.

Another tenant's device, user or token is answered with 404, never 403, so a
caller cannot learn what exists outside its tenant.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml
from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from trueup.model.health import SubsystemHealth
from trueup.model.reasons import ReasonCode
from trueup.server.db import Database
from trueup.server.ingest import ReportIngest
from trueup.server.keys import load_or_create_server_key
from trueup.server.service import (
    Conflict,
    ControlPlane,
    Invalid,
    NotFound,
    Principal,
    Unauthorized,
)
from trueup.server.tokens import Role, TokenKind, role_at_least

__all__ = ["Settings", "create_app", "create_app_from_env"]

SETTINGS_ENV = "TRUEUP_SERVER_SETTINGS"
MAX_WAIT = 300.0


@dataclass
class Settings:
    db_url: str
    key_file: str
    public_url: str = ""
    stale_intervals: int = 3
    ingest_mode: str = "batch"
    revision_poll_seconds: float = 0.5
    auth_cache_seconds: float = 2.0
    migrate: bool = True

    def to_env(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_env(cls) -> Settings:
        return cls(**json.loads(os.environ[SETTINGS_ENV]))


class SubsystemReport(BaseModel):
    model_config = ConfigDict(extra="allow")
    health: SubsystemHealth
    reason: str | None = None
    since: str | float | None = None


DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}$"
MAX_VERSION = 2**31 - 1  # an INTEGER column on both databases


class OverrideReport(BaseModel):
    """A local apply that overrides the control plane's revision, as the agent reports it."""

    model_config = ConfigDict(extra="allow")
    version: int = Field(ge=0, le=MAX_VERSION)
    actor: str = Field("", max_length=200)
    at: str | None = Field(None, max_length=64)
    reason: str = Field("", max_length=1000)
    digest: str | None = Field(None, pattern=DIGEST_PATTERN)


class AgentReport(BaseModel):
    """What an agent reports after every change and on every heartbeat.

    Unknown fields are kept with the report (evidence), so newer agents can add some.
    `applied_digest` is `document_digest` of the applied document (metadata.version
    ignored), compared with the desired revision's content_hash; `applied_origin`
    says where that document came from; `override` is set while a local apply
    overrides the control plane's revision.
    """

    model_config = ConfigDict(extra="allow")
    applied_version: int | None = Field(None, ge=0, le=MAX_VERSION)
    observed_digest: str | None = Field(None, max_length=80, pattern=r"^[\x21-\x7e]*$")
    applied_digest: str | None = Field(None, pattern=DIGEST_PATTERN)
    applied_origin: str | None = Field(
        None, min_length=1, max_length=32, pattern=r"^[a-z0-9][a-z0-9._-]*$"
    )
    override: OverrideReport | None = None
    diff_summary: dict[str, Any] = {}
    subsystems: dict[str, SubsystemReport] = {}
    reason_codes: list[ReasonCode] = []
    findings: list[dict[str, Any]] = []
    journal: dict[str, Any] = {}
    heartbeat_interval: float = Field(30.0, gt=0, le=86400)
    agent_version: str | None = None
    management_ready: bool | None = None


class DeviceCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str


class UserCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    role: Role


class RoleChange(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Role


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    label: str = ""


class AckCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    subsystem: str
    for_seconds: float
    reason: str


class SecretPut(BaseModel):
    model_config = ConfigDict(extra="forbid")
    value: str = Field(max_length=65536)


class _Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "trueup_server_http_requests",
            "HTTP requests by route template, method and status",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "trueup_server_http_request_seconds",
            "HTTP request latency by route template",
            ["route"],
            registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 30),
        )
        self.reports = Counter(
            "trueup_server_reports_ingested", "Agent reports committed", registry=self.registry
        )
        self.batch = Histogram(
            "trueup_server_ingest_batch_size",
            "Reports per ingest transaction",
            registry=self.registry,
            buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000),
        )
        self.revisions = Counter(
            "trueup_server_revisions_created", "Desired revisions created", registry=self.registry
        )
        self.conflicts = Counter(
            "trueup_server_conflicts",
            "Writes refused with STATE_CONCURRENT_MODIFICATION",
            registry=self.registry,
        )

    def ingested(self, count: int) -> None:
        self.reports.inc(count)
        self.batch.observe(count)


class RevisionWatcher:
    """Wakes long polls: at once for revisions made here, within a poll interval otherwise."""

    def __init__(self, plane: ControlPlane, poll_seconds: float) -> None:
        self.plane = plane
        self.poll_seconds = poll_seconds
        self._events: dict[int, asyncio.Event] = {}
        self._waiters: dict[int, int] = {}
        self._task: asyncio.Task[None] | None = None
        self._seen_id = 0

    async def start(self) -> None:
        self._seen_id = await run_in_threadpool(self.plane.max_revision_id)
        self._task = asyncio.create_task(self._poll())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task

    def wake(self, device_id: int) -> None:
        event = self._events.get(device_id)
        if event is not None:
            event.set()

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_seconds)
            if not self._events:
                continue
            try:
                newest = await run_in_threadpool(self._newer_devices)
            except Exception:
                continue
            for device_id in newest:
                self.wake(device_id)

    def _newer_devices(self) -> set[int]:
        rows = self.plane.revisions_since(self._seen_id)
        if rows:
            self._seen_id = max(self._seen_id, *(revision_id for revision_id, _ in rows))
        return {device_id for _, device_id in rows}

    async def wait(self, device_id: int, timeout: float) -> None:
        event = self._events.setdefault(device_id, asyncio.Event())
        self._waiters[device_id] = self._waiters.get(device_id, 0) + 1
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            pass
        finally:
            self._waiters[device_id] -= 1
            if self._waiters[device_id] == 0:
                del self._waiters[device_id]
                self._events.pop(device_id, None)
            else:
                event.clear()


class _MeasureMiddleware:
    """Counts requests and latency per route template (plain ASGI: cheap on the hot path)."""

    def __init__(self, app: ASGIApp, metrics: _Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_with_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_with_status)
        finally:
            template = getattr(scope.get("route"), "path", "(unmatched)")
            self.metrics.requests.labels(template, scope["method"], str(status)).inc()
            self.metrics.latency.labels(template).observe(time.perf_counter() - started)


def _problems(exc: RequestValidationError | ValidationError) -> list[str]:
    """`path: message` per problem; a report parsed by hand gets the same `body.` prefix."""
    prefix = ("body",) if isinstance(exc, ValidationError) else ()
    problems = []
    for error in exc.errors():
        loc = ".".join(str(p) for p in (*prefix, *error.get("loc", ())))
        problems.append(f"{loc}: {error.get('msg', 'invalid')}")
    return problems


def _role(name: str) -> dict[str, Any]:
    return {"x-trueup-role": name}


def _parse_if_match(value: str | None) -> int:
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


def create_app(settings: Settings) -> FastAPI:
    metrics = _Metrics()
    database = Database(settings.db_url)
    plane = ControlPlane(
        database,
        load_or_create_server_key(Path(settings.key_file)),
        stale_intervals=settings.stale_intervals,
        auth_cache_seconds=settings.auth_cache_seconds,
    )
    ingest = ReportIngest(
        database,
        mode=settings.ingest_mode,
        stale_intervals=settings.stale_intervals,
        on_batch=metrics.ingested,
    )
    watcher = RevisionWatcher(plane, settings.revision_poll_seconds)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if settings.migrate:
            await run_in_threadpool(database.migrate)
        ingest.start()
        await watcher.start()
        try:
            yield
        finally:
            await watcher.stop()
            await run_in_threadpool(ingest.stop)
            database.dispose()

    app = FastAPI(
        title="trueup control plane",
        version="1",
        lifespan=lifespan,
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
    )
    app.state.plane = plane
    app.state.ingest = ingest

    app.add_middleware(_MeasureMiddleware, metrics=metrics)

    @app.exception_handler(NotFound)
    async def _not_found(_request: Request, exc: NotFound) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=404)

    @app.exception_handler(Invalid)
    async def _invalid(_request: Request, exc: Invalid) -> JSONResponse:
        return JSONResponse(
            {"detail": "invalid input; nothing was changed", "problems": exc.problems},
            status_code=422,
        )

    @app.exception_handler(Conflict)
    async def _conflict(_request: Request, exc: Conflict) -> JSONResponse:
        metrics.conflicts.inc()
        return JSONResponse(exc.body(), status_code=409, headers={"ETag": f'"{exc.current}"'})

    @app.exception_handler(RequestValidationError)
    async def _request_invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = _problems(exc)
        return JSONResponse(
            {"detail": "invalid request; nothing was changed", "problems": problems},
            status_code=422,
        )

    async def _principal(authorization: str | None) -> Principal:
        if not authorization or not authorization.startswith("Bearer "):
            raise HTTPException(
                401,
                detail="a bearer token is required (Authorization: Bearer TOKEN)",
                headers={"WWW-Authenticate": "Bearer"},
            )
        token = authorization[len("Bearer ") :].strip()
        cached = plane.cached_principal(token)
        if cached is not None:
            return cached
        try:
            return await run_in_threadpool(plane.authenticate, token)
        except Unauthorized as exc:
            raise HTTPException(
                401, detail=str(exc), headers={"WWW-Authenticate": "Bearer"}
            ) from None

    def user_with(role: Role) -> Callable[..., Awaitable[Principal]]:
        async def dependency(authorization: str | None = Header(None)) -> Principal:
            principal = await _principal(authorization)
            if (
                principal.kind != TokenKind.USER
                or principal.role is None
                or not role_at_least(principal.role, role)
            ):
                raise HTTPException(403, detail=f"this route needs a user token with role {role}")
            return principal

        return dependency

    async def device_principal(authorization: str | None = Header(None)) -> Principal:
        principal = await _principal(authorization)
        if principal.kind != TokenKind.DEVICE:
            raise HTTPException(403, detail="this route needs a device credential")
        return principal

    viewer = Depends(user_with(Role.VIEWER))
    operator = Depends(user_with(Role.OPERATOR))
    admin = Depends(user_with(Role.ADMIN))
    device = Depends(device_principal)

    # -- probes, metrics, schema ------------------------------------------------------------

    @app.get("/healthz", openapi_extra=_role("public"))
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", openapi_extra=_role("public"))
    async def readyz() -> JSONResponse:
        def probe() -> None:
            with database.read() as conn:
                conn.exec_driver_sql("SELECT 1")

        try:
            await run_in_threadpool(probe)
        except Exception as exc:
            return JSONResponse({"status": "unavailable", "detail": str(exc)}, status_code=503)
        return JSONResponse({"status": "ready"})

    @app.get("/metrics", openapi_extra=_role("admin"))
    async def prometheus(_p: Principal = admin) -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/openapi.json", openapi_extra=_role("viewer"))
    async def openapi(_p: Principal = viewer) -> dict[str, Any]:
        return app.openapi()

    # -- devices, fleet ------------------------------------------------------------------------

    @app.get("/api/v1/devices", openapi_extra=_role("viewer"))
    async def list_devices(
        status: str | None = Query(
            None, description="in_sync | drift | version_skew | local_override | …"
        ),
        reason: str | None = Query(None, description="a reason code, e.g. STATE_VERSION_SKEW"),
        p: Principal = viewer,
    ) -> dict[str, Any]:
        entries = await run_in_threadpool(plane.fleet, p.tenant_id)
        if status:
            entries = [e for e in entries if status in e["conditions"]]
        if reason:
            entries = [e for e in entries if reason in e["reason_codes"]]
        return {"devices": entries, "count": len(entries)}

    @app.post("/api/v1/devices", status_code=201, openapi_extra=_role("operator"))
    def create_device(body: DeviceCreate, p: Principal = operator) -> dict[str, Any]:
        plane.create_device(p.tenant_id, body.name, p.actor)
        return {"device": body.name}

    @app.get("/api/v1/devices/{device}", openapi_extra=_role("viewer"))
    def get_device(device: str, p: Principal = viewer) -> dict[str, Any]:
        entry = plane.fleet(p.tenant_id, device)[0]
        entry["last_report"] = plane.last_report(p.tenant_id, device)
        return entry

    @app.get("/api/v1/devices/{device}/desired", openapi_extra=_role("viewer"))
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
            **_role("operator"),
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
        expected = _parse_if_match(if_match)
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
        metrics.revisions.inc()
        device_id = await run_in_threadpool(plane.device_id, p.tenant_id, device)
        watcher.wake(device_id)
        response.headers["ETag"] = f'"{revision.version}"'
        return revision.summary()

    @app.get("/api/v1/devices/{device}/revisions", openapi_extra=_role("viewer"))
    def list_revisions(device: str, p: Principal = viewer) -> dict[str, Any]:
        return {"revisions": [r.summary() for r in plane.revisions(p.tenant_id, device)]}

    @app.get("/api/v1/devices/{device}/revisions/{version}", openapi_extra=_role("viewer"))
    def get_revision(device: str, version: int, p: Principal = viewer) -> dict[str, Any]:
        revision = plane.revision(p.tenant_id, device, version)
        return {**revision.summary(), "document": revision.document}

    @app.get("/api/v1/devices/{device}/reports", openapi_extra=_role("viewer"))
    def list_reports(
        device: str, limit: int = Query(50, ge=1, le=1000), p: Principal = viewer
    ) -> dict[str, Any]:
        return {"reports": plane.report_history(p.tenant_id, device, limit)}

    @app.post("/api/v1/devices/{device}/enrollment", status_code=201, openapi_extra=_role("admin"))
    def enroll(device: str, p: Principal = admin) -> dict[str, Any]:
        return plane.enroll(
            p.tenant_id, device, p.actor, url=settings.public_url, create_missing=False
        )

    @app.post("/api/v1/devices/{device}/acks", status_code=201, openapi_extra=_role("operator"))
    def acknowledge(device: str, body: AckCreate, p: Principal = operator) -> dict[str, Any]:
        return plane.acknowledge(
            p.tenant_id, device, body.subsystem, body.for_seconds, body.reason, p.actor
        )

    @app.get("/api/v1/devices/{device}/secrets", openapi_extra=_role("operator"))
    def list_secrets(device: str, p: Principal = operator) -> dict[str, Any]:
        return {"secrets": plane.secret_names(p.tenant_id, device)}

    @app.put(
        "/api/v1/devices/{device}/secrets/{name}", status_code=201, openapi_extra=_role("admin")
    )
    def put_secret(device: str, name: str, body: SecretPut, p: Principal = admin) -> dict[str, Any]:
        return plane.put_secret(p.tenant_id, device, name, body.value, p.actor)

    # -- users, tokens, audit ------------------------------------------------------------------

    @app.get("/api/v1/users", openapi_extra=_role("admin"))
    def list_users(p: Principal = admin) -> dict[str, Any]:
        return {"users": plane.list_users(p.tenant_id)}

    @app.post("/api/v1/users", status_code=201, openapi_extra=_role("admin"))
    def create_user(body: UserCreate, p: Principal = admin) -> dict[str, Any]:
        plane.create_user(p.tenant_id, body.name, body.role, p.actor)
        return {"user": body.name, "role": body.role.value}

    @app.put("/api/v1/users/{user}/role", openapi_extra=_role("admin"))
    def change_role(user: str, body: RoleChange, p: Principal = admin) -> dict[str, Any]:
        plane.set_role(p.tenant_id, user, body.role, p.actor)
        return {"user": user, "role": body.role.value}

    @app.post("/api/v1/users/{user}/tokens", status_code=201, openapi_extra=_role("admin"))
    def create_token(user: str, body: TokenCreate, p: Principal = admin) -> dict[str, Any]:
        token_id, token = plane.create_token(p.tenant_id, user, p.actor, body.label)
        return {"id": token_id, "user": user, "token": token}

    @app.get("/api/v1/tokens", openapi_extra=_role("admin"))
    def list_tokens(p: Principal = admin) -> dict[str, Any]:
        return {"tokens": plane.list_tokens(p.tenant_id)}

    @app.post("/api/v1/tokens/{token_id}/revoke", openapi_extra=_role("admin"))
    def revoke_token(token_id: int, p: Principal = admin) -> dict[str, Any]:
        plane.revoke_token(p.tenant_id, token_id, p.actor)
        return {"id": token_id, "revoked": True}

    @app.get("/api/v1/audit", openapi_extra=_role("admin"))
    def list_audit(limit: int = Query(100, ge=1, le=10000), p: Principal = admin) -> dict[str, Any]:
        return {"entries": plane.audit_entries(p.tenant_id, limit)}

    # -- agents -----------------------------------------------------------------------------------

    @app.post("/api/v1/agent/enroll", openapi_extra=_role("enrollment"))
    def agent_enroll(authorization: str | None = Header(None)) -> dict[str, Any]:
        if not authorization or not authorization.startswith("Bearer "):
            raise HTTPException(
                401,
                detail="send the enrollment token as Authorization: Bearer TOKEN",
                headers={"WWW-Authenticate": "Bearer"},
            )
        try:
            return plane.exchange_enrollment(authorization[len("Bearer ") :].strip())
        except Unauthorized as exc:
            raise HTTPException(401, detail=str(exc)) from None

    @app.get(
        "/api/v1/agent/desired",
        openapi_extra=_role("device"),
        responses={204: {"description": "no revision newer than `after` within `wait`"}},
    )
    async def agent_desired(
        after: int = Query(0, ge=0),
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
            await watcher.wait(device_id, remaining)

    @app.post(
        "/api/v1/agent/report",
        openapi_extra={
            **_role("device"),
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": AgentReport.model_json_schema()}},
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
                {"detail": "invalid report; nothing was stored", "problems": _problems(exc)},
                status_code=422,
            )
        await ingest.submit(p.device_id, report.model_dump(mode="json"))
        return Response(b'{"stored":true}', media_type="application/json")

    @app.get("/api/v1/agent/secrets", openapi_extra=_role("device"))
    def agent_secrets(p: Principal = device) -> dict[str, Any]:
        return plane.device_secrets(p)

    return app


def create_app_from_env() -> FastAPI:
    """uvicorn factory for `trueup server run` (settings passed through the environment)."""
    return create_app(Settings.from_env())
