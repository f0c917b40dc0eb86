"""The dashboard's sign-in and sign-out: same-origin only, and the session cookie.

`register` is called by routes.register with the shared `Sessions`, the form
parser and the page headers. Both routes first check where the form came from
(`sameorigin`: `Sec-Fetch-Site` and `Origin`, each when present), then its
token: sign-in the pre-session token of the sign-in page (`LoginTokens`),
sign-out the session's CSRF token. A refusal is a 403 page that sets and drops
no cookie, so a page on another site can neither sign the browser in to an
account of its choosing nor sign it out.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from trueup.server.api.context import Api
from trueup.server.dashboard.html import esc, layout, login_page
from trueup.server.dashboard.sameorigin import cross_origin_reason
from trueup.server.dashboard.session import (
    COOKIE,
    LOGIN_COOKIE,
    LOGIN_COOKIE_PATH,
    LOGIN_SECONDS,
    SESSION_SECONDS,
    LoginTokens,
    Sessions,
)
from trueup.server.service import Unauthorized
from trueup.server.tokens import TokenKind

__all__ = ["register"]

_FORM_BYTES = 64 * 1024  # the body limit of both forms, as for every dashboard form


def register(
    app: FastAPI,
    api: Api,
    sessions: Sessions,
    *,
    parse_form: Callable[[bytes], dict[str, str]],
    html: Callable[[str, int], HTMLResponse],
    headers: dict[str, str],
) -> None:
    plane = api.plane
    login_tokens = LoginTokens(plane.key)
    public: dict[str, object] = {"x-trueup-role": "public", "x-trueup-max-body": _FORM_BYTES}
    session_role: dict[str, object] = {**public, "x-trueup-role": "session"}

    def secure(request: Request) -> bool:
        return request.url.scheme == "https" or api.public_url.startswith("https:")

    def refused(message: str) -> HTMLResponse:
        """403 for a sign-in or sign-out that did not come from this server's pages:
        no cookie is set or dropped, so the browser's session stays as it was."""
        body = f'<h1>403</h1><p class="error" role="alert">{esc(message)}</p>'
        body += '<p><a href="/ui/login">the sign-in page</a> · <a href="/">the fleet</a></p>'
        return html(layout("403", body), 403)

    def sign_in_form(request: Request, error: str = "", status: int = 200) -> Response:
        """The sign-in page with its pre-session token (the browser's, while it lasts)."""
        cookie = request.cookies.get(LOGIN_COOKIE)
        field = login_tokens.field_for(cookie)
        if field is None:
            cookie, field = login_tokens.issue()
        response = html(login_page(field, error), status)
        response.set_cookie(
            LOGIN_COOKIE,
            cookie or "",
            max_age=LOGIN_SECONDS,
            httponly=True,
            samesite="strict",
            secure=secure(request),
            path=LOGIN_COOKIE_PATH,
        )
        return response

    def cross_origin(request: Request) -> str | None:
        return cross_origin_reason(request.headers, request.url.scheme, api.public_url)

    @app.get("/ui/login", include_in_schema=False, openapi_extra=public)
    async def login_form(request: Request) -> Response:
        return sign_in_form(request)

    @app.post("/ui/login", include_in_schema=False, openapi_extra=public)
    async def login(request: Request) -> Response:
        reason = cross_origin(request)
        if reason is not None:
            return refused("sign-in refused: " + reason)
        fields = parse_form(await request.body())
        if not login_tokens.check(request.cookies.get(LOGIN_COOKIE), fields.get("login_csrf")):
            return refused(
                "sign-in refused: the sign-in form is stale or did not come from this "
                "server (pre-session token check); nothing was changed — reload the "
                "sign-in page and sign in again"
            )
        token = fields.get("token", "").strip()
        try:
            principal = await run_in_threadpool(plane.authenticate, token) if token else None
        except Unauthorized:
            principal = None
        if principal is None or principal.kind != TokenKind.USER:
            return sign_in_form(request, "unknown, revoked or expired user token", 401)
        cookie, _session = sessions.seal(token)
        response = RedirectResponse("/", status_code=303, headers=headers)
        response.set_cookie(
            COOKIE,
            cookie,
            max_age=SESSION_SECONDS,
            httponly=True,
            samesite="strict",
            secure=secure(request),
            path="/",
        )
        response.delete_cookie(
            LOGIN_COOKIE, path=LOGIN_COOKIE_PATH, httponly=True, samesite="strict"
        )
        return response

    @app.post("/ui/logout", include_in_schema=False, openapi_extra=session_role)
    async def logout(request: Request) -> Response:
        reason = cross_origin(request)
        if reason is not None:
            return refused("sign-out refused: " + reason)
        session = sessions.open(request.cookies.get(COOKIE))
        if session is None:
            # No session to end: nothing is dropped (a cookie this request did not
            # bring may still be the browser's session).
            return RedirectResponse("/ui/login", status_code=303, headers=headers)
        fields = parse_form(await request.body())
        if not session.csrf_ok(fields.get("csrf")):
            return refused(
                "sign-out refused: the form is stale or forged (CSRF check); nothing "
                "was changed, you are still signed in — reload the page and sign out there"
            )
        response = RedirectResponse("/ui/login", status_code=303, headers=headers)
        response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
        return response
