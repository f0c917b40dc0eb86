"""Device evidence: bundles the agents upload, kept per device, listed and downloaded by humans.

A bundle is what `trueup evidence` builds on the router (trueup/backup/evidence.py);
here it is opaque bytes with a sha256, a size and the uploader's metadata, stored
in `evidence_chunks` rows like the backups (service/backups.py): one transaction
stores a bundle, answers the device's pending requests, prunes the oldest beyond
`keep` and audits all of it. Operators ask for a fresh bundle with a request the
agent sees in `pending_request` and answers by uploading one.

A download serves only what the audit log recorded: `evidence_bundle` refuses
(Tampered) a bundle whose sha256 or size is not the audited one, and
`evidence_content` holds back the last chunk until the bytes are known to hash
to the audited sha256, cutting the download short (EvidenceGone) if they do not.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from typing import Any, BinaryIO

from sqlalchemy import Connection, and_, delete, select

from trueup.server.limits import BACKUP_CHUNK_BYTES, EVIDENCE_KEEP
from trueup.server.service.errors import Invalid, NotFound, Tampered
from trueup.server.service.store import Store, inserted_id
from trueup.server.tables import devices, evidence, evidence_chunks, evidence_requests

__all__ = ["DeviceEvidence", "EvidenceGone"]


class EvidenceGone(Exception):
    """The bundle lost a chunk while it was being downloaded (the download is cut short)."""


_LISTED = (
    evidence.c.id,
    evidence.c.uploaded_at,
    evidence.c.size,
    evidence.c.sha256,
    evidence.c.meta,
)


def _summary(device: str, row: Any) -> dict[str, Any]:
    return {
        "id": row["id"],
        "device": device,
        "uploaded_at": row["uploaded_at"],
        "size": row["size"],
        "sha256": row["sha256"],
        "metadata": json.loads(row["meta"]),
    }


class DeviceEvidence:
    def __init__(self, store: Store, *, keep: int = EVIDENCE_KEEP) -> None:
        if keep < 1:
            raise ValueError("evidence retention must keep at least one bundle per device")
        self.store = store
        self.keep = keep

    def store_evidence(
        self,
        tenant_id: int,
        device_id: int,
        content: BinaryIO,
        *,
        sha256: str,
        metadata: dict[str, Any],
        actor: str,
    ) -> dict[str, Any]:
        """Store `content` as the device's newest bundle; answer its pending requests.

        Raises Invalid, storing nothing, when its sha256 is not `sha256`.
        """
        with self.store.write() as conn:
            device = self._device_name(conn, tenant_id, device_id)
            now = time.time()
            evidence_id = inserted_id(
                conn.execute(
                    evidence.insert().values(
                        tenant_id=tenant_id,
                        device_id=device_id,
                        uploaded_at=now,
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
                    evidence_chunks.insert().values(evidence_id=evidence_id, seq=seq, data=chunk)
                )
                seq += 1
            if digest.hexdigest() != sha256:
                raise Invalid(
                    [
                        f"header.X-Trueup-Evidence-Sha256: the body's sha256 is "
                        f"{digest.hexdigest()}, not {sha256}; nothing was stored"
                    ]
                )
            conn.execute(evidence.update().where(evidence.c.id == evidence_id).values(size=size))
            answered = [
                int(r.id)
                for r in conn.execute(
                    select(evidence_requests.c.id).where(
                        and_(
                            evidence_requests.c.device_id == device_id,
                            evidence_requests.c.answered_at.is_(None),
                        )
                    )
                )
            ]
            if answered:
                conn.execute(
                    evidence_requests.update()
                    .where(evidence_requests.c.id.in_(answered))
                    .values(answered_at=now, evidence_id=evidence_id)
                )
            self.store.audit(
                conn,
                tenant_id=tenant_id,
                actor=actor,
                action="evidence.upload",
                target=f"device:{device}/evidence:{evidence_id}",
                detail={
                    "evidence_id": evidence_id,
                    "device_id": device_id,
                    "sha256": sha256,
                    "size": size,
                    "answered_requests": answered,
                },
            )
            pruned = self._prune(conn, tenant_id, device_id, device, actor)
            row = (
                conn.execute(select(*_LISTED).where(evidence.c.id == evidence_id)).mappings().one()
            )
        return {**_summary(device, row), "pruned": pruned, "answered_requests": answered}

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
        old = [
            int(r.id)
            for r in conn.execute(
                select(evidence.c.id)
                .where(evidence.c.device_id == device_id)
                .order_by(evidence.c.id.desc())
                .offset(self.keep)
            )
        ]
        for evidence_id in old:
            conn.execute(
                delete(evidence_chunks).where(evidence_chunks.c.evidence_id == evidence_id)
            )
            conn.execute(delete(evidence).where(evidence.c.id == evidence_id))
            self.store.audit(
                conn,
                tenant_id=tenant_id,
                actor=actor,
                action="evidence.delete",
                target=f"device:{device}/evidence:{evidence_id}",
                detail={"evidence_id": evidence_id, "device_id": device_id, "reason": "retention"},
            )
        return old

    def request_evidence(self, tenant_id: int, device: str, actor: str) -> dict[str, Any]:
        """Record an operator's request for a fresh bundle (audited)."""
        with self.store.write() as conn:
            dev = self.store.device(conn, tenant_id, device)
            now = time.time()
            request_id = inserted_id(
                conn.execute(
                    evidence_requests.insert().values(
                        tenant_id=tenant_id,
                        device_id=dev["id"],
                        requested_at=now,
                        requested_by=actor,
                    )
                )
            )
            self.store.audit(
                conn,
                tenant_id=tenant_id,
                actor=actor,
                action="evidence.request",
                target=f"device:{device}/evidence-request:{request_id}",
                detail={"request_id": request_id, "device_id": dev["id"]},
            )
        return {"id": request_id, "device": device, "requested_at": now, "requested_by": actor}

    def pending_request(self, device_id: int) -> dict[str, Any] | None:
        """The device's oldest unanswered request, if any (what the agent polls)."""
        with self.store.db.read() as conn:
            row = (
                conn.execute(
                    select(evidence_requests.c.id, evidence_requests.c.requested_at)
                    .where(
                        and_(
                            evidence_requests.c.device_id == device_id,
                            evidence_requests.c.answered_at.is_(None),
                        )
                    )
                    .order_by(evidence_requests.c.id)
                    .limit(1)
                )
                .mappings()
                .one_or_none()
            )
        return None if row is None else {"id": row["id"], "requested_at": row["requested_at"]}

    def evidence_list(self, tenant_id: int, device: str) -> dict[str, Any]:
        """The device's bundles, newest first, and its unanswered requests."""
        with self.store.db.read() as conn:
            dev = self.store.device(conn, tenant_id, device)
            rows = conn.execute(
                select(*_LISTED)
                .where(and_(evidence.c.device_id == dev["id"], evidence.c.tenant_id == tenant_id))
                .order_by(evidence.c.id.desc())
            ).mappings()
            bundles = [_summary(device, r) for r in rows]
            pending = [
                {"id": r.id, "requested_at": r.requested_at, "requested_by": r.requested_by}
                for r in conn.execute(
                    select(
                        evidence_requests.c.id,
                        evidence_requests.c.requested_at,
                        evidence_requests.c.requested_by,
                    )
                    .where(
                        and_(
                            evidence_requests.c.device_id == dev["id"],
                            evidence_requests.c.answered_at.is_(None),
                        )
                    )
                    .order_by(evidence_requests.c.id)
                )
            ]
        return {"evidence": bundles, "pending_requests": pending}

    def evidence_bundle(self, tenant_id: int, device: str, evidence_id: int) -> dict[str, Any]:
        """One bundle's summary, if it belongs to this device of this tenant. Raises NotFound."""
        with self.store.db.read() as conn:
            dev = self.store.device(conn, tenant_id, device)
            row = (
                conn.execute(
                    select(*_LISTED).where(
                        and_(
                            evidence.c.id == evidence_id,
                            evidence.c.device_id == dev["id"],
                            evidence.c.tenant_id == tenant_id,
                        )
                    )
                )
                .mappings()
                .one_or_none()
            )
            if row is None:
                raise NotFound(f"evidence {evidence_id} of device {device!r} not found")
            audited = self.store.covered(conn).evidence.get(evidence_id)
            if audited is None or (audited.sha256, audited.size) != (row["sha256"], row["size"]):
                raise Tampered(
                    f"evidence {evidence_id} of device {device!r}: its sha256 or size is not the "
                    "one the audit log recorded at upload; not served (run `trueup server audit "
                    "verify`)"
                )
            return _summary(device, row)

    def audit_download(self, tenant_id: int, device: str, evidence_id: int, actor: str) -> None:
        with self.store.write() as conn:
            self.store.audit(
                conn,
                tenant_id=tenant_id,
                actor=actor,
                action="evidence.download",
                target=f"device:{device}/evidence:{evidence_id}",
                detail={"evidence_id": evidence_id},
            )

    def evidence_content(self, evidence_id: int) -> Iterator[bytes]:
        """The bundle's bytes, one chunk per short read transaction; the last chunk is sent
        only once all of them hash to the audited sha256 (else EvidenceGone)."""
        with self.store.db.read() as conn:
            audited = self.store.covered(conn).evidence.get(evidence_id)
        if audited is None:
            raise EvidenceGone(f"evidence {evidence_id} has no audited upload; not served")
        digest, held, seq = hashlib.sha256(), None, -1
        while True:
            with self.store.db.read() as conn:
                row = conn.execute(
                    select(evidence_chunks.c.seq, evidence_chunks.c.data)
                    .where(
                        and_(
                            evidence_chunks.c.evidence_id == evidence_id,
                            evidence_chunks.c.seq > seq,
                        )
                    )
                    .order_by(evidence_chunks.c.seq)
                    .limit(1)
                ).one_or_none()
            if row is None:
                break
            if row.seq != seq + 1:
                raise EvidenceGone(
                    f"evidence {evidence_id} lost chunk {seq + 1} during the download"
                )
            seq = int(row.seq)
            if held is not None:
                yield held
            held = bytes(row.data)
            digest.update(held)
        if digest.hexdigest() != audited.sha256:
            raise EvidenceGone(
                f"evidence {evidence_id}: its content does not hash to the audited sha256; "
                "the download is cut short (run `trueup server audit verify`)"
            )
        if held is not None:
            yield held
