"""Device backups: the agent uploads its own, viewers list, operators download, admins delete.

`POST /api/v1/agent/backups` takes the archive as the raw body
(`application/octet-stream`), its sha256 in `X-Trueup-Backup-Sha256` and the
optional metadata as a JSON object in `X-Trueup-Backup-Metadata`. The body is
spooled and hashed, compared with the header (422, nothing stored, on a
mismatch), and only then stored in one transaction (api/blobs.py,
service/backups.py). The route's body limit is `Settings.backup_max_bytes`.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import FastAPI, Header, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError

from trueup.model.jsontypes import JSONObject
from trueup.server.api.blobs import BINARY, SHA256_PATTERN, download, receive_upload, upload_extra
from trueup.server.api.context import Api, problems, role
from trueup.server.api.models import BackupMetadata
from trueup.server.api.responses import DEVICE, answers
from trueup.server.inputs import IdPath
from trueup.server.limits import BACKUP_METADATA_LENGTH
from trueup.server.service import Invalid, Principal
from trueup.server.service.backups import BackupSummary

__all__ = ["SHA256_HEADER", "register"]

SHA256_HEADER = "X-Trueup-Backup-Sha256"
METADATA_HEADER = "X-Trueup-Backup-Metadata"

BACKUP_ID = IdPath
Sha256 = Annotated[
    str,
    Header(
        alias=SHA256_HEADER,
        pattern=SHA256_PATTERN,
        description="the body's sha256, 64 lowercase hex digits",
    ),
]
Metadata = Annotated[
    str | None,
    Header(
        alias=METADATA_HEADER,
        max_length=BACKUP_METADATA_LENGTH,
        description="JSON: format_version, created_at, agent_version, "
        "applied_revision, with_leases (all optional)",
    ),
]
_SUMMARY: JSONObject = {
    "type": "object",
    "required": ["id", "device", "uploaded_at", "size", "sha256", "metadata"],
    "properties": {
        "id": {"type": "integer"},
        "device": {"type": "string"},
        "created_at": {"type": ["number", "null"]},
        "uploaded_at": {"type": "number"},
        "size": {"type": "integer"},
        "sha256": {"type": "string"},
        "metadata": {"type": "object"},
    },
}


def _metadata(raw: str | None) -> JSONObject:
    if raw is None:
        return {}
    try:
        parsed = BackupMetadata.model_validate_json(raw)
    except ValidationError as exc:
        raise Invalid(
            [f"header.{METADATA_HEADER}.{p[len('body.') :]}" for p in problems(exc)]
        ) from None
    return parsed.model_dump(exclude_none=True)


def register(app: FastAPI, api: Api) -> None:
    plane = api.plane

    @app.post(
        "/api/v1/agent/backups",
        status_code=201,
        openapi_extra=upload_extra(api.backup_max_bytes),
        responses={201: {"content": {"application/json": {"schema": _SUMMARY}}}, **answers()},
    )
    async def agent_backup_upload(
        request: Request, sha256: Sha256, metadata: Metadata = None, p: Principal = api.device
    ) -> JSONResponse:
        assert p.device_id is not None
        device_id, meta = p.device_id, _metadata(metadata)
        return await receive_upload(
            request,
            sha256=sha256,
            sha256_header=SHA256_HEADER,
            spool_dir=api.spool_dir,
            store=lambda spool: plane.store_backup(
                p.tenant_id, device_id, spool, sha256=sha256, metadata=meta, actor=p.actor
            ),
        )

    @app.get(
        "/api/v1/devices/{device}/backups",
        openapi_extra=role("viewer"),
        response_model=JSONObject,  # documented as a JSON object, as it always was
        responses=answers(404),
    )
    def list_backups(device: DEVICE, p: Principal = api.viewer) -> dict[str, list[BackupSummary]]:
        return {"backups": plane.backups(p.tenant_id, device)}

    @app.get(
        "/api/v1/devices/{device}/backups/{backup_id}",
        openapi_extra=role("operator"),
        response_class=StreamingResponse,
        responses={
            200: {
                "description": "the archive, byte for byte; its sha256 in X-Trueup-Backup-Sha256",
                "content": {"application/octet-stream": {"schema": BINARY}},
                "headers": {
                    SHA256_HEADER: {"schema": {"type": "string", "pattern": SHA256_PATTERN}}
                },
            },
            **answers(404),
        },
    )
    def download_backup(
        device: DEVICE, backup_id: BACKUP_ID, p: Principal = api.operator
    ) -> StreamingResponse:
        found = plane.backup(p.tenant_id, device, backup_id)
        return download(
            plane.backup_content(backup_id),
            media_type="application/octet-stream",
            sha256_header=SHA256_HEADER,
            sha256=found["sha256"],
            size=found["size"],
            filename=f"{device}-{backup_id}.trueup-backup",
        )

    @app.delete(
        "/api/v1/devices/{device}/backups/{backup_id}",
        status_code=204,
        openapi_extra=role("admin"),
        responses={204: {"description": "deleted (audited)"}, **answers(404)},
    )
    def delete_backup(device: DEVICE, backup_id: BACKUP_ID, p: Principal = api.admin) -> Response:
        plane.delete_backup(p.tenant_id, device, backup_id, p.actor)
        return Response(status_code=204)
