"""Device backups: the agent uploads its own, viewers list, operators download, admins delete.

`POST /api/v1/agent/backups` takes the archive as the raw body
(`application/octet-stream`), its sha256 in `X-Trueup-Backup-Sha256` and the
optional metadata as a JSON object in `X-Trueup-Backup-Metadata`. The body is
streamed to an unlinked 0600 spool file beside the server key while it is
hashed (memory stays flat whatever the size), compared with the header (422,
nothing stored, on a mismatch), and only then stored in one transaction
(service/backups.py). The route's body limit is `Settings.backup_max_bytes`.
"""

from __future__ import annotations

import hashlib
import tempfile
from typing import Annotated, Any

from fastapi import FastAPI, Header, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from trueup.server.api.context import Api, problems, role
from trueup.server.api.models import BackupMetadata
from trueup.server.api.responses import DEVICE, answers
from trueup.server.inputs import IdPath
from trueup.server.limits import BACKUP_CHUNK_BYTES, BACKUP_METADATA_LENGTH
from trueup.server.service import Invalid, Principal

__all__ = ["SHA256_HEADER", "register"]

SHA256_HEADER = "X-Trueup-Backup-Sha256"
METADATA_HEADER = "X-Trueup-Backup-Metadata"

BACKUP_ID = IdPath
_SHA256 = r"^[0-9a-f]{64}$"
_BINARY: dict[str, Any] = {"type": "string", "format": "binary"}
_SUMMARY: dict[str, Any] = {
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


def _metadata(raw: str | None) -> dict[str, Any]:
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
        openapi_extra={
            **role("device", max_body=api.backup_max_bytes),
            "requestBody": {
                "required": True,
                "content": {"application/octet-stream": {"schema": _BINARY}},
            },
        },
        responses={201: {"content": {"application/json": {"schema": _SUMMARY}}}, **answers()},
    )
    async def agent_backup_upload(
        request: Request,
        sha256: Annotated[
            str,
            Header(
                alias=SHA256_HEADER,
                pattern=_SHA256,
                description="the body's sha256, 64 lowercase hex digits",
            ),
        ],
        metadata: Annotated[
            str | None,
            Header(
                alias=METADATA_HEADER,
                max_length=BACKUP_METADATA_LENGTH,
                description="JSON: format_version, created_at, agent_version, "
                "applied_revision, with_leases (all optional)",
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
                lambda: plane.store_backup(
                    p.tenant_id,
                    p.device_id or 0,
                    spool,
                    sha256=sha256,
                    metadata=meta,
                    actor=p.actor,
                )
            )
        return JSONResponse(stored, status_code=201)

    @app.get(
        "/api/v1/devices/{device}/backups",
        openapi_extra=role("viewer"),
        responses=answers(404),
    )
    def list_backups(device: DEVICE, p: Principal = api.viewer) -> dict[str, Any]:
        return {"backups": plane.backups(p.tenant_id, device)}

    @app.get(
        "/api/v1/devices/{device}/backups/{backup_id}",
        openapi_extra=role("operator"),
        response_class=StreamingResponse,
        responses={
            200: {
                "description": "the archive, byte for byte; its sha256 in X-Trueup-Backup-Sha256",
                "content": {"application/octet-stream": {"schema": _BINARY}},
                "headers": {SHA256_HEADER: {"schema": {"type": "string", "pattern": _SHA256}}},
            },
            **answers(404),
        },
    )
    def download_backup(
        device: DEVICE, backup_id: BACKUP_ID, p: Principal = api.operator
    ) -> StreamingResponse:
        found = plane.backup(p.tenant_id, device, backup_id)
        return StreamingResponse(
            plane.backup_content(backup_id),
            media_type="application/octet-stream",
            headers={
                SHA256_HEADER: found["sha256"],
                "Content-Length": str(found["size"]),
                "Content-Disposition": f'attachment; filename="{device}-{backup_id}.trueup-backup"',
            },
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
