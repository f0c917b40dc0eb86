"""One chunked blob store: what device backups and evidence bundles are both made of.

A blob is opaque bytes one device of one tenant uploaded: a row (tenant, device,
upload time, size, sha256, the uploader's metadata as JSON) and its content in
chunk rows of at most BACKUP_CHUNK_BYTES, so no value comes near PostgreSQL's
limits and neither upload nor download holds a whole blob in memory. `Blobs`
is the store over one `BlobKind`:

- `upload` stores a blob in one write transaction: the row, the chunks (hashed
  while they are inserted: a digest other than the announced one stores nothing),
  what the kind does beside it (`then`), the audited `NOUN.upload`, and the
  retention that keeps the device's newest `keep` (each pruned one audited as
  `NOUN.delete`, reason retention);
- `find` and `listed` read a device's blobs (tenant-scoped: another tenant's
  device or blob is not found); `remove` deletes one, audited;
- `chunks` streams the content one chunk per short read transaction, so a slow
  download holds no transaction open, and checks its integrity on the way: a
  missing chunk cuts it short, and so does content that does not hash to the
  audited sha256 (the last chunk is held back until it is known) or, where no
  digest is given, a blob deleted meanwhile.

A kind keeps its own two tables (`backups`/`backup_chunks`, `evidence`/
`evidence_chunks`, tables.py) and its own ids: those ids are in the hash-chained
audit log (`device:D/backup:7`, `evidence_id`), in `audit verify`'s per-table
checks and in the API's paths, so one shared table would have to renumber one
kind or key every row by (kind, id). The code is what they share.
service/backups.py and service/evidence.py say what their blobs are.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

from sqlalchemy import Column, Connection, RowMapping, Table, and_, delete, func, select

from trueup.model.jsontypes import JSONObject
from trueup.server.limits import BACKUP_CHUNK_BYTES
from trueup.server.service.errors import Invalid, NotFound
from trueup.server.service.store import Store, inserted_id
from trueup.server.tables import devices

__all__ = ["Blob", "BlobGone", "BlobKind", "Blobs", "Stored", "Uploaded"]


class BlobGone(Exception):
    """The blob lost a chunk, or its integrity, while it was being downloaded (the
    download is cut short: the client has its Content-Length and sees a short body)."""


@dataclass(frozen=True)
class BlobKind:
    """Which tables hold one kind of blob, and the words its audit entries and messages use.

    `noun` names the audit actions (`NOUN.upload`, `NOUN.delete`), the targets
    (`device:D/NOUN:ID`), the id in audit details and in the chunk table (`NOUN_id`)
    and the blob in messages; `sha256_header` is the upload header a digest mismatch
    names; `gone` is what a cut-short download raises. A `dated` kind's rows carry the
    blob's own creation time (`created_at`, from its metadata) beside the upload time.
    """

    noun: str
    table: Table
    chunks: Table
    sha256_header: str
    gone: type[BlobGone]
    dated: bool = False

    @property
    def id_key(self) -> str:
        return f"{self.noun}_id"

    @property
    def chunk_owner(self) -> Column[Any]:
        column: Column[Any] = self.chunks.c[self.id_key]
        return column

    def target(self, device: str, blob_id: int) -> str:
        return f"device:{device}/{self.noun}:{blob_id}"


@dataclass(frozen=True)
class Blob:
    """One stored blob, as listed (its content is streamed by `Blobs.chunks`)."""

    id: int
    device_id: int
    device: str
    uploaded_at: float
    size: int
    sha256: str
    metadata: JSONObject
    created_at: float | None = None


@dataclass(frozen=True)
class Stored:
    """A blob just stored, seen by an upload's `then` inside the storing transaction."""

    id: int
    tenant_id: int
    device_id: int
    device: str
    uploaded_at: float
    sha256: str
    size: int


@dataclass(frozen=True)
class Uploaded:
    """What an upload stored, the ids its retention pruned, and what its `then` added."""

    blob: Blob
    pruned: list[int]
    extra: dict[str, list[int]]


# What a kind does in an upload's transaction once the blob is stored: its answer is
# added to the upload's audit detail (and to the upload's answer) as is.
Then = Callable[[Connection, Stored], dict[str, list[int]]]


class Blobs:
    """The chunked store of one kind of blob, kept per device (the newest `keep`)."""

    def __init__(self, store: Store, kind: BlobKind, *, keep: int) -> None:
        self.store = store
        self.kind = kind
        self.keep = keep
        table = kind.table
        self._listed = (
            table.c.id,
            table.c.device_id,
            table.c.uploaded_at,
            table.c.size,
            table.c.sha256,
            table.c.meta,
            *((table.c.created_at,) if kind.dated else ()),
        )

    def upload(
        self,
        tenant_id: int,
        device_id: int,
        content: BinaryIO,
        *,
        sha256: str,
        metadata: JSONObject,
        actor: str,
        created_at: float | None = None,
        then: Then | None = None,
    ) -> Uploaded:
        """Store `content` (read to its end, chunk by chunk) as the device's newest blob.

        Raises Invalid, storing nothing, when its sha256 is not `sha256`, and NotFound
        when the device is not the tenant's. One transaction stores it, runs `then`,
        audits the upload and prunes the device's blobs beyond the newest `keep`.
        """
        kind = self.kind
        with self.store.write() as conn:
            device = self._device_name(conn, tenant_id, device_id)
            now = time.time()
            dated = {"created_at": created_at} if kind.dated else {}
            blob_id = inserted_id(
                conn.execute(
                    kind.table.insert().values(
                        tenant_id=tenant_id,
                        device_id=device_id,
                        uploaded_at=now,
                        size=0,
                        sha256=sha256,
                        meta=json.dumps(metadata, sort_keys=True),
                        **dated,
                    )
                )
            )
            size = self._put_chunks(conn, blob_id, content, sha256)
            conn.execute(kind.table.update().where(kind.table.c.id == blob_id).values(size=size))
            stored = Stored(blob_id, tenant_id, device_id, device, now, sha256, size)
            extra = then(conn, stored) if then is not None else {}
            self.store.audit(
                conn,
                tenant_id=tenant_id,
                actor=actor,
                action=f"{kind.noun}.upload",
                target=kind.target(device, blob_id),
                detail={
                    kind.id_key: blob_id,
                    "device_id": device_id,
                    "sha256": sha256,
                    "size": size,
                    **extra,
                },
            )
            pruned = self._prune(conn, tenant_id, device_id, device, actor)
            row = (
                conn.execute(select(*self._listed).where(kind.table.c.id == blob_id))
                .mappings()
                .one()
            )
        return Uploaded(self._blob(device, row), pruned, extra)

    def _put_chunks(self, conn: Connection, blob_id: int, content: BinaryIO, sha256: str) -> int:
        """Insert `content` as the blob's chunks; its size. Raises Invalid (the caller's
        transaction rolls back) when the bytes do not hash to `sha256`."""
        digest, size, seq = hashlib.sha256(), 0, 0
        while chunk := content.read(BACKUP_CHUNK_BYTES):
            digest.update(chunk)
            size += len(chunk)
            conn.execute(
                self.kind.chunks.insert().values(
                    {self.kind.id_key: blob_id, "seq": seq, "data": chunk}
                )
            )
            seq += 1
        if digest.hexdigest() != sha256:
            raise Invalid(
                [
                    f"header.{self.kind.sha256_header}: the body's sha256 is "
                    f"{digest.hexdigest()}, not {sha256}; nothing was stored"
                ]
            )
        return size

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
        """Delete the device's blobs beyond the newest `keep` (audited, reason retention)."""
        table = self.kind.table
        old = [
            int(r.id)
            for r in conn.execute(
                select(table.c.id)
                .where(table.c.device_id == device_id)
                .order_by(table.c.id.desc())
                .offset(self.keep)
            )
        ]
        for blob_id in old:
            self.remove(conn, tenant_id, device_id, device, blob_id, actor, "retention")
        return old

    def remove(
        self,
        conn: Connection,
        tenant_id: int,
        device_id: int,
        device: str,
        blob_id: int,
        actor: str,
        reason: str,
    ) -> None:
        """Delete one blob and its chunks inside the caller's write, audited as `NOUN.delete`."""
        kind = self.kind
        conn.execute(delete(kind.chunks).where(kind.chunk_owner == blob_id))
        conn.execute(delete(kind.table).where(kind.table.c.id == blob_id))
        self.store.audit(
            conn,
            tenant_id=tenant_id,
            actor=actor,
            action=f"{kind.noun}.delete",
            target=kind.target(device, blob_id),
            detail={kind.id_key: blob_id, "device_id": device_id, "reason": reason},
        )

    def find(self, conn: Connection, tenant_id: int, device: str, blob_id: int) -> Blob:
        """The blob, if it belongs to this device of this tenant. Raises NotFound."""
        table = self.kind.table
        dev = self.store.device(conn, tenant_id, device)
        row = (
            conn.execute(
                select(*self._listed).where(
                    and_(
                        table.c.id == blob_id,
                        table.c.device_id == dev["id"],
                        table.c.tenant_id == tenant_id,
                    )
                )
            )
            .mappings()
            .one_or_none()
        )
        if row is None:
            raise NotFound(f"{self.kind.noun} {blob_id} of device {device!r} not found")
        return self._blob(device, row)

    def listed(self, conn: Connection, tenant_id: int, device_id: int, device: str) -> list[Blob]:
        """The device's blobs, newest first."""
        table = self.kind.table
        rows = conn.execute(
            select(*self._listed)
            .where(and_(table.c.device_id == device_id, table.c.tenant_id == tenant_id))
            .order_by(table.c.id.desc())
        ).mappings()
        return [self._blob(device, r) for r in rows]

    def _blob(self, device: str, row: RowMapping) -> Blob:
        return Blob(
            id=int(row["id"]),
            device_id=int(row["device_id"]),
            device=device,
            uploaded_at=row["uploaded_at"],
            size=int(row["size"]),
            sha256=row["sha256"],
            metadata=json.loads(row["meta"]),
            created_at=row["created_at"] if self.kind.dated else None,
        )

    def chunks(self, blob_id: int, *, audited_sha256: str | None = None) -> Iterator[bytes]:
        """The blob's bytes, one chunk per short read transaction. Raises `kind.gone`
        when a chunk is missing. With `audited_sha256`, the last chunk is sent only once
        all of them hash to it (else `gone`); without one, the end of the chunks is
        trusted only while the blob's row is still there (else `gone`: it was deleted)."""
        kind, gone = self.kind, self.kind.gone
        digest, held, seq = hashlib.sha256(), None, -1
        while True:
            with self.store.db.read() as conn:
                row = conn.execute(
                    select(kind.chunks.c.seq, kind.chunks.c.data)
                    .where(and_(kind.chunk_owner == blob_id, kind.chunks.c.seq > seq))
                    .order_by(kind.chunks.c.seq)
                    .limit(1)
                ).one_or_none()
                if row is None and audited_sha256 is None and not self._present(conn, blob_id):
                    raise gone(f"{kind.noun} {blob_id} was deleted during the download")
            if row is None:
                break
            if row.seq != seq + 1:
                raise gone(f"{kind.noun} {blob_id} lost chunk {seq + 1} during the download")
            seq = int(row.seq)
            if audited_sha256 is None:
                yield bytes(row.data)
                continue
            if held is not None:
                yield held
            held = bytes(row.data)
            digest.update(held)
        if audited_sha256 is None:
            return
        if digest.hexdigest() != audited_sha256:
            raise gone(
                f"{kind.noun} {blob_id}: its content does not hash to the audited sha256; "
                "the download is cut short (run `trueup server audit verify`)"
            )
        if held is not None:
            yield held

    def _present(self, conn: Connection, blob_id: int) -> bool:
        table = self.kind.table
        count = conn.execute(
            select(func.count()).select_from(table).where(table.c.id == blob_id)
        ).scalar_one()
        return bool(count)
