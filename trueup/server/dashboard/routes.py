"""The dashboard's routes: the fleet table and its live stream, the device
page, its live stream and its forms (apply with If-Match, acknowledge), the evidence
bundle, static files. Sign-in and sign-out are `loginroutes`.

Routes are hidden from OpenAPI and declare the role `session` (the edge
middleware lets them through; each one checks the session cookie itself and
then the same role the matching JSON route needs: viewer to read, operator to
apply or acknowledge, admin for the audit trail). Tenants see only their own
devices: every read goes through the service layer with the caller's tenant.

Why this module is over 400 lines: every dashboard route shares the session,
CSRF and role checks defined at the top of `register` (closures over one
`Sessions`); the fleet and device streams and the forms are each a short
handler beside them, and splitting would pass those checks around by hand.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, quote, urlencode

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from trueup.model.decode import DecodeError, decode_yaml
from trueup.model.layering import SelectorError, parse_selector
from trueup.server.api.context import Api, authorise
from trueup.server.dashboard import data, evidenceroutes, loginroutes, rolloutroutes
from trueup.server.dashboard.device import DevicePage, live_parts, render_device, revision_diff
from trueup.server.dashboard.devicedata import load_device_page
from trueup.server.dashboard.html import esc, fleet_body, fleet_page, layout
from trueup.server.dashboard.session import COOKIE, Session, Sessions
from trueup.server.inputs import (
    ACK_REASON,
    ACK_SECONDS,
    COMMENT,
    DEVICE,
    EXPECTED_VERSION,
    PAGE,
    REVISION,
    SEARCH,
    SUBSYSTEM,
    InputError,
)
from trueup.server.limits import DOCUMENT_BYTES, SELECTOR_LENGTH
from trueup.server.service import (
    Busy,
    Conflict,
    Invalid,
    NotFound,
    Principal,
    Tampered,
    Unauthorized,
)
from trueup.server.tokens import TokenKind

__all__ = ["DEVICE_STREAM_SECONDS", "STREAM_SECONDS", "register"]

STREAM_SECONDS = 2.0  # how often the live fleet stream looks for changes
DEVICE_STREAM_SECONDS = 1.0  # how often a device page's stream looks for changes
_STREAM_LIFETIME = 300.0  # then the browser reconnects (and re-authenticates)
_FORM_BYTES = 64 * 1024
_APPLY_BYTES = DOCUMENT_BYTES * 3 + 8192  # a URL-encoded document
_STATIC = {"dashboard.css": "text/css", "dashboard.js": "text/javascript"}
_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    # same-origin, not no-referrer: under no-referrer a browser sends `Origin: null`
    # with the page's own form posts, and sign-in/out check Origin (sameorigin.py).
    "Referrer-Policy": "same-origin",
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


def _live(
    request: Request,
    signed_in: Callable[[], Awaitable[bool]],
    event: str,
    seconds: float,
    look: Callable[[], Awaitable[str | None]],
) -> StreamingResponse:
    """A server-sent event stream: `look()`'s message as `event` whenever it changes,
    every `seconds`, for `_STREAM_LIFETIME` (then the browser reconnects and signs in
    again); `logout` once the session ends, `gone` when `look()` finds nothing."""

    async def events() -> AsyncIterator[str]:
        last = ""
        started = time.monotonic()
        yield f"retry: {int(seconds * 1000)}\n\n"
        while time.monotonic() - started < _STREAM_LIFETIME:
            if await request.is_disconnected():
                return
            if not await signed_in():
                yield "event: logout\ndata: {}\n\n"
                return
            message = await look()
            if message is None:
                yield "event: gone\ndata: {}\n\n"
                return
            if message != last:
                last = message
                yield f"event: {event}\ndata: {message}\n\n"
            else:
                yield ": idle\n\n"
            await asyncio.sleep(seconds)

    return StreamingResponse(
        events(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


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
            # A device name that cannot exist is refused before any query (inputs.py).
            if "device" in request.path_params:
                DEVICE.parse("device", request.path_params["device"])
            result: Response = await work()
            return result
        except _Redirect as exc:
            if request.method == "GET" and request.url.path.endswith("/stream"):
                return Response(status_code=401)
            return RedirectResponse(exc.to, status_code=303, headers=_HEADERS)
        except NotFound as exc:
            return error_page(404, str(exc))
        except Tampered as exc:
            return error_page(409, str(exc))
        except InputError as exc:
            return error_page(422, str(exc))
        except HTTPException as exc:
            return error_page(exc.status_code, str(exc.detail))

    # -- login / logout (loginroutes.py) ----------------------------------------
    loginroutes.register(app, api, sessions, parse_form=_form, html=_html, headers=_HEADERS)

    @app.get("/ui/static/{name}", include_in_schema=False, openapi_extra=_role("public"))
    async def static(name: str) -> Response:
        if name not in _STATIC:
            raise HTTPException(404, detail="no such file")
        content = resources.files("trueup.server.dashboard").joinpath("static", name).read_bytes()
        return Response(content, media_type=_STATIC[name], headers={"Cache-Control": "max-age=300"})

    # -- the fleet ----------------------------------------------------------------
    def filters(request: Request) -> tuple[dict[str, Any], list[str]]:
        """The fleet's filters from the URL, and a problem for each unknown value (an
        unknown status or reason code is never quietly dropped: it would show a fleet
        that does not match what the URL asks for)."""
        q = request.query_params
        status = q.get("status", "")
        reason = q.get("reason", "")
        problems = data.filter_problems(status=status, reason=reason)
        search, page = "", 1
        try:
            search = SEARCH.parse("q", q.get("q", ""))
        except InputError as exc:
            problems.append(str(exc))
        selector = q.get("selector", "")
        if len(selector) > SELECTOR_LENGTH:
            problems.append(f"selector: longer than {SELECTOR_LENGTH} characters")
            selector = ""
        try:
            parse_selector(selector)
        except SelectorError as exc:
            problems.append(f"selector: {exc}")
            selector = ""
        try:
            page = PAGE.parse("page", q.get("page", "1"))
        except InputError as exc:
            problems.append(str(exc))
        return {
            "status": status if status in data.STATUSES else "",
            "reason": reason if reason in data.REASONS else "",
            "search": search,
            "selector": selector,
            "page": page,
        }, problems

    @app.get("/", include_in_schema=False, openapi_extra=_role("session"))
    async def fleet(request: Request) -> Response:
        async def work() -> Response:
            principal, session = await caller(request)
            f, problems = filters(request)
            page = await run_in_threadpool(lambda: data.fleet_page(plane, principal.tenant_id, **f))
            body = fleet_page(
                page,
                status=f["status"],
                reason=f["reason"],
                search=f["search"],
                selector=f["selector"],
                problems=problems,
            )
            return _html(layout("Fleet", body, principal, session.csrf), 422 if problems else 200)

        return await guarded(request, "viewer", work)

    @app.get("/ui/fleet/stream", include_in_schema=False, openapi_extra=_role("session"))
    async def fleet_stream(request: Request) -> Response:
        async def work() -> Response:
            principal, session = await caller(request)
            f, problems = filters(request)
            if problems:
                raise HTTPException(422, detail="; ".join(problems))

            async def look() -> str:
                page = await run_in_threadpool(
                    lambda: data.fleet_page(plane, principal.tenant_id, **f)
                )
                return json.dumps(
                    {
                        "rows": fleet_body(page),
                        "counts": page.counts,
                        "total": page.total,
                        "matched": page.matched,
                    }
                )

            async def signed_in() -> bool:
                return await principal_of(session) is not None

            return _live(request, signed_in, "fleet", STREAM_SECONDS, look)

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
                applied = REVISION.parse("applied", q.get("applied"))
                notice = f"revision {applied} stored; the agent applies it next"
            elif q.get("acked"):
                notice = "acknowledgement recorded"

            # The revisions to compare: both or neither (the form sends both).
            compare = None
            if q.get("a") is not None or q.get("b") is not None:
                compare = (REVISION.parse("a", q.get("a", "")), REVISION.parse("b", q.get("b", "")))

            def build() -> DevicePage:
                page = device_page(principal, session.csrf, device, notice=notice)
                if compare is not None:
                    ra = plane.revision(principal.tenant_id, device, compare[0])
                    rb = plane.revision(principal.tenant_id, device, compare[1])
                    page.diff = (
                        ra.version,
                        rb.version,
                        revision_diff(ra.document, rb.document, ra.version, rb.version),
                    )
                return page

            page = await run_in_threadpool(build)
            return _html(layout(device, render_device(page), principal, session.csrf))

        return await guarded(request, "viewer", work)

    @app.get("/ui/devices/{device}/stream", include_in_schema=False, openapi_extra=_role("session"))
    async def device_stream(request: Request, device: str) -> Response:
        """The device page's live parts (`live_parts`), sent when they change."""

        async def work() -> Response:
            principal, session = await caller(request)
            # Not found outside the caller's tenant: answered before the stream starts.
            await run_in_threadpool(plane.fleet, principal.tenant_id, device)

            async def look() -> str | None:
                try:
                    page = await run_in_threadpool(
                        lambda: device_page(principal, session.csrf, device)
                    )
                except NotFound:
                    return None
                return json.dumps(live_parts(page))

            async def signed_in() -> bool:
                return await principal_of(session) is not None

            return _live(request, signed_in, "device", DEVICE_STREAM_SECONDS, look)

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

            def attempt() -> tuple[int, DevicePage | None]:
                extra: dict[str, Any] = {"draft": text}
                try:
                    try:
                        expected = EXPECTED_VERSION.parse("expected", form.get("expected", ""))
                        comment = COMMENT.parse("comment", form.get("comment", ""))
                    except InputError as exc:
                        raise Invalid([str(exc)]) from None
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
                except Busy as exc:  # a rollout holds the device: refused, naming it
                    api.metrics.conflicts.inc()
                    return 409, device_page(
                        principal, session.csrf, device, error=str(exc), **extra
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
                    fields = [
                        (rule, name, form.get(name, ""))
                        for rule, name in (
                            (SUBSYSTEM, "subsystem"),
                            (ACK_SECONDS, "for_seconds"),
                            (ACK_REASON, "reason"),
                        )
                    ]
                    problems = [p for rule, name, raw in fields for p in rule.problems(name, raw)]
                    if problems:
                        raise Invalid(problems)
                    subsystem, seconds, reason = (rule.parse(n, raw) for rule, n, raw in fields)
                    plane.acknowledge(
                        principal.tenant_id, device, subsystem, seconds, reason, principal.actor
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

    def rollout_stream(
        request: Request, session: Session, look: Callable[[], Awaitable[str | None]]
    ) -> Response:
        async def signed_in() -> bool:
            return await principal_of(session) is not None

        return _live(request, signed_in, "device", DEVICE_STREAM_SECONDS, look)

    rolloutroutes.register(
        app,
        plane,
        caller=caller,
        posted=posted,
        guarded=guarded,
        stream=rollout_stream,
        html=_html,
        session_role=_role("session"),
        headers=_HEADERS,
    )
