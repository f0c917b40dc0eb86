"""What the blob routes share (device backups, evidence bundles): receiving an upload and
serving a download, over the blob store (service/blobs.py).

An upload takes the blob as the raw body (`application/octet-stream`), its sha256 in
a header and optional JSON metadata in another. `receive_upload` streams the body to
an unlinked 0600 spool file in `spool_dir` while it hashes it (memory stays flat
whatever the size), compares the digest with the header (422, nothing stored, on a
mismatch) and only then hands the file to the service, which stores it in one
transaction, so the write never waits on a slow network; the edge middleware cuts the
body off past the route's `x-trueup-max-body` (413). `download` streams the stored
chunks with the sha256, the size and a file name in the headers.

routes/backups.py and routes/evidence.py declare their routes (paths, roles, header
names, what the metadata may hold, media types, file names) and call these.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Callable, Iterator
from typing import BinaryIO

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from trueup.model.jsontypes import JSONObject
from trueup.server.api.context import role
from trueup.server.limits import BACKUP_CHUNK_BYTES
from trueup.server.service import Invalid

__all__ = ["BINARY", "SHA256_PATTERN", "download", "receive_upload", "upload_extra"]

SHA256_PATTERN = r"^[0-9a-f]{64}$"
# The OpenAPI schema of a raw body (an upload's, a download's).
BINARY: JSONObject = {"type": "string", "format": "binary"}


def upload_extra(max_body: int) -> JSONObject:
    """An upload route's `openapi_extra`: a device's route taking a raw body of at most
    `max_body` bytes."""
    return {
        **role("device", max_body=max_body),
        "requestBody": {
            "required": True,
            "content": {"application/octet-stream": {"schema": BINARY}},
        },
    }


async def receive_upload(
    request: Request,
    *,
    sha256: str,
    sha256_header: str,
    spool_dir: str | None,
    store: Callable[[BinaryIO], object],
) -> JSONResponse:
    """Spool and hash the request's body; if it hashes to `sha256`, `store` it (in a
    worker thread, the spool file at its start) and answer 201 with what `store` returned.

    Raises Invalid, naming `sha256_header`, when the body hashes to something else."""
    with tempfile.TemporaryFile(dir=spool_dir) as spool:
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
                    f"header.{sha256_header}: the body's sha256 is {digest.hexdigest()}, "
                    f"not {sha256}; nothing was stored"
                ]
            )
        spool.seek(0)
        stored = await run_in_threadpool(store, spool)
    return JSONResponse(stored, status_code=201)


def download(
    content: Iterator[bytes],
    *,
    media_type: str,
    sha256_header: str,
    sha256: str,
    size: int,
    filename: str,
) -> StreamingResponse:
    """A stored blob as a download: its chunks as they are read, its sha256 in
    `sha256_header`, its size as the Content-Length (a download cut short is seen as
    one), and an attachment's file name."""
    return StreamingResponse(
        content,
        media_type=media_type,
        headers={
            sha256_header: sha256,
            "Content-Length": str(size),
            "Content-Disposition": f'attachment; filename="{filename}"',
        },
    )
