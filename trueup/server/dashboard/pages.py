"""How a dashboard page route is declared: `Pages.get` and `Pages.post`.

Every page route is hidden from OpenAPI and declares the role `session` (the edge
middleware lets it through; the route checks the session cookie itself). A route
declared with `@pages.get(path, role)` or `@pages.post(path, role)`:

1. refuses a device name that cannot exist, and runs the route's own `check` of the
   request, before anything else (inputs.py);
2. opens the session cookie and re-authenticates its token (a revoked token or a lowered
   role takes effect on the next page): no session sends the browser to /ui/login (a
   stream answers 401), a role below `role` is a 403 page;
3. for a POST, parses the URL-encoded form and checks its CSRF token against the session;
4. calls the handler with a `PageCall` (the request, the principal, the session, the
   form), which renders with `call.page(title, body, status)` or answers
   `call.redirect(to)`;
5. turns the service's refusals into the dashboard's error page: NotFound 404,
   Tampered 409, InputError 422, an HTTPException its status.

Sign-in and sign-out (loginroutes.py) have no session to check yet; they use the page
headers, the form parser and `Pages.html` from here, and their own same-origin checks.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import parse_qs

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from trueup.server.api.context import Api, authorise, role
from trueup.server.dashboard.html import esc, layout
from trueup.server.dashboard.session import COOKIE, Session, Sessions
from trueup.server.inputs import DEVICE, InputError
from trueup.server.limits import DOCUMENT_BYTES
from trueup.server.service import ControlPlane, NotFound, Principal, Tampered, Unauthorized
from trueup.server.tokens import TokenKind

__all__ = [
    "APPLY_BYTES",
    "FORM_BYTES",
    "HEADERS",
    "STREAM_LIFETIME",
    "PageCall",
    "PageHandler",
    "PageRoute",
    "Pages",
    "parse_form",
]

STREAM_LIFETIME = 300.0  # then the browser reconnects (and re-authenticates)
FORM_BYTES = 64 * 1024  # the body limit of a dashboard form
APPLY_BYTES = DOCUMENT_BYTES * 3 + 8192  # a form carrying a URL-encoded document
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    # same-origin, not no-referrer: under no-referrer a browser sends `Origin: null`
    # with the page's own form posts, and sign-in/out check Origin (sameorigin.py).
    "Referrer-Policy": "same-origin",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}


def parse_form(raw: bytes) -> dict[str, str]:
    """A URL-encoded form body (the first value of each field); 400 when it is not one."""
    try:
        parsed = parse_qs(raw.decode("utf-8"), keep_blank_values=True, max_num_fields=20)
    except (UnicodeDecodeError, ValueError):
        raise HTTPException(400, detail="a form body (UTF-8, URL-encoded) was expected") from None
    return {k: v[0] for k, v in parsed.items()}


class _SignIn(Exception):
    """No session, or one whose token no longer authenticates: sign in first."""


@dataclass(frozen=True)
class PageCall:
    """One call of a page route by a signed-in user."""

    request: Request
    principal: Principal
    session: Session
    form: dict[str, str] = field(default_factory=dict)

    @property
    def tenant_id(self) -> int:
        return self.principal.tenant_id

    @property
    def csrf(self) -> str:
        return self.session.csrf

    def path(self, name: str) -> str:
        """A parameter of the route's path, as the URL gave it."""
        return str(self.request.path_params[name])

    def query(self, name: str, default: str = "") -> str:
        return self.request.query_params.get(name, default)

    def page(self, title: str, body: str, status: int = 200) -> HTMLResponse:
        """`body` in the dashboard's layout (tabs, the user, the sign-out form)."""
        return html(layout(title, body, self.principal, self.csrf), status)

    def redirect(self, to: str) -> Response:
        return redirect(to)


PageHandler = Callable[[PageCall], Awaitable[Response]]


@dataclass(frozen=True)
class PageRoute:
    """A page route as declared: who may call it."""

    method: str
    path: str
    role: str


def html(body: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(body, status_code=status, headers=HEADERS)


def redirect(to: str) -> Response:
    return RedirectResponse(to, status_code=303, headers=HEADERS)


def error_page(status: int, message: str) -> HTMLResponse:
    body = f'<h1>{status}</h1><p class="error" role="alert">{esc(message)}</p>'
    body += '<p><a href="/">back to the fleet</a></p>'
    return html(layout(str(status), body), status)


class Pages:
    """The dashboard's session checks, shared by every page route of one application."""

    def __init__(self, app: FastAPI, api: Api) -> None:
        self.app = app
        self.api = api
        self.plane: ControlPlane = api.plane
        self.sessions = Sessions(api.plane.key)
        self.declared: list[PageRoute] = []  # every route declared here, in order

    # -- declaring a page route ------------------------------------------------------------------

    def get(
        self, path: str, role: str = "viewer", *, check: Callable[[Request], None] | None = None
    ) -> Callable[[PageHandler], PageHandler]:
        """Declare a page that `role` may read."""
        return self._route("GET", path, role, FORM_BYTES, check)

    def post(
        self,
        path: str,
        role: str = "operator",
        *,
        max_body: int = FORM_BYTES,
        check: Callable[[Request], None] | None = None,
    ) -> Callable[[PageHandler], PageHandler]:
        """Declare a form `role` may post (with the session's CSRF token)."""
        return self._route("POST", path, role, max_body, check)

    def _route(
        self,
        method: str,
        path: str,
        required: str,
        max_body: int,
        check: Callable[[Request], None] | None,
    ) -> Callable[[PageHandler], PageHandler]:
        def declare(handler: PageHandler) -> PageHandler:
            async def endpoint(request: Request) -> Response:
                async def work() -> Response:
                    if check is not None:
                        check(request)
                    if method == "POST":
                        principal, session, form = await self.posted(request, required)
                        return await handler(PageCall(request, principal, session, form))
                    principal, session = await self.caller(request, required)
                    return await handler(PageCall(request, principal, session))

                return await self.guarded(request, required, work)

            self.app.add_api_route(
                path,
                endpoint,
                methods=[method],
                name=handler.__name__,
                include_in_schema=False,
                openapi_extra=role("session", max_body),
            )
            self.declared.append(PageRoute(method, path, required))
            return handler

        return declare

    # -- the checks (also handed to route modules that call them by hand) -------------------------

    async def principal_of(self, session: Session) -> Principal | None:
        """The user a session's token authenticates now; None when it no longer does."""
        cached = self.plane.cached_principal(session.token)
        if cached is None:
            try:
                cached = await run_in_threadpool(self.plane.authenticate, session.token)
            except Unauthorized:
                return None
        return cached if cached.kind == TokenKind.USER else None

    async def caller(self, request: Request, required: str = "viewer") -> tuple[Principal, Session]:
        session = self.sessions.open(request.cookies.get(COOKIE))
        principal = await self.principal_of(session) if session else None
        if session is None or principal is None:
            raise _SignIn()
        try:
            authorise(principal, required)
        except HTTPException:
            raise HTTPException(
                403, detail=f"this needs the {required} role; yours is {principal.role}"
            ) from None
        return principal, session

    async def posted(
        self, request: Request, required: str
    ) -> tuple[Principal, Session, dict[str, str]]:
        principal, session = await self.caller(request, required)
        form = parse_form(await request.body())
        if not session.csrf_ok(form.get("csrf")):
            raise HTTPException(403, detail="the form is stale or forged (CSRF check); reload")
        return principal, session, form

    async def guarded(
        self, request: Request, required: str, work: Callable[[], Awaitable[Response]]
    ) -> Response:
        """`work()` (which checks the caller for `required`), with the service's refusals as
        the dashboard's error page."""
        try:
            # A device name that cannot exist is refused before any query (inputs.py).
            if "device" in request.path_params:
                DEVICE.parse("device", request.path_params["device"])
            return await work()
        except _SignIn:
            if request.method == "GET" and request.url.path.endswith("/stream"):
                return Response(status_code=401)
            return redirect("/ui/login")
        except NotFound as exc:
            return error_page(404, str(exc))
        except Tampered as exc:
            return error_page(409, str(exc))
        except InputError as exc:
            return error_page(422, str(exc))
        except HTTPException as exc:
            return error_page(exc.status_code, str(exc.detail))

    def live(
        self,
        call: PageCall,
        event: str,
        seconds: float,
        look: Callable[[], Awaitable[str | None]],
    ) -> StreamingResponse:
        """A server-sent event stream: `look()`'s message as `event` whenever it changes,
        every `seconds`, for `STREAM_LIFETIME` (then the browser reconnects and signs in
        again); `logout` once the session ends, `gone` when `look()` finds nothing."""
        request, session = call.request, call.session

        async def events() -> AsyncIterator[str]:
            last = ""
            started = time.monotonic()
            yield f"retry: {int(seconds * 1000)}\n\n"
            while time.monotonic() - started < STREAM_LIFETIME:
                if await request.is_disconnected():
                    return
                if await self.principal_of(session) is None:
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
