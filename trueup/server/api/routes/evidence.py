"""Device evidence bundles: the agent uploads, operators request, viewers list and download.

`POST /api/v1/agent/evidence` takes the bundle (`trueup evidence`'s tar.gz) as
the raw body, its sha256 in `X-Trueup-Evidence-Sha256` and optional JSON
metadata in `X-Trueup-Evidence-Metadata`; it is spooled and hashed like a
backup upload (routes/backups.py) and limited by `Settings.evidence_max_bytes`
at the edge. `GET /api/v1/agent/evidence-request` tells the agent whether an
operator asked for a fresh bundle (`POST /api/v1/devices/{device}/evidence-requests`).
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from typing import Annotated, Any

from fastapi import FastAPI, Header, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from trueup.server.api.context import Api, role
from trueup.server.api.responses import DEVICE, answers
from trueup.server.inputs import IdPath
from trueup.server.limits import BACKUP_CHUNK_BYTES, BACKUP_METADATA_LENGTH
from trueup.server.service import Invalid, Principal

__all__ = ["SHA256_HEADER", "register"]

SHA256_HEADER = "X-Trueup-Evidence-Sha256"
METADATA_HEADER = "X-Trueup-Evidence-Metadata"

EVIDENCE_ID = IdPath
_SHA256 = r"^[0-9a-f]{64}$"
_BINARY: dict[str, Any] = {"type": "string", "format": "binary"}


def _metadata(raw: str | None) -> dict[str, Any]:
    if raw is None:
        return {}
    try:
        parsed = json.loads(raw)
    except ValueError as exc:
        raise Invalid([f"header.{METADATA_HEADER}: not JSON: {exc}"]) from None
    if not isinstance(parsed, dict):
        raise Invalid([f"header.{METADATA_HEADER}: expected a JSON object"])
    return parsed


def register(app: FastAPI, api: Api) -> None:
    plane = api.plane

    @app.post(
        "/api/v1/agent/evidence",
        status_code=201,
        openapi_extra={
            **role("device", max_body=api.evidence_max_bytes),
            "requestBody": {
                "required": True,
                "content": {"application/octet-stream": {"schema": _BINARY}},
            },
        },
        responses=answers(),
    )
    async def agent_evidence_upload(
        request: Request,
        sha256: Annotated[
            str,
            Header(alias=SHA256_HEADER, pattern=_SHA256, description="the body's sha256"),
        ],
        metadata: Annotated[
            str | None,
            Header(
                alias=METADATA_HEADER,
                max_length=BACKUP_METADATA_LENGTH,
                description="JSON object: source, agent_version, request_id (all optional)",
            ),
        ] = None,
        p: Principal = api.device,
    ) -> JSONResponse:
        assert p.device_id is not None
        meta = _metadata(metadata)
        with tempfile.TemporaryFile(dir=api.spool_dir) as spool:
            digest, pending = hashlib.sha256(), bytearray()
            async for chunk in request.stream():  # the edge cuts it off past the limit
                digest.update(chunk)
                pending += chunk
                if len(pending) >= BACKUP_CHUNK_BYTES:
                    await run_in_threadpool(spool.write, bytes(pending))
                    pending.clear()
            await run_in_threadpool(spool.write, bytes(pending))
            if digest.hexdigest() != sha256:
                raise Invalid(
                    [
                        f"header.{SHA256_HEADER}: the body's sha256 is {digest.hexdigest()}, "
                        f"not {sha256}; nothing was stored"
                    ]
                )
            spool.seek(0)
            stored = await run_in_threadpool(
                lambda: plane.store_evidence(
                    p.tenant_id,
                    p.device_id or 0,
                    spool,
                    sha256=sha256,
                    metadata=meta,
                    actor=p.actor,
                )
            )
        return JSONResponse(stored, status_code=201)

    @app.get("/api/v1/agent/evidence-request", openapi_extra=role("device"), responses=answers())
    def agent_evidence_request(p: Principal = api.device) -> dict[str, Any]:
        assert p.device_id is not None
        return {"pending": plane.pending_evidence_request(p.device_id)}

    @app.post(
        "/api/v1/devices/{device}/evidence-requests",
        status_code=201,
        openapi_extra=role("operator"),
        responses=answers(404),
    )
    def request_evidence(device: DEVICE, p: Principal = api.operator) -> dict[str, Any]:
        return plane.request_evidence(p.tenant_id, device, p.actor)

    @app.get(
        "/api/v1/devices/{device}/evidence", openapi_extra=role("viewer"), responses=answers(404)
    )
    def list_evidence(device: DEVICE, p: Principal = api.viewer) -> dict[str, Any]:
        return plane.evidence_list(p.tenant_id, device)

    @app.get(
        "/api/v1/devices/{device}/evidence/{evidence_id}",
        openapi_extra=role("viewer"),
        response_class=StreamingResponse,
        responses={
            200: {
                "description": "the bundle, byte for byte; its sha256 in X-Trueup-Evidence-Sha256",
                "content": {"application/gzip": {"schema": _BINARY}},
            },
            **answers(404),
        },
    )
    def download_evidence(
        device: DEVICE, evidence_id: EVIDENCE_ID, p: Principal = api.viewer
    ) -> StreamingResponse:
        found = plane.evidence_bundle(p.tenant_id, device, evidence_id)
        plane.audit_evidence_download(p.tenant_id, device, evidence_id, p.actor)
        return evidence_response(plane, device, found)


def evidence_response(plane: Any, device: str, found: dict[str, Any]) -> StreamingResponse:
    """The bundle `found` (a summary) as a download (the dashboard serves it the same way)."""
    return StreamingResponse(
        plane.evidence_content(found["id"]),
        media_type="application/gzip",
        headers={
            SHA256_HEADER: found["sha256"],
            "Content-Length": str(found["size"]),
            "Content-Disposition": (
                f'attachment; filename="{device}-evidence-{found["id"]}.tar.gz"'
            ),
        },
    )
