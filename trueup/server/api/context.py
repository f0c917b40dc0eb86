"""What every route module receives (`Api`), and who may call a route.

Each route names its role in OpenAPI (`openapi_extra=role("admin")`) and takes
the matching dependency (`p: Principal = api.admin`): user roles are ordered
(viewer < operator < admin); `api.device` accepts only a device credential.
A missing or unknown token is 401; a token without the role is 403.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Depends, Header, HTTPException
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from trueup.server.api.metrics import Metrics
from trueup.server.api.watcher import RevisionWatcher
from trueup.server.db import Database
from trueup.server.ingest import ReportIngest
from trueup.server.service import ControlPlane, Principal, Unauthorized
from trueup.server.tokens import Role, TokenKind, role_at_least

__all__ = ["Api", "problems", "role"]


def role(name: str) -> dict[str, Any]:
    """The OpenAPI extension naming who may call a route (the authorisation tests read it)."""
    return {"x-trueup-role": name}


def problems(exc: RequestValidationError | ValidationError) -> list[str]:
    """`path: message` per problem; a report parsed by hand gets the same `body.` prefix."""
    prefix = ("body",) if isinstance(exc, ValidationError) else ()
    found = []
    for error in exc.errors():
        loc = ".".join(str(p) for p in (*prefix, *error.get("loc", ())))
        found.append(f"{loc}: {error.get('msg', 'invalid')}")
    return found


def _bearer_principal(plane: ControlPlane) -> Callable[[str | None], Awaitable[Principal]]:
    async def principal(authorization: str | None) -> Principal:
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

    return principal


def _user_with(
    principal: Callable[[str | None], Awaitable[Principal]], required: Role
) -> Callable[..., Awaitable[Principal]]:
    async def dependency(authorization: str | None = Header(None)) -> Principal:
        caller = await principal(authorization)
        if (
            caller.kind != TokenKind.USER
            or caller.role is None
            or not role_at_least(caller.role, required)
        ):
            raise HTTPException(403, detail=f"this route needs a user token with role {required}")
        return caller

    return dependency


def _device_only(
    principal: Callable[[str | None], Awaitable[Principal]],
) -> Callable[..., Awaitable[Principal]]:
    async def dependency(authorization: str | None = Header(None)) -> Principal:
        caller = await principal(authorization)
        if caller.kind != TokenKind.DEVICE:
            raise HTTPException(403, detail="this route needs a device credential")
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
    # FastAPI dependencies giving the calling Principal (see the module docstring).
    viewer: Any = field(init=False)
    operator: Any = field(init=False)
    admin: Any = field(init=False)
    device: Any = field(init=False)

    def __post_init__(self) -> None:
        principal = _bearer_principal(self.plane)
        self.viewer = Depends(_user_with(principal, Role.VIEWER))
        self.operator = Depends(_user_with(principal, Role.OPERATOR))
        self.admin = Depends(_user_with(principal, Role.ADMIN))
        self.device = Depends(_device_only(principal))
