"""Device secrets for humans: operators list names, admins put values (never read them)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from trueup.server.api.context import Api, role
from trueup.server.api.models import SecretPut
from trueup.server.service import Principal

__all__ = ["register"]


def register(app: FastAPI, api: Api) -> None:
    plane = api.plane
    operator, admin = api.operator, api.admin

    @app.get("/api/v1/devices/{device}/secrets", openapi_extra=role("operator"))
    def list_secrets(device: str, p: Principal = operator) -> dict[str, Any]:
        return {"secrets": plane.secret_names(p.tenant_id, device)}

    @app.put(
        "/api/v1/devices/{device}/secrets/{name}", status_code=201, openapi_extra=role("admin")
    )
    def put_secret(device: str, name: str, body: SecretPut, p: Principal = admin) -> dict[str, Any]:
        return plane.put_secret(p.tenant_id, device, name, body.value, p.actor)
