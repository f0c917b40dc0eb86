"""Users, roles and tokens of the caller's tenant (admin), and the tenant's audit log."""

from __future__ import annotations

from fastapi import FastAPI, Query

from trueup.server.api.context import Api, role
from trueup.server.api.models import RoleChange, TokenCreate, UserCreate
from trueup.server.api.records import (
    AuditAnswer,
    TokenCreated,
    TokenRevoked,
    TokensAnswer,
    UserRole,
    UsersAnswer,
)
from trueup.server.api.responses import TOKEN_ID, USER, answers
from trueup.server.service import Principal

__all__ = ["register"]


def register(app: FastAPI, api: Api) -> None:
    plane = api.plane
    admin = api.admin

    @app.get("/api/v1/users", openapi_extra=role("admin"), responses=answers())
    def list_users(p: Principal = admin) -> UsersAnswer:
        return {"users": [dict(u) for u in plane.list_users(p.tenant_id)]}

    @app.post("/api/v1/users", status_code=201, openapi_extra=role("admin"), responses=answers())
    def create_user(body: UserCreate, p: Principal = admin) -> UserRole:
        plane.create_user(p.tenant_id, body.name, body.role, p.actor)
        return {"user": body.name, "role": body.role}

    @app.put("/api/v1/users/{user}/role", openapi_extra=role("admin"), responses=answers(404))
    def change_role(user: USER, body: RoleChange, p: Principal = admin) -> UserRole:
        plane.set_role(p.tenant_id, user, body.role, p.actor)
        return {"user": user, "role": body.role}

    @app.post(
        "/api/v1/users/{user}/tokens",
        status_code=201,
        openapi_extra=role("admin"),
        responses=answers(404),
    )
    def create_token(user: USER, body: TokenCreate, p: Principal = admin) -> TokenCreated:
        token_id, token = plane.create_token(p.tenant_id, user, p.actor, body.label)
        return {"id": token_id, "user": user, "token": token}

    @app.get("/api/v1/tokens", openapi_extra=role("admin"), responses=answers())
    def list_tokens(p: Principal = admin) -> TokensAnswer:
        return {"tokens": [dict(t) for t in plane.list_tokens(p.tenant_id)]}

    @app.post(
        "/api/v1/tokens/{token_id}/revoke", openapi_extra=role("admin"), responses=answers(404)
    )
    def revoke_token(token_id: TOKEN_ID, p: Principal = admin) -> TokenRevoked:
        plane.revoke_token(p.tenant_id, token_id, p.actor)
        return {"id": token_id, "revoked": True}

    @app.get("/api/v1/audit", openapi_extra=role("admin"), responses=answers())
    def list_audit(limit: int = Query(100, ge=1, le=10000), p: Principal = admin) -> AuditAnswer:
        return {"entries": [dict(e) for e in plane.audit_entries(p.tenant_id, limit)]}
