"""Device backups: archives the agents upload, kept per device, listed and downloaded by humans.

An archive is opaque here: bytes with a sha256 and a size, plus the metadata
its uploader sent (format version, creation time, agent version, applied
revision, whether leases are in it). The content is stored in the database,
in `backup_chunks` rows of at most BACKUP_CHUNK_BYTES (tables.py): one
transaction stores a backup, prunes the device's oldest beyond `keep` and
audits both, so a backup is never half stored, never unaudited, and every
server process sharing the database (PostgreSQL on several hosts) serves it.
Upload and download go chunk by chunk; no archive is ever held whole in memory.

The caller spools the request body to a file first (api/routes/backups.py),
so the write transaction never waits on a slow network; the sha256 is checked
again here, while the chunks are inserted, and a mismatch rolls everything back.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from typing import Any, BinaryIO

from sqlalchemy import Connection, and_, delete, func, select

from trueup.server.limits import BACKUP_CHUNK_BYTES, BACKUP_KEEP
from trueup.server.service.errors import Invalid, NotFound
from trueup.server.service.store import Store, inserted_id
from trueup.server.tables import backup_chunks, backups, devices

__all__ = ["BackupGone", "DeviceBackups"]

_LISTED = (
    backups.c.id,
    backups.c.created_at,
    backups.c.uploaded_at,
    backups.c.size,
    backups.c.sha256,
    backups.c.meta,
)


class BackupGone(Exception):
    """The backup was deleted while it was being downloaded (the download is cut short)."""


def _summary(device: str, row: Any) -> dict[str, Any]:
    return {
        "id": row["id"],
        "device": device,
        "created_at": row["created_at"],
        "uploaded_at": row["uploaded_at"],
        "size": row["size"],
        "sha256": row["sha256"],
        "metadata": json.loads(row["meta"]),
    }


class DeviceBackups:
    def __init__(self, store: Store, *, keep: int = BACKUP_KEEP) -> None:
        if keep < 1:
            raise ValueError("backup retention must keep at least one backup per device")
        self.store = store
        self.keep = keep

    def store_backup(
        self,
        tenant_id: int,
        device_id: int,
        content: BinaryIO,
        *,
        sha256: str,
        metadata: dict[str, Any],
        actor: str,
    ) -> dict[str, Any]:
        """Store `content` (read to its end, chunk by chunk) as the device's newest backup.

        Raises Invalid, storing nothing, when its sha256 is not `sha256`. Backups beyond
        the newest `keep` are deleted in the same transaction, each audited.
        """
        created = metadata.get("created_at")
        with self.store.write() as conn:
            device = self._device_name(conn, tenant_id, device_id)
            backup_id = inserted_id(
                conn.execute(
                    backups.insert().values(
                        tenant_id=tenant_id,
                        device_id=device_id,
                        created_at=float(created) if isinstance(created, int | float) else None,
                        uploaded_at=time.time(),
                        size=0,
                        sha256=sha256,
                        meta=json.dumps(metadata, sort_keys=True),
                    )
                )
            )
            digest, size, seq = hashlib.sha256(), 0, 0
            while chunk := content.read(BACKUP_CHUNK_BYTES):
                digest.update(chunk)
                size += len(chunk)
                conn.execute(
                    backup_chunks.insert().values(backup_id=backup_id, seq=seq, data=chunk)
                )
                seq += 1
            if digest.hexdigest() != sha256:
                # Leaving the block by an exception rolls the whole transaction back.
                raise Invalid(
                    [
                        f"header.X-Trueup-Backup-Sha256: the body's sha256 is "
                        f"{digest.hexdigest()}, not {sha256}; nothing was stored"
                    ]
                )
            conn.execute(backups.update().where(backups.c.id == backup_id).values(size=size))
            self.store.audit(
                conn,
                tenant_id=tenant_id,
                actor=actor,
                action="backup.upload",
                target=f"device:{device}/backup:{backup_id}",
                detail={
                    "backup_id": backup_id,
                    "device_id": device_id,
                    "sha256": sha256,
                    "size": size,
                },
            )
            pruned = self._prune(conn, tenant_id, device_id, device, actor)
            row = conn.execute(select(*_LISTED).where(backups.c.id == backup_id)).mappings().one()
        return {**_summary(device, row), "pruned": pruned}

    def _device_name(self, conn: Connection, tenant_id: int, device_id: int) -> str:
        name = conn.execute(
            select(devices.c.name).where(
                and_(devices.c.id == device_id, devices.c.tenant_id == tenant_id)
            )
        ).scalar_one_or_none()
        if name is None:
            raise NotFound(f"device id={device_id} not found")
        return str(name)

    def _prune(
        self, conn: Connection, tenant_id: int, device_id: int, device: str, actor: str
    ) -> list[int]:
        """Delete the device's backups beyond the newest `keep` (audited, reason retention)."""
        old = [
            int(r.id)
            for r in conn.execute(
                select(backups.c.id)
                .where(backups.c.device_id == device_id)
                .order_by(backups.c.id.desc())
                .offset(self.keep)
            )
        ]
        for backup_id in old:
            self._delete(conn, tenant_id, device_id, device, backup_id, actor, "retention")
        return old

    def _delete(
        self,
        conn: Connection,
        tenant_id: int,
        device_id: int,
        device: str,
        backup_id: int,
        actor: str,
        reason: str,
    ) -> None:
        conn.execute(delete(backup_chunks).where(backup_chunks.c.backup_id == backup_id))
        conn.execute(delete(backups).where(backups.c.id == backup_id))
        self.store.audit(
            conn,
            tenant_id=tenant_id,
            actor=actor,
            action="backup.delete",
            target=f"device:{device}/backup:{backup_id}",
            detail={"backup_id": backup_id, "device_id": device_id, "reason": reason},
        )

    def _row(self, conn: Connection, tenant_id: int, device: str, backup_id: int) -> Any:
        """The backup's row, if it belongs to this device of this tenant. Raises NotFound."""
        dev = self.store.device(conn, tenant_id, device)
        row = (
            conn.execute(
                select(*_LISTED, backups.c.device_id).where(
                    and_(
                        backups.c.id == backup_id,
                        backups.c.device_id == dev["id"],
                        backups.c.tenant_id == tenant_id,
                    )
                )
            )
            .mappings()
            .one_or_none()
        )
        if row is None:
            raise NotFound(f"backup {backup_id} of device {device!r} not found")
        return row

    def backups(self, tenant_id: int, device: str) -> list[dict[str, Any]]:
        """The device's backups, newest first, with their metadata."""
        with self.store.db.read() as conn:
            dev = self.store.device(conn, tenant_id, device)
            rows = conn.execute(
                select(*_LISTED)
                .where(and_(backups.c.device_id == dev["id"], backups.c.tenant_id == tenant_id))
                .order_by(backups.c.id.desc())
            ).mappings()
            return [_summary(device, r) for r in rows]

    def backup(self, tenant_id: int, device: str, backup_id: int) -> dict[str, Any]:
        """One backup's summary. Raises NotFound."""
        with self.store.db.read() as conn:
            return _summary(device, self._row(conn, tenant_id, device, backup_id))

    def backup_content(self, backup_id: int) -> Iterator[bytes]:
        """The backup's bytes, one chunk per short read transaction (a slow download holds
        no transaction open). Raises BackupGone if it is deleted meanwhile; the caller
        has already sent its size, so the client sees a short body."""
        seq = -1
        while True:
            with self.store.db.read() as conn:
                row = conn.execute(
                    select(backup_chunks.c.seq, backup_chunks.c.data)
                    .where(and_(backup_chunks.c.backup_id == backup_id, backup_chunks.c.seq > seq))
                    .order_by(backup_chunks.c.seq)
                    .limit(1)
                ).one_or_none()
                if row is None:
                    present = conn.execute(
                        select(func.count()).select_from(backups).where(backups.c.id == backup_id)
                    ).scalar_one()
                    if not present:
                        raise BackupGone(f"backup {backup_id} was deleted during the download")
                    return
            if row.seq != seq + 1:
                raise BackupGone(f"backup {backup_id} lost chunk {seq + 1} during the download")
            seq = int(row.seq)
            yield bytes(row.data)

    def delete_backup(self, tenant_id: int, device: str, backup_id: int, actor: str) -> None:
        """Delete one backup (audited). Raises NotFound."""
        with self.store.write() as conn:
            row = self._row(conn, tenant_id, device, backup_id)
            self._delete(conn, tenant_id, row["device_id"], device, backup_id, actor, "deleted")
