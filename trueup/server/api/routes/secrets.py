"""Device secrets for humans: operators list names, admins put values (never read them)."""

from __future__ import annotations

from fastapi import FastAPI

from trueup.server.api.context import Api, role
from trueup.server.api.models import SecretPut
from trueup.server.api.records import SecretsAnswer, ServiceRecord
from trueup.server.api.responses import DEVICE, NAME_PARAM, answers
from trueup.server.limits import SECRET_BODY_BYTES
from trueup.server.service import Principal

__all__ = ["register"]


def register(app: FastAPI, api: Api) -> None:
    plane = api.plane
    operator, admin = api.operator, api.admin

    @app.get(
        "/api/v1/devices/{device}/secrets", openapi_extra=role("operator"), responses=answers(404)
    )
    def list_secrets(device: DEVICE, p: Principal = operator) -> SecretsAnswer:
        return {"secrets": [dict(s) for s in plane.secret_names(p.tenant_id, device)]}

    @app.put(
        "/api/v1/devices/{device}/secrets/{name}",
        status_code=201,
        openapi_extra=role("admin", max_body=SECRET_BODY_BYTES),
        responses=answers(404),
    )
    def put_secret(
        device: DEVICE, name: NAME_PARAM, body: SecretPut, p: Principal = admin
    ) -> ServiceRecord:
        return dict(plane.put_secret(p.tenant_id, device, name, body.value, p.actor))
