"""The dashboard's routes: login/logout, the fleet table and its live stream, the device
page and its forms (apply with If-Match, acknowledge), the evidence bundle, static files.

Routes are hidden from OpenAPI and declare the role `session` (the edge
middleware lets them through; each one checks the session cookie itself and
then the same role the matching JSON route needs: viewer to read, operator to
apply or acknowledge, admin for the audit trail). Tenants see only their own
devices: every read goes through the service layer with the caller's tenant.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, quote, urlencode

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from trueup.model.decode import DecodeError, decode_yaml
from trueup.server.api.context import Api, authorise
from trueup.server.dashboard import data, evidenceroutes
from trueup.server.dashboard.device import DevicePage, render_device, revision_diff
from trueup.server.dashboard.devicedata import load_device_page
from trueup.server.dashboard.html import esc, fleet_body, fleet_page, layout, login_page
from trueup.server.dashboard.session import COOKIE, SESSION_SECONDS, Session, Sessions
from trueup.server.limits import DOCUMENT_BYTES, TEXT_LENGTH
from trueup.server.service import Conflict, Invalid, NotFound, Principal, Unauthorized
from trueup.server.tokens import TokenKind

__all__ = ["STREAM_SECONDS", "register"]

STREAM_SECONDS = 2.0  # how often the live fleet stream looks for changes
_STREAM_LIFETIME = 300.0  # then the browser reconnects (and re-authenticates)
_FORM_BYTES = 64 * 1024
_APPLY_BYTES = DOCUMENT_BYTES * 3 + 8192  # a URL-encoded document
_STATIC = {"dashboard.css": "text/css", "dashboard.js": "text/javascript"}
_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}


def _role(name: str, max_body: int = _FORM_BYTES) -> dict[str, Any]:
    return {"x-trueup-role": name, "x-trueup-max-body": max_body}


def _html(body: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(body, status_code=status, headers=_HEADERS)


class _Redirect(Exception):
    def __init__(self, to: str) -> None:
        self.to = to


def _form(raw: bytes) -> dict[str, str]:
    try:
        parsed = parse_qs(raw.decode("utf-8"), keep_blank_values=True, max_num_fields=20)
    except (UnicodeDecodeError, ValueError):
        raise HTTPException(400, detail="a form body (UTF-8, URL-encoded) was expected") from None
    return {k: v[0] for k, v in parsed.items()}


def register(app: FastAPI, api: Api) -> None:
    plane = api.plane
    sessions = Sessions(plane.key)

    async def principal_of(session: Session) -> Principal | None:
        cached = plane.cached_principal(session.token)
        if cached is None:
            try:
                cached = await run_in_threadpool(plane.authenticate, session.token)
            except Unauthorized:
                return None
        return cached if cached.kind == TokenKind.USER else None

    async def caller(request: Request, required: str = "viewer") -> tuple[Principal, Session]:
        session = sessions.open(request.cookies.get(COOKIE))
        principal = await principal_of(session) if session else None
        if session is None or principal is None:
            raise _Redirect("/ui/login")
        try:
            authorise(principal, required)
        except HTTPException:
            raise HTTPException(
                403, detail=f"this needs the {required} role; yours is {principal.role}"
            ) from None
        return principal, session

    async def posted(request: Request, required: str) -> tuple[Principal, Session, dict[str, str]]:
        principal, session = await caller(request, required)
        form = _form(await request.body())
        if not session.csrf_ok(form.get("csrf")):
            raise HTTPException(403, detail="the form is stale or forged (CSRF check); reload")
        return principal, session, form

    def error_page(status: int, message: str) -> HTMLResponse:
        body = f'<h1>{status}</h1><p class="error" role="alert">{esc(message)}</p>'
        body += '<p><a href="/">back to the fleet</a></p>'
        return _html(layout(str(status), body), status)

    async def guarded(request: Request, required: str, work: Any) -> Response:
        try:
            result: Response = await work()
            return result
        except _Redirect as exc:
            if request.method == "GET" and request.url.path.startswith("/ui/fleet/stream"):
                return Response(status_code=401)
            return RedirectResponse(exc.to, status_code=303, headers=_HEADERS)
        except NotFound as exc:
            return error_page(404, str(exc))
        except HTTPException as exc:
            return error_page(exc.status_code, str(exc.detail))

    # -- login / logout ---------------------------------------------------------
    @app.get("/ui/login", include_in_schema=False, openapi_extra=_role("public"))
    async def login_form() -> Response:
        return _html(login_page())

    @app.post("/ui/login", include_in_schema=False, openapi_extra=_role("public"))
    async def login(request: Request) -> Response:
        token = _form(await request.body()).get("token", "").strip()
        try:
            principal = await run_in_threadpool(plane.authenticate, token) if token else None
        except Unauthorized:
            principal = None
        if principal is None or principal.kind != TokenKind.USER:
            return _html(login_page("unknown, revoked or expired user token"), 401)
        cookie, _session = sessions.seal(token)
        response = RedirectResponse("/", status_code=303, headers=_HEADERS)
        response.set_cookie(
            COOKIE,
            cookie,
            max_age=SESSION_SECONDS,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https" or api.public_url.startswith("https:"),
            path="/",
        )
        return response

    @app.post("/ui/logout", include_in_schema=False, openapi_extra=_role("session"))
    async def logout(request: Request) -> Response:
        session = sessions.open(request.cookies.get(COOKIE))
        form = _form(await request.body())
        if session is not None and not session.csrf_ok(form.get("csrf")):
            return error_page(403, "the form is stale or forged (CSRF check); reload")
        response = RedirectResponse("/ui/login", status_code=303, headers=_HEADERS)
        response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
        return response

    @app.get("/ui/static/{name}", include_in_schema=False, openapi_extra=_role("public"))
    async def static(name: str) -> Response:
        if name not in _STATIC:
            raise HTTPException(404, detail="no such file")
        content = resources.files("trueup.server.dashboard").joinpath("static", name).read_bytes()
        return Response(content, media_type=_STATIC[name], headers={"Cache-Control": "max-age=300"})

    # -- the fleet ----------------------------------------------------------------
    def filters(request: Request) -> dict[str, Any]:
        q = request.query_params
        status = q.get("status", "")
        reason = q.get("reason", "")
        try:
            page = int(q.get("page", "1"))
        except ValueError:
            page = 1
        return {
            "status": status if status in data.STATUSES else "",
            "reason": reason[:64],
            "search": q.get("q", "")[:128],
            "page": page,
        }

    @app.get("/", include_in_schema=False, openapi_extra=_role("session"))
    async def fleet(request: Request) -> Response:
        async def work() -> Response:
            principal, session = await caller(request)
            f = filters(request)
            page = await run_in_threadpool(lambda: data.fleet_page(plane, principal.tenant_id, **f))
            body = fleet_page(page, status=f["status"], reason=f["reason"], search=f["search"])
            return _html(layout("Fleet", body, principal, session.csrf))

        return await guarded(request, "viewer", work)

    @app.get("/ui/fleet/stream", include_in_schema=False, openapi_extra=_role("session"))
    async def fleet_stream(request: Request) -> Response:
        async def work() -> Response:
            principal, session = await caller(request)
            f = filters(request)

            async def events() -> AsyncIterator[str]:
                last = ""
                started = time.monotonic()
                yield f"retry: {int(STREAM_SECONDS * 1000)}\n\n"
                while time.monotonic() - started < _STREAM_LIFETIME:
                    if await request.is_disconnected():
                        return
                    if await principal_of(session) is None:
                        yield "event: logout\ndata: {}\n\n"
                        return
                    page = await run_in_threadpool(
                        lambda: data.fleet_page(plane, principal.tenant_id, **f)
                    )
                    message = json.dumps(
                        {
                            "rows": fleet_body(page),
                            "counts": page.counts,
                            "total": page.total,
                            "matched": page.matched,
                        }
                    )
                    if message != last:
                        last = message
                        yield f"event: fleet\ndata: {message}\n\n"
                    else:
                        yield ": idle\n\n"
                    await asyncio.sleep(STREAM_SECONDS)

            return StreamingResponse(
                events(),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
            )

        return await guarded(request, "viewer", work)

    # -- a device -----------------------------------------------------------------
    def device_page(principal: Principal, csrf: str, device: str, **extra: Any) -> DevicePage:
        return load_device_page(plane, principal, csrf, device, **extra)

    @app.get("/ui/devices/{device}", include_in_schema=False, openapi_extra=_role("session"))
    async def device_view(request: Request, device: str) -> Response:
        async def work() -> Response:
            principal, session = await caller(request)
            q = request.query_params
            notice = ""
            if q.get("applied"):
                notice = f"revision {q.get('applied')} stored; the agent applies it next"
            elif q.get("acked"):
                notice = "acknowledgement recorded"

            def build() -> DevicePage:
                page = device_page(principal, session.csrf, device, notice=notice)
                a, b = q.get("a"), q.get("b")
                if a and b and a.isdigit() and b.isdigit():
                    ra = plane.revision(principal.tenant_id, device, int(a))
                    rb = plane.revision(principal.tenant_id, device, int(b))
                    page.diff = (
                        ra.version,
                        rb.version,
                        revision_diff(ra.document, rb.document, ra.version, rb.version),
                    )
                return page

            page = await run_in_threadpool(build)
            return _html(layout(device, render_device(page), principal, session.csrf))

        return await guarded(request, "viewer", work)

    @app.post(
        "/ui/devices/{device}/apply",
        include_in_schema=False,
        openapi_extra=_role("session", _APPLY_BYTES),
    )
    async def apply(request: Request, device: str) -> Response:
        async def work() -> Response:
            principal, session, form = await posted(request, "operator")
            text = form.get("document", "")
            comment = form.get("comment", "")[:TEXT_LENGTH]
            expected_text = form.get("expected", "").strip()

            def attempt() -> tuple[int, DevicePage | None]:
                extra: dict[str, Any] = {"draft": text}
                try:
                    if not expected_text.isdigit():
                        raise Invalid(["expected: the version you expect to replace (If-Match)"])
                    expected = int(expected_text)
                    extra["expected"] = expected
                    try:
                        document = decode_yaml(text, max_bytes=DOCUMENT_BYTES)
                    except DecodeError as exc:
                        raise Invalid([f"(document): {exc}"]) from None
                    revision = plane.put_desired(
                        principal.tenant_id,
                        device,
                        expected,
                        document,
                        author=principal.actor,
                        comment=comment,
                    )
                except Conflict as exc:
                    api.metrics.conflicts.inc()
                    return 409, device_page(
                        principal, session.csrf, device, conflict=exc.body(), **extra
                    )
                except Invalid as exc:
                    return 422, device_page(
                        principal,
                        session.csrf,
                        device,
                        error="invalid, nothing was changed: " + "; ".join(exc.problems[:10]),
                        **extra,
                    )
                api.metrics.revisions.inc()
                api.watcher.wake(plane.device_id(principal.tenant_id, device))
                return revision.version, None

            status, page = await run_in_threadpool(attempt)
            if page is None:
                query = urlencode({"applied": status})
                return RedirectResponse(
                    f"/ui/devices/{quote(device)}?{query}", status_code=303, headers=_HEADERS
                )
            return _html(layout(device, render_device(page), principal, session.csrf), status)

        return await guarded(request, "operator", work)

    @app.post("/ui/devices/{device}/ack", include_in_schema=False, openapi_extra=_role("session"))
    async def acknowledge(request: Request, device: str) -> Response:
        async def work() -> Response:
            principal, session, form = await posted(request, "operator")

            def attempt() -> DevicePage | None:
                try:
                    seconds = float(form.get("for_seconds", "0"))
                except ValueError:
                    seconds = 0.0
                try:
                    plane.acknowledge(
                        principal.tenant_id,
                        device,
                        form.get("subsystem", "")[:64],
                        seconds,
                        form.get("reason", "")[:TEXT_LENGTH],
                        principal.actor,
                    )
                except Invalid as exc:
                    return device_page(
                        principal,
                        session.csrf,
                        device,
                        error="not acknowledged: " + "; ".join(exc.problems),
                    )
                return None

            page = await run_in_threadpool(attempt)
            if page is None:
                return RedirectResponse(
                    f"/ui/devices/{quote(device)}?acked=1#acks", status_code=303, headers=_HEADERS
                )
            return _html(layout(device, render_device(page), principal, session.csrf), 422)

        return await guarded(request, "operator", work)

    evidenceroutes.register(
        app,
        plane,
        caller=caller,
        posted=posted,
        guarded=guarded,
        device_page=device_page,
        session_role=_role("session"),
        headers=_HEADERS,
    )
