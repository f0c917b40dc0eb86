"""Device backups: archives the agents upload, kept per device, listed and downloaded by humans.

An archive is opaque here: a blob (service/blobs.py) in the `backups` and
`backup_chunks` tables, with the metadata its uploader sent (format version,
creation time, agent version, applied revision, whether leases are in it). One
transaction stores a backup, prunes the device's oldest beyond `keep` and
audits both (`backup.upload`, `backup.delete`), so a backup is never half
stored, never unaudited, and every server process sharing the database
(PostgreSQL on several hosts) serves it. Upload and download go chunk by chunk;
no archive is ever held whole in memory. Admins may delete a backup.

The caller spools the request body to a file first (api/routes/backups.py),
so the write transaction never waits on a slow network; the sha256 is checked
again while the chunks are inserted, and a mismatch rolls everything back.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO, TypedDict

from trueup.model.jsontypes import JSONObject
from trueup.server.limits import BACKUP_KEEP
from trueup.server.service.blobs import Blob, BlobGone, BlobKind, Blobs
from trueup.server.service.store import Store
from trueup.server.tables import backup_chunks, backups

__all__ = ["BackupGone", "BackupStored", "BackupSummary", "DeviceBackups"]


class BackupGone(BlobGone):
    """The backup was deleted while it was being downloaded (the download is cut short)."""


class BackupSummary(TypedDict):
    """A backup as listed: when it was made (its metadata's created_at) and arrived."""

    id: int
    device: str
    created_at: float | None
    uploaded_at: float
    size: int
    sha256: str
    metadata: JSONObject


class BackupStored(BackupSummary):
    """An upload's answer: the backup, and the ids its retention deleted."""

    pruned: list[int]


BACKUP = BlobKind(
    noun="backup",
    table=backups,
    chunks=backup_chunks,
    sha256_header="X-Trueup-Backup-Sha256",
    gone=BackupGone,
    dated=True,
)


def _summary(blob: Blob) -> BackupSummary:
    return {
        "id": blob.id,
        "device": blob.device,
        "created_at": blob.created_at,
        "uploaded_at": blob.uploaded_at,
        "size": blob.size,
        "sha256": blob.sha256,
        "metadata": blob.metadata,
    }


class DeviceBackups:
    def __init__(self, store: Store, *, keep: int = BACKUP_KEEP) -> None:
        if keep < 1:
            raise ValueError("backup retention must keep at least one backup per device")
        self.store = store
        self.blobs = Blobs(store, BACKUP, keep=keep)

    def store_backup(
        self,
        tenant_id: int,
        device_id: int,
        content: BinaryIO,
        *,
        sha256: str,
        metadata: JSONObject,
        actor: str,
    ) -> BackupStored:
        """Store `content` (read to its end, chunk by chunk) as the device's newest backup.

        Raises Invalid, storing nothing, when its sha256 is not `sha256`. Backups beyond
        the newest `keep` are deleted in the same transaction, each audited.
        """
        created = metadata.get("created_at")
        uploaded = self.blobs.upload(
            tenant_id,
            device_id,
            content,
            sha256=sha256,
            metadata=metadata,
            actor=actor,
            created_at=float(created) if isinstance(created, int | float) else None,
        )
        return {**_summary(uploaded.blob), "pruned": uploaded.pruned}

    def backups(self, tenant_id: int, device: str) -> list[BackupSummary]:
        """The device's backups, newest first, with their metadata."""
        with self.store.db.read() as conn:
            dev = self.store.device(conn, tenant_id, device)
            return [_summary(b) for b in self.blobs.listed(conn, tenant_id, dev["id"], device)]

    def backup(self, tenant_id: int, device: str, backup_id: int) -> BackupSummary:
        """One backup's summary. Raises NotFound."""
        with self.store.db.read() as conn:
            return _summary(self.blobs.find(conn, tenant_id, device, backup_id))

    def backup_content(self, backup_id: int) -> Iterator[bytes]:
        """The backup's bytes, one chunk per short read transaction (a slow download holds
        no transaction open). Raises BackupGone if it is deleted meanwhile; the caller
        has already sent its size, so the client sees a short body."""
        return self.blobs.chunks(backup_id)

    def delete_backup(self, tenant_id: int, device: str, backup_id: int, actor: str) -> None:
        """Delete one backup (audited). Raises NotFound."""
        with self.store.write() as conn:
            found = self.blobs.find(conn, tenant_id, device, backup_id)
            self.blobs.remove(conn, tenant_id, found.device_id, device, backup_id, actor, "deleted")
