"""Device evidence: bundles the agents upload, kept per device, listed and downloaded by humans.

A bundle is what `trueup evidence` builds on the router (trueup/backup/evidence.py);
here it is a blob (service/blobs.py) in the `evidence` and `evidence_chunks`
tables, with the uploader's metadata: one transaction stores a bundle, answers
the device's pending requests, prunes the oldest beyond `keep` and audits all of
it (`evidence.upload`, `evidence.delete`). Operators ask for a fresh bundle with a
request (`evidence.request`) the agent sees in `pending_request` and answers by
uploading one; each download is audited (`evidence.download`). No interface
deletes a bundle but the retention.

A download serves only what the audit log recorded: `evidence_bundle` refuses
(Tampered) a bundle whose sha256 or size is not the audited one, and
`evidence_content` holds back the last chunk until the bytes are known to hash
to the audited sha256, cutting the download short (EvidenceGone) if they do not.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import BinaryIO, TypedDict

from sqlalchemy import ColumnElement, Connection, and_, select

from trueup.model.jsontypes import JSONObject
from trueup.server.limits import EVIDENCE_KEEP
from trueup.server.service.blobs import Blob, BlobGone, BlobKind, Blobs, Stored
from trueup.server.service.errors import Tampered
from trueup.server.service.store import Store, inserted_id
from trueup.server.tables import evidence, evidence_chunks, evidence_requests

__all__ = [
    "DeviceEvidence",
    "EvidenceGone",
    "EvidenceListing",
    "EvidenceRequest",
    "EvidenceStored",
    "EvidenceSummary",
    "ListedRequest",
    "PendingRequest",
]


class EvidenceGone(BlobGone):
    """The bundle lost a chunk while it was being downloaded (the download is cut short)."""


class EvidenceSummary(TypedDict):
    id: int
    device: str
    uploaded_at: float
    size: int
    sha256: str
    metadata: JSONObject


class EvidenceStored(EvidenceSummary):
    """An upload's answer: the bundle, the ids its retention deleted, the requests it answered."""

    pruned: list[int]
    answered_requests: list[int]


class PendingRequest(TypedDict):
    """A request the device has not answered yet, as the agent polls it."""

    id: int
    requested_at: float


class ListedRequest(PendingRequest):
    """A pending request as listed: who asked."""

    requested_by: str


class EvidenceRequest(ListedRequest):
    """A request just recorded."""

    device: str


class EvidenceListing(TypedDict):
    evidence: list[EvidenceSummary]
    pending_requests: list[ListedRequest]


EVIDENCE = BlobKind(
    noun="evidence",
    table=evidence,
    chunks=evidence_chunks,
    sha256_header="X-Trueup-Evidence-Sha256",
    gone=EvidenceGone,
)


def _summary(blob: Blob) -> EvidenceSummary:
    return {
        "id": blob.id,
        "device": blob.device,
        "uploaded_at": blob.uploaded_at,
        "size": blob.size,
        "sha256": blob.sha256,
        "metadata": blob.metadata,
    }


def _unanswered(device_id: int) -> ColumnElement[bool]:
    return and_(
        evidence_requests.c.device_id == device_id,
        evidence_requests.c.answered_at.is_(None),
    )


def _answer_requests(conn: Connection, stored: Stored) -> dict[str, list[int]]:
    """Mark the device's pending requests answered by the bundle just stored."""
    answered = [
        int(r.id)
        for r in conn.execute(select(evidence_requests.c.id).where(_unanswered(stored.device_id)))
    ]
    if answered:
        conn.execute(
            evidence_requests.update()
            .where(evidence_requests.c.id.in_(answered))
            .values(answered_at=stored.uploaded_at, evidence_id=stored.id)
        )
    return {"answered_requests": answered}


class DeviceEvidence:
    def __init__(self, store: Store, *, keep: int = EVIDENCE_KEEP) -> None:
        if keep < 1:
            raise ValueError("evidence retention must keep at least one bundle per device")
        self.store = store
        self.blobs = Blobs(store, EVIDENCE, keep=keep)

    def store_evidence(
        self,
        tenant_id: int,
        device_id: int,
        content: BinaryIO,
        *,
        sha256: str,
        metadata: JSONObject,
        actor: str,
    ) -> EvidenceStored:
        """Store `content` as the device's newest bundle; answer its pending requests.

        Raises Invalid, storing nothing, when its sha256 is not `sha256`.
        """
        uploaded = self.blobs.upload(
            tenant_id,
            device_id,
            content,
            sha256=sha256,
            metadata=metadata,
            actor=actor,
            then=_answer_requests,
        )
        return {
            **_summary(uploaded.blob),
            "pruned": uploaded.pruned,
            "answered_requests": uploaded.extra["answered_requests"],
        }

    def request_evidence(self, tenant_id: int, device: str, actor: str) -> EvidenceRequest:
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

    def pending_request(self, device_id: int) -> PendingRequest | None:
        """The device's oldest unanswered request, if any (what the agent polls)."""
        with self.store.db.read() as conn:
            row = conn.execute(
                select(evidence_requests.c.id, evidence_requests.c.requested_at)
                .where(_unanswered(device_id))
                .order_by(evidence_requests.c.id)
                .limit(1)
            ).one_or_none()
        return None if row is None else {"id": row.id, "requested_at": row.requested_at}

    def evidence_list(self, tenant_id: int, device: str) -> EvidenceListing:
        """The device's bundles, newest first, and its unanswered requests."""
        with self.store.db.read() as conn:
            dev = self.store.device(conn, tenant_id, device)
            bundles = [_summary(b) for b in self.blobs.listed(conn, tenant_id, dev["id"], device)]
            pending: list[ListedRequest] = [
                {"id": r.id, "requested_at": r.requested_at, "requested_by": r.requested_by}
                for r in conn.execute(
                    select(
                        evidence_requests.c.id,
                        evidence_requests.c.requested_at,
                        evidence_requests.c.requested_by,
                    )
                    .where(_unanswered(dev["id"]))
                    .order_by(evidence_requests.c.id)
                )
            ]
        return {"evidence": bundles, "pending_requests": pending}

    def evidence_bundle(self, tenant_id: int, device: str, evidence_id: int) -> EvidenceSummary:
        """One bundle's summary, if it belongs to this device of this tenant and is the one
        the audit log recorded. Raises NotFound, or Tampered."""
        with self.store.db.read() as conn:
            found = self.blobs.find(conn, tenant_id, device, evidence_id)
            audited = self.store.covered(conn).evidence.get(evidence_id)
            if audited is None or (audited.sha256, audited.size) != (found.sha256, found.size):
                raise Tampered(
                    f"evidence {evidence_id} of device {device!r}: its sha256 or size is not the "
                    "one the audit log recorded at upload; not served (run `trueup server audit "
                    "verify`)"
                )
            return _summary(found)

    def audit_download(self, tenant_id: int, device: str, evidence_id: int, actor: str) -> None:
        with self.store.write() as conn:
            self.store.audit(
                conn,
                tenant_id=tenant_id,
                actor=actor,
                action="evidence.download",
                target=EVIDENCE.target(device, evidence_id),
                detail={"evidence_id": evidence_id},
            )

    def evidence_content(self, evidence_id: int) -> Iterator[bytes]:
        """The bundle's bytes, one chunk per short read transaction; the last chunk is sent
        only once all of them hash to the audited sha256 (else EvidenceGone)."""
        with self.store.db.read() as conn:
            audited = self.store.covered(conn).evidence.get(evidence_id)
        if audited is None:
            raise EvidenceGone(f"evidence {evidence_id} has no audited upload; not served")
        yield from self.blobs.chunks(evidence_id, audited_sha256=audited.sha256)
