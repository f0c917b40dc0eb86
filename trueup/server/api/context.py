"""What every route module receives (`Api`), and who may call a route.

Each route names its role in OpenAPI (`openapi_extra=role("admin")`) and takes
the matching dependency (`p: Principal = api.admin`): user roles are ordered
(viewer < operator < admin); `api.device` accepts only a device credential.
A missing or unknown token is 401; a token without the role is 403.

The edge middleware (`edge.py`) authenticates and authorises every request
from these declarations before its body is read, and hands the principal on
in the ASGI scope (`PRINCIPAL`); the dependencies take it from there (or
authenticate themselves when a request did not pass the middleware).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Depends, HTTPException, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from trueup.model.jsontypes import JSONObject
from trueup.server.api.bearer import bearer_token
from trueup.server.api.metrics import Metrics
from trueup.server.api.watcher import RevisionWatcher
from trueup.server.db import Database
from trueup.server.ingest import ReportIngest
from trueup.server.limits import (
    BACKUP_BODY_BYTES,
    DEFAULT_BODY_BYTES,
    EVIDENCE_BODY_BYTES,
    excerpt,
)
from trueup.server.service import ControlPlane, Principal, Unauthorized
from trueup.server.tokens import Role, TokenKind, role_at_least

__all__ = ["PRINCIPAL", "Api", "Authenticate", "authorise", "problems", "role"]

PRINCIPAL = "trueup.principal"  # the ASGI scope key the edge middleware sets
MAX_PROBLEMS = 50

# Documents the bearer token in OpenAPI; the token itself is checked by `Authenticate`.
_BEARER = HTTPBearer(auto_error=False, description="a user token or a device credential")

Authenticate = Callable[[str | None], Awaitable[Principal]]


def role(name: str, max_body: int = DEFAULT_BODY_BYTES) -> JSONObject:
    """The OpenAPI extensions naming who may call a route (the authorisation tests read it)
    and the largest request body it takes (the edge middleware answers 413 beyond).

    A JSONObject: FastAPI's `openapi_extra=` takes an OpenAPI operation object, which the
    routes extend with `parameters` and `requestBody`."""
    return {"x-trueup-role": name, "x-trueup-max-body": max_body}


def authorise(caller: Principal, required: str) -> None:
    """Raise 403 unless `caller` may call a route declared with role `required`."""
    if required == "device":
        if caller.kind != TokenKind.DEVICE:
            raise HTTPException(403, detail="this route needs a device credential")
        return
    if (
        caller.kind != TokenKind.USER
        or caller.role is None
        or not role_at_least(caller.role, Role(required))
    ):
        raise HTTPException(403, detail=f"this route needs a user token with role {required}")


def problems(exc: RequestValidationError | ValidationError) -> list[str]:
    """`path: message` per problem; a report parsed by hand gets the same `body.` prefix."""
    prefix = ("body",) if isinstance(exc, ValidationError) else ()
    found = []
    for error in exc.errors():
        loc = ".".join(str(p) for p in (*prefix, *error.get("loc", ())))
        found.append(excerpt(f"{loc}: {error.get('msg', 'invalid')}"))
        if len(found) == MAX_PROBLEMS:
            found.append(f"… and {len(exc.errors()) - MAX_PROBLEMS} more problems")
            break
    return found


def _bearer_principal(plane: ControlPlane) -> Authenticate:
    async def principal(authorization: str | None) -> Principal:
        token = bearer_token(authorization)
        if token is None:
            raise HTTPException(
                401,
                detail="a bearer token is required (Authorization: Bearer TOKEN)",
                headers={"WWW-Authenticate": "Bearer"},
            )
        cached = plane.cached_principal(token)
        if cached is not None:
            return cached
        try:
            return await run_in_threadpool(plane.authenticate, token)
        except Unauthorized as exc:
            raise HTTPException(
                401, detail=str(exc), headers={"WWW-Authenticate": "Bearer"}
            ) from None

    return principal


def _principal_with(
    authenticate: Authenticate, required: str
) -> Callable[..., Awaitable[Principal]]:
    async def dependency(
        request: Request,
        _token: HTTPAuthorizationCredentials | None = Security(_BEARER),
    ) -> Principal:
        caller = request.scope.get(PRINCIPAL)
        if caller is None:
            caller = await authenticate(request.headers.get("authorization"))
        authorise(caller, required)
        return caller

    return dependency


@dataclass
class Api:
    """The application's parts, handed to each route module's `router(api)`."""

    plane: ControlPlane
    database: Database
    ingest: ReportIngest
    watcher: RevisionWatcher
    metrics: Metrics
    public_url: str
    # Device backups: the upload route's body limit, and where uploads are spooled
    # (None: the system's temporary directory).
    backup_max_bytes: int = BACKUP_BODY_BYTES
    evidence_max_bytes: int = EVIDENCE_BODY_BYTES
    spool_dir: str | None = None
    # FastAPI dependencies giving the calling Principal (see the module docstring).
    viewer: Any = field(init=False)
    operator: Any = field(init=False)
    admin: Any = field(init=False)
    device: Any = field(init=False)
    # Token -> Principal, or HTTPException 401 (the edge middleware uses it too).
    authenticate: Authenticate = field(init=False)

    def __post_init__(self) -> None:
        self.authenticate = _bearer_principal(self.plane)
        self.viewer = Depends(_principal_with(self.authenticate, "viewer"))
        self.operator = Depends(_principal_with(self.authenticate, "operator"))
        self.admin = Depends(_principal_with(self.authenticate, "admin"))
        self.device = Depends(_principal_with(self.authenticate, "device"))
