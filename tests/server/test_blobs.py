"""The chunked blob store that device backups and evidence bundles share (service/blobs.py).

What both kinds get from the one store, tested once per kind and on SQLite and
PostgreSQL (the conftest's backends): a download that loses a chunk is cut short,
a backup deleted during its download is cut short, and an upload is one
transaction with what its kind does beside it. Tests that tamper with the database
have one of their own.
"""

from __future__ import annotations

import hashlib
import io
import os

import pytest
from sqlalchemy import delete

from tests.server.conftest import BACKENDS, Server, Tenant
from trueup.server.limits import BACKUP_CHUNK_BYTES
from trueup.server.service.backups import BackupGone
from trueup.server.service.blobs import BlobGone, Blobs
from trueup.server.service.evidence import EvidenceGone

NOUNS = {"backup": "Backup", "evidence": "Evidence"}
GONE = {"backup": BackupGone, "evidence": EvidenceGone}


def blobs_of(server: Server, noun: str) -> Blobs:
    unit = server.plane.device_backups if noun == "backup" else server.plane.device_evidence
    return unit.blobs


def upload(server: Server, tenant: Tenant, noun: str, data: bytes) -> int:
    path = "/api/v1/agent/backups" if noun == "backup" else "/api/v1/agent/evidence"
    response = server.client.post(
        path,
        content=data,
        headers={
            **tenant.device_auth("edge-01"),
            f"X-Trueup-{NOUNS[noun]}-Sha256": hashlib.sha256(data).hexdigest(),
        },
    )
    assert response.status_code == 201, response.text
    return int(response.json()["id"])


def actions(server: Server, tenant: Tenant, noun: str) -> list[str]:
    entries = server.plane.audit_entries(server.plane.tenant_id(tenant.name), 1000)
    return [e["action"] for e in entries if e["action"].startswith(f"{noun}.")]


@pytest.mark.parametrize("isolated_server", BACKENDS, indirect=True)
@pytest.mark.parametrize("noun", NOUNS)
def test_a_chunk_lost_during_a_download_cuts_it_short(isolated_server: Server, noun: str) -> None:
    server = isolated_server  # its database is tampered with
    tenant = server.tenant("blob", devices=("edge-01",))
    data = os.urandom(3 * BACKUP_CHUNK_BYTES + 5)
    blob_id = upload(server, tenant, noun, data)
    content = (
        server.plane.backup_content(blob_id)
        if noun == "backup"
        else server.plane.evidence_content(blob_id)
    )
    assert next(content) == data[:BACKUP_CHUNK_BYTES]
    kind = blobs_of(server, noun).kind
    with server.plane.db.write() as conn:  # behind the server's back
        conn.execute(delete(kind.chunks).where(kind.chunk_owner == blob_id, kind.chunks.c.seq == 2))
    with pytest.raises(GONE[noun], match=f"{noun} {blob_id} lost chunk 2 during the download"):
        list(content)


def test_a_backup_deleted_during_its_download_is_cut_short(server: Server) -> None:
    tenant = server.tenant("blob", devices=("edge-01",))
    data = os.urandom(2 * BACKUP_CHUNK_BYTES)
    backup_id = upload(server, tenant, "backup", data)
    content = server.plane.backup_content(backup_id)
    assert next(content) == data[:BACKUP_CHUNK_BYTES]
    tenant_id = server.plane.tenant_id(tenant.name)
    server.plane.delete_backup(tenant_id, "edge-01", backup_id, "test")
    with pytest.raises(BackupGone, match="was deleted during the download"):
        list(content)
    assert issubclass(BackupGone, BlobGone) and issubclass(EvidenceGone, BlobGone)


@pytest.mark.parametrize("noun", NOUNS)
def test_an_upload_is_one_transaction_with_what_its_kind_does(server: Server, noun: str) -> None:
    tenant = server.tenant("blob", devices=("edge-01",))
    tenant_id = server.plane.tenant_id(tenant.name)
    device_id = server.plane.device_id(tenant_id, "edge-01")
    blobs = blobs_of(server, noun)
    data = os.urandom(BACKUP_CHUNK_BYTES + 1)

    def fails(*_args: object) -> dict[str, list[int]]:
        raise RuntimeError("the kind's own step failed")

    with pytest.raises(RuntimeError, match="own step failed"):
        blobs.upload(
            tenant_id,
            device_id,
            io.BytesIO(data),
            sha256=hashlib.sha256(data).hexdigest(),
            metadata={},
            actor="test",
            then=fails,
        )
    with server.plane.db.read() as conn:
        assert blobs.listed(conn, tenant_id, device_id, "edge-01") == []
    assert actions(server, tenant, noun) == []

    uploaded = blobs.upload(
        tenant_id,
        device_id,
        io.BytesIO(data),
        sha256=hashlib.sha256(data).hexdigest(),
        metadata={"source": "test"},
        actor="test",
        then=lambda _conn, stored: {"seen": [stored.id, stored.size]},
    )
    assert uploaded.extra == {"seen": [uploaded.blob.id, len(data)]}
    assert uploaded.blob.size == len(data) and uploaded.blob.metadata == {"source": "test"}
    [entry] = [
        e for e in server.plane.audit_entries(tenant_id, 1000) if e["action"] == f"{noun}.upload"
    ]
    assert entry["detail"]["seen"] == [uploaded.blob.id, len(data)]
    assert entry["target"] == f"device:edge-01/{noun}:{uploaded.blob.id}"
