"""A device's labels: read them, replace the whole set (`PUT`), or merge into it (`PATCH`,
JSON merge patch: a key set to null is removed).

Reading takes the role that reads devices (viewer); writing the role that
writes desired state (operator), since labels decide which profiles render a
device's document. A bad key or value is 422 naming `labels.<key>` and what is
expected; nothing is changed. Every change is audited as `device.labels`.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from starlette.concurrency import run_in_threadpool

from trueup.model.decode import DecodeError, decode_json
from trueup.model.jsontypes import JSONObject
from trueup.server.api.context import Api, role
from trueup.server.api.models import LABEL_VALUE_SCHEMA, LABELS_SCHEMA
from trueup.server.api.records import LabelsAnswer
from trueup.server.api.responses import DEVICE, answers
from trueup.server.limits import DEFAULT_BODY_BYTES
from trueup.server.service import Invalid, Principal

__all__ = ["register"]

_PATCH_SCHEMA: JSONObject = {
    **LABELS_SCHEMA,
    "description": "JSON merge patch: key -> new value, or null to remove the key",
    "additionalProperties": {"anyOf": [LABEL_VALUE_SCHEMA, {"type": "null"}]},
}


def _body(raw: bytes) -> JSONObject:
    """The body's JSON object, before the service checks its keys and values."""
    try:
        data = decode_json(raw, max_bytes=DEFAULT_BODY_BYTES, max_depth=4)
    except DecodeError as exc:
        raise Invalid([f"labels: {exc}"]) from None
    if not isinstance(data, dict):
        raise Invalid(["labels: expected a JSON object of label keys to string values"])
    return data


def _request_body(schema: JSONObject) -> JSONObject:
    """An OpenAPI request body of JSON with this JSON Schema."""
    return {"required": True, "content": {"application/json": {"schema": schema}}}


def register(app: FastAPI, api: Api) -> None:
    plane = api.plane
    viewer, operator = api.viewer, api.operator

    @app.get(
        "/api/v1/devices/{device}/labels", openapi_extra=role("viewer"), responses=answers(404)
    )
    def get_labels(device: DEVICE, p: Principal = viewer) -> LabelsAnswer:
        return {"device": device, "labels": plane.labels(p.tenant_id, device)}

    @app.put(
        "/api/v1/devices/{device}/labels",
        responses=answers(404),
        openapi_extra={**role("operator"), "requestBody": _request_body(LABELS_SCHEMA)},
    )
    async def put_labels(device: DEVICE, request: Request, p: Principal = operator) -> Any:
        labels = _body(await request.body())
        return await run_in_threadpool(
            lambda: plane.set_labels(p.tenant_id, device, labels, actor=p.actor)
        )

    @app.patch(
        "/api/v1/devices/{device}/labels",
        responses=answers(404),
        openapi_extra={**role("operator"), "requestBody": _request_body(_PATCH_SCHEMA)},
    )
    async def patch_labels(device: DEVICE, request: Request, p: Principal = operator) -> Any:
        patch = _body(await request.body())
        remove = [key for key, value in patch.items() if value is None]
        labels = {key: value for key, value in patch.items() if value is not None}
        return await run_in_threadpool(
            lambda: plane.set_labels(
                p.tenant_id, device, labels, remove=remove, merge=True, actor=p.actor
            )
        )
