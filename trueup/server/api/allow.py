"""`Allow` for every path: `OPTIONS` answers with it, a method the path does not take is 405.

Starlette answers a wrong method from the first route whose path matches, so a
path served by two routes (`GET` and `POST /api/v1/devices`) said `Allow: GET`
to a `DELETE`. This ASGI middleware, outside the edge (`edge.py`), collects the
methods of every route that matches the path and

- answers `OPTIONS` with 204 and `Allow` (the methods, and `OPTIONS` itself);
- answers any other method that none of them takes with 405 and the same `Allow`.

Neither needs a credential: the method list of a path is what the published
OpenAPI document says, and the path's template is all it depends on (never
whether a device or a user exists), so an anonymous caller learns nothing.
There are no CORS headers: the API and the dashboard are same-origin only, so
a browser's cross-origin preflight finds no `Access-Control-Allow-*` and
refuses. Paths that match no route pass through to the 404.
"""

from __future__ import annotations

from fastapi.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["AllowMiddleware", "allowed_methods"]


def allowed_methods(routes: list[BaseRoute], scope: Scope) -> set[str]:
    """Every method a route whose path matches this request's path takes (empty: no route)."""
    methods: set[str] = set()
    for route in routes:
        route_methods = getattr(route, "methods", None)
        if route_methods and route.matches(scope)[0] != Match.NONE:
            methods.update(route_methods)
    return methods


class AllowMiddleware:
    def __init__(self, app: ASGIApp, *, routes: list[BaseRoute]) -> None:
        self.app = app
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        methods = allowed_methods(self.routes, scope)
        method = scope["method"]
        if not methods or (method in methods and method != "OPTIONS"):
            await self.app(scope, receive, send)
            return
        allow = ", ".join(sorted(methods | {"OPTIONS"}))
        response: Response
        if method == "OPTIONS":
            response = Response(status_code=204, headers={"Allow": allow})
        else:
            response = JSONResponse(
                {"detail": f"{method} is not allowed on this path; it takes {allow}"},
                status_code=405,
                headers={"Allow": allow},
            )
        await response(scope, receive, send)
