"""The edge: who is calling and how much they send, decided before a body is read.

For every request that matches a route, this ASGI middleware reads the route's
declarations (`x-trueup-role`, `x-trueup-max-body`, see context.role) and

1. authenticates and authorises the caller from the Authorization header
   alone: a request without a valid token is answered 401 (a token without
   the role 403) before a byte of its body is read, so an anonymous caller
   cannot make the server read, buffer or parse anything;
2. answers 413 when Content-Length is over the route's limit, and stops a body
   without Content-Length (chunked) as soon as it passes the limit.

The principal goes to the route in the ASGI scope (`context.PRINCIPAL`).
Requests matching no route pass through untouched (404/405 read no body).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import HTTPException
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from sqlalchemy import exc as sa_exc
from starlette.routing import Match, Router
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from trueup.server.api.context import PRINCIPAL, Authenticate, authorise
from trueup.server.db import is_unavailable
from trueup.server.limits import DEFAULT_BODY_BYTES

__all__ = ["BodyTooLarge", "EdgeMiddleware"]

log = logging.getLogger("trueup.server")

# Routes that check their own credential, or need none: `session` is the dashboard's
# (its session cookie, trueup.server.dashboard.pages).
_OPEN = ("public", "enrollment", "session")


class BodyTooLarge(HTTPException):
    def __init__(self, limit: int) -> None:
        super().__init__(
            413, detail=f"request body too large: this route takes at most {limit} bytes"
        )


def _declared(route: APIRoute) -> tuple[str, int]:
    extra = route.openapi_extra or {}
    return str(extra.get("x-trueup-role", "public")), int(
        extra.get("x-trueup-max-body", DEFAULT_BODY_BYTES)
    )


class EdgeMiddleware:
    def __init__(self, app: ASGIApp, *, router: Router, authenticate: Authenticate) -> None:
        self.app = app
        self.router = router
        self.authenticate = authenticate

    def _route(self, scope: Scope) -> tuple[str, int] | None:
        for route in self.router.routes:
            if isinstance(route, APIRoute):
                match, _child = route.matches(scope)
                if match == Match.FULL:
                    scope["route"] = route  # metrics name early answers by their route too
                    return _declared(route)
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = self._route(scope)
        if declared is None:
            await self.app(scope, receive, send)
            return
        required, limit = declared
        try:
            if required not in _OPEN:
                caller = await _authenticated(self.authenticate, _header(scope, b"authorization"))
                authorise(caller, required)
                scope[PRINCIPAL] = caller
            length = _header(scope, b"content-length")
            if length is not None and (not length.isascii() or not length.isdigit()):
                raise HTTPException(400, detail="Content-Length is not a number")
            if length is not None and int(length) > limit:
                raise BodyTooLarge(limit)
        except HTTPException as exc:
            await _answer(exc, scope, receive, send)
            return
        await self.app(scope, _bounded(receive, limit), send)


async def _authenticated(authenticate: Authenticate, authorization: str | None) -> Any:
    """The caller; a database that cannot be reached is 503 with Retry-After, not a 500."""
    try:
        return await authenticate(authorization)
    except sa_exc.DBAPIError as exc:
        if not is_unavailable(exc):
            raise
        log.error("database unavailable while authenticating: %s", exc)
        raise HTTPException(
            503, detail="database unavailable; retry", headers={"Retry-After": "5"}
        ) from None


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value).decode("latin-1")
    return None


async def _answer(exc: HTTPException, scope: Scope, receive: Receive, send: Send) -> None:
    response = JSONResponse(
        {"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers
    )
    await response(scope, receive, send)


def _bounded(receive: Receive, limit: int) -> Receive:
    """`receive` that raises BodyTooLarge (answered 413) once the body passes `limit` bytes."""
    seen = 0

    async def bounded() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise BodyTooLarge(limit)
        return message

    return bounded
