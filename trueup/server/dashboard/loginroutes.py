"""The dashboard's sign-in and sign-out: same-origin only, and the session cookie.

`register` is called by routes.register with the dashboard's `Pages` (its
`Sessions`; the form parser and page headers are pages.py's). Both routes first
check where the form came from (`sameorigin`: `Sec-Fetch-Site` and `Origin`, each when present), then its
token: sign-in the pre-session token of the sign-in page (`LoginTokens`),
sign-out the session's CSRF token. A refusal is a 403 page that sets and drops
no cookie, so a page on another site can neither sign the browser in to an
account of its choosing nor sign it out.
"""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from trueup.server.api.context import role
from trueup.server.dashboard.html import esc, layout, login_page
from trueup.server.dashboard.pages import FORM_BYTES, HEADERS, Pages, html, parse_form
from trueup.server.dashboard.sameorigin import cross_origin_reason
from trueup.server.dashboard.session import (
    COOKIE,
    LOGIN_COOKIE,
    LOGIN_COOKIE_PATH,
    LOGIN_SECONDS,
    SESSION_SECONDS,
    LoginTokens,
)
from trueup.server.service import Unauthorized
from trueup.server.tokens import TokenKind

__all__ = ["register"]


def _refused(message: str) -> HTMLResponse:
    """403 for a sign-in or sign-out that did not come from this server's pages:
    no cookie is set or dropped, so the browser's session stays as it was."""
    body = f'<h1>403</h1><p class="error" role="alert">{esc(message)}</p>'
    body += '<p><a href="/ui/login">the sign-in page</a> · <a href="/">the fleet</a></p>'
    return html(layout("403", body), 403)


class _Doors:
    """What sign-in and sign-out share: the server's public URL, the pre-session tokens."""

    def __init__(self, pages: Pages) -> None:
        self.pages = pages
        self.login_tokens = LoginTokens(pages.plane.key)

    def secure(self, request: Request) -> bool:
        return request.url.scheme == "https" or self.pages.api.public_url.startswith("https:")

    def cross_origin(self, request: Request) -> str | None:
        return cross_origin_reason(request.headers, request.url.scheme, self.pages.api.public_url)

    def sign_in_form(self, request: Request, error: str = "", status: int = 200) -> Response:
        """The sign-in page with its pre-session token (the browser's, while it lasts)."""
        cookie = request.cookies.get(LOGIN_COOKIE)
        field = self.login_tokens.field_for(cookie)
        if field is None:
            cookie, field = self.login_tokens.issue()
        response = html(login_page(field, error), status)
        response.set_cookie(
            LOGIN_COOKIE,
            cookie or "",
            max_age=LOGIN_SECONDS,
            httponly=True,
            samesite="strict",
            secure=self.secure(request),
            path=LOGIN_COOKIE_PATH,
        )
        return response

    async def sign_in(self, request: Request) -> Response:
        reason = self.cross_origin(request)
        if reason is not None:
            return _refused("sign-in refused: " + reason)
        fields = parse_form(await request.body())
        if not self.login_tokens.check(request.cookies.get(LOGIN_COOKIE), fields.get("login_csrf")):
            return _refused(
                "sign-in refused: the sign-in form is stale or did not come from this "
                "server (pre-session token check); nothing was changed — reload the "
                "sign-in page and sign in again"
            )
        token = fields.get("token", "").strip()
        plane = self.pages.plane
        try:
            principal = await run_in_threadpool(plane.authenticate, token) if token else None
        except Unauthorized:
            principal = None
        if principal is None or principal.kind != TokenKind.USER:
            return self.sign_in_form(request, "unknown, revoked or expired user token", 401)
        cookie, _session = self.pages.sessions.seal(token)
        response = RedirectResponse("/", status_code=303, headers=HEADERS)
        response.set_cookie(
            COOKIE,
            cookie,
            max_age=SESSION_SECONDS,
            httponly=True,
            samesite="strict",
            secure=self.secure(request),
            path="/",
        )
        response.delete_cookie(
            LOGIN_COOKIE, path=LOGIN_COOKIE_PATH, httponly=True, samesite="strict"
        )
        return response

    async def sign_out(self, request: Request) -> Response:
        reason = self.cross_origin(request)
        if reason is not None:
            return _refused("sign-out refused: " + reason)
        session = self.pages.sessions.open(request.cookies.get(COOKIE))
        if session is None:
            # No session to end: nothing is dropped (a cookie this request did not
            # bring may still be the browser's session).
            return RedirectResponse("/ui/login", status_code=303, headers=HEADERS)
        fields = parse_form(await request.body())
        if not session.csrf_ok(fields.get("csrf")):
            return _refused(
                "sign-out refused: the form is stale or forged (CSRF check); nothing "
                "was changed, you are still signed in — reload the page and sign out there"
            )
        response = RedirectResponse("/ui/login", status_code=303, headers=HEADERS)
        response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
        return response


def register(pages: Pages) -> None:
    doors = _Doors(pages)
    app = pages.app
    public, session = role("public", FORM_BYTES), role("session", FORM_BYTES)

    @app.get("/ui/login", include_in_schema=False, openapi_extra=public)
    async def login_form(request: Request) -> Response:
        return doors.sign_in_form(request)

    @app.post("/ui/login", include_in_schema=False, openapi_extra=public)
    async def login(request: Request) -> Response:
        return await doors.sign_in(request)

    @app.post("/ui/logout", include_in_schema=False, openapi_extra=session)
    async def logout(request: Request) -> Response:
        return await doors.sign_out(request)
