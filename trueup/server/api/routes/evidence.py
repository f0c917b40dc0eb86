"""Device evidence bundles: the agent uploads, operators request, viewers list and download.

`POST /api/v1/agent/evidence` takes the bundle (`trueup evidence`'s tar.gz) as
the raw body, its sha256 in `X-Trueup-Evidence-Sha256` and optional JSON
metadata in `X-Trueup-Evidence-Metadata`; it is spooled and hashed like a
backup upload (api/blobs.py) and limited by `Settings.evidence_max_bytes`
at the edge. `GET /api/v1/agent/evidence-request` tells the agent whether an
operator asked for a fresh bundle (`POST /api/v1/devices/{device}/evidence-requests`).
Every download is audited (`evidence.download`) and serves only the audited bundle.
"""

from __future__ import annotations

import json
from typing import Annotated

from fastapi import FastAPI, Header, Request
from fastapi.responses import JSONResponse, StreamingResponse

from trueup.model.jsontypes import JSONObject
from trueup.server.api.blobs import BINARY, SHA256_PATTERN, download, receive_upload, upload_extra
from trueup.server.api.context import Api, role
from trueup.server.api.responses import DEVICE, answers
from trueup.server.inputs import IdPath
from trueup.server.limits import BACKUP_METADATA_LENGTH
from trueup.server.service import ControlPlane, Invalid, Principal
from trueup.server.service.evidence import (
    EvidenceListing,
    EvidenceRequest,
    EvidenceSummary,
    PendingRequest,
)

__all__ = ["SHA256_HEADER", "evidence_response", "register"]

SHA256_HEADER = "X-Trueup-Evidence-Sha256"
METADATA_HEADER = "X-Trueup-Evidence-Metadata"

EVIDENCE_ID = IdPath
Sha256 = Annotated[
    str, Header(alias=SHA256_HEADER, pattern=SHA256_PATTERN, description="the body's sha256")
]
Metadata = Annotated[
    str | None,
    Header(
        alias=METADATA_HEADER,
        max_length=BACKUP_METADATA_LENGTH,
        description="JSON object: source, agent_version, request_id (all optional)",
    ),
]


def _metadata(raw: str | None) -> JSONObject:
    """The uploader's metadata: any JSON object (the bundle speaks for itself)."""
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
        openapi_extra=upload_extra(api.evidence_max_bytes),
        responses=answers(),
    )
    async def agent_evidence_upload(
        request: Request, sha256: Sha256, metadata: Metadata = None, p: Principal = api.device
    ) -> JSONResponse:
        assert p.device_id is not None
        device_id, meta = p.device_id, _metadata(metadata)
        return await receive_upload(
            request,
            sha256=sha256,
            sha256_header=SHA256_HEADER,
            spool_dir=api.spool_dir,
            store=lambda spool: plane.store_evidence(
                p.tenant_id, device_id, spool, sha256=sha256, metadata=meta, actor=p.actor
            ),
        )

    @app.get(
        "/api/v1/agent/evidence-request",
        openapi_extra=role("device"),
        response_model=JSONObject,  # documented as a JSON object, as it always was
        responses=answers(),
    )
    def agent_evidence_request(p: Principal = api.device) -> dict[str, PendingRequest | None]:
        assert p.device_id is not None
        return {"pending": plane.pending_evidence_request(p.device_id)}

    @app.post(
        "/api/v1/devices/{device}/evidence-requests",
        status_code=201,
        openapi_extra=role("operator"),
        response_model=JSONObject,
        responses=answers(404),
    )
    def request_evidence(device: DEVICE, p: Principal = api.operator) -> EvidenceRequest:
        return plane.request_evidence(p.tenant_id, device, p.actor)

    @app.get(
        "/api/v1/devices/{device}/evidence",
        openapi_extra=role("viewer"),
        response_model=JSONObject,
        responses=answers(404),
    )
    def list_evidence(device: DEVICE, p: Principal = api.viewer) -> EvidenceListing:
        return plane.evidence_list(p.tenant_id, device)

    @app.get(
        "/api/v1/devices/{device}/evidence/{evidence_id}",
        openapi_extra=role("viewer"),
        response_class=StreamingResponse,
        responses={
            200: {
                "description": "the bundle, byte for byte; its sha256 in X-Trueup-Evidence-Sha256",
                "content": {"application/gzip": {"schema": BINARY}},
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


def evidence_response(
    plane: ControlPlane, device: str, found: EvidenceSummary
) -> StreamingResponse:
    """The bundle `found` (a summary) as a download (the dashboard serves it the same way)."""
    return download(
        plane.evidence_content(found["id"]),
        media_type="application/gzip",
        sha256_header=SHA256_HEADER,
        sha256=found["sha256"],
        size=found["size"],
        filename=f"{device}-evidence-{found['id']}.tar.gz",
    )
