"""Desired revisions: numbered, immutable documents per device.

`put_desired` validates with the agent's own document model, then advances the
device's version by one compare-and-set `UPDATE … WHERE desired_version =
:expected` (If-Match), so of any number of concurrent writers on any number of
server processes exactly one wins and the others get Conflict. Nothing here
edits or deletes a revision. The long-poll questions (`desired_after`,
`revisions_since`, `max_revision_id`) are answered here too.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, RowMapping, and_, func, select, update

from trueup.model.document import DeviceState, DocumentError, document_digest, parse_document
from trueup.model.jsontypes import JSONObject
from trueup.model.layering.types import ProvenanceJSON
from trueup.server.service.errors import Conflict, Invalid, NotFound, Tampered
from trueup.server.service.records import RevisionDetail, RevisionSummary
from trueup.server.service.store import Store
from trueup.server.tables import devices, revisions

__all__ = ["DesiredRevisions", "Revision"]


@dataclass(frozen=True)
class Revision:
    device: str
    version: int
    parent_version: int | None
    author: str
    comment: str
    content_hash: str
    created_at: float
    document: JSONObject  # the stored document, canonical JSON (DeviceState parses it)
    # Where a rendered revision came from (profile versions, variables and own-layer
    # digests; None for a document written whole) and the confirm-or-rollback window
    # the agent applies it with (seconds; None: the agent's own default).
    provenance: ProvenanceJSON | None = None
    confirm_within: int | None = None

    def summary(self) -> RevisionSummary:
        return {
            "device": self.device,
            "version": self.version,
            "parent_version": self.parent_version,
            "author": self.author,
            "comment": self.comment,
            "content_hash": self.content_hash,
            "created_at": self.created_at,
            "provenance": self.provenance,
            "confirm_within": self.confirm_within,
        }


def _revision(device: str, row: RowMapping) -> Revision:
    return Revision(
        device=device,
        version=row["version"],
        parent_version=row["parent_version"],
        author=row["author"],
        comment=row["comment"],
        content_hash=row["content_hash"],
        created_at=row["created_at"],
        document=json.loads(row["document"]),
        provenance=json.loads(row["provenance"]) if row["provenance"] else None,
        confirm_within=row["confirm_within"],
    )


# Raises when another writer holds the device (a rollout: service.errors.Busy), inside
# put_desired's write transaction; set by the ControlPlane.
BusyCheck = Callable[[Connection, int, str], None]


class DesiredRevisions:
    def __init__(self, store: Store, busy: BusyCheck | None = None) -> None:
        self.store = store
        self.busy = busy

    def put_desired(
        self,
        tenant_id: int,
        device: str,
        expected_version: int,
        data: Any,
        *,
        author: str,
        comment: str = "",
        provenance: ProvenanceJSON | None = None,
        confirm_within: int | None = None,
    ) -> Revision:
        """Store `data` as the device's next revision if it is at `expected_version`.

        Raises NotFound, Invalid (each problem with its path; nothing stored), Conflict, or
        Busy when an unfinished rollout holds the device.
        """
        with self.store.db.read() as conn:
            self.store.device(conn, tenant_id, device)
        document = self.validated(device, data)
        with self.store.write() as conn:
            row = self.store.device(conn, tenant_id, device)
            if self.busy is not None:
                self.busy(conn, int(row["id"]), device)
            return self.insert_revision(
                conn,
                tenant_id=tenant_id,
                device_id=int(row["id"]),
                device=device,
                expected_version=expected_version,
                document=document,
                author=author,
                comment=comment,
                provenance=provenance,
                confirm_within=confirm_within,
            )

    @staticmethod
    def validated(device: str, data: Any) -> DeviceState:
        """`data` parsed by the agent's document model for `device`; Invalid names each problem."""
        try:
            document = parse_document(data, source=f"device {device}")
        except DocumentError as exc:
            raise Invalid(exc.problems) from None
        if document.metadata.device != device:
            raise Invalid(
                [
                    f"metadata.device: {document.metadata.device!r} does not match the device "
                    f"in the URL ({device!r})"
                ]
            )
        return document

    def insert_revision(
        self,
        conn: Connection,
        *,
        tenant_id: int,
        device_id: int,
        device: str,
        expected_version: int,
        document: DeviceState,
        author: str,
        comment: str = "",
        provenance: ProvenanceJSON | None = None,
        confirm_within: int | None = None,
        at: float | None = None,
    ) -> Revision:
        """Store a validated document as the device's next revision inside the caller's
        transaction (a rollout marks its member sent in the same one): compare-and-set on
        the device's desired version (Conflict to the loser), the revision row, its audit
        entry. Nothing is stored unless the caller's transaction commits."""
        content_hash = document_digest(document)
        now = time.time() if at is None else at
        new_version = expected_version + 1
        # Compare-and-set: the loser of a race updates no row and gets 409.
        swapped = conn.execute(
            update(devices)
            .where(and_(devices.c.id == device_id, devices.c.desired_version == expected_version))
            .values(desired_version=new_version)
        ).rowcount
        if swapped != 1:
            current = conn.execute(
                select(devices.c.desired_version).where(devices.c.id == device_id)
            ).scalar_one()
            raise Conflict(device, expected_version, int(current))
        body = document.with_version(new_version).canonical()
        conn.execute(
            revisions.insert().values(
                device_id=device_id,
                version=new_version,
                parent_version=expected_version or None,
                author=author,
                comment=comment,
                content_hash=content_hash,
                document=json.dumps(body, sort_keys=True),
                created_at=now,
                provenance=json.dumps(provenance, sort_keys=True) if provenance else None,
                confirm_within=confirm_within,
            )
        )
        detail: RevisionDetail = {
            "device_id": device_id,
            "version": new_version,
            "parent_version": expected_version or None,
            "content_hash": content_hash,
            "author": author,
            "comment": comment,
        }
        if provenance:
            detail["provenance"] = provenance
        if confirm_within is not None:
            detail["confirm_within"] = confirm_within
        self.store.audit(
            conn,
            tenant_id=tenant_id,
            actor=author,
            action="revision.create",
            target=f"device:{device}",
            detail=detail,
            at=now,
        )
        return Revision(
            device=device,
            version=new_version,
            parent_version=expected_version or None,
            author=author,
            comment=comment,
            content_hash=content_hash,
            created_at=now,
            document=body,
            provenance=provenance,
            confirm_within=confirm_within,
        )

    def _revision_at(
        self, conn: Connection, device: str, device_id: int, version: int
    ) -> Revision | None:
        if version <= 0:
            return None
        rev = (
            conn.execute(
                select(revisions).where(
                    and_(revisions.c.device_id == device_id, revisions.c.version == version)
                )
            )
            .mappings()
            .one_or_none()
        )
        return _revision(device, rev) if rev is not None else None

    def desired(self, tenant_id: int, device: str) -> Revision | None:
        """The device's desired revision; None before the first one."""
        with self.store.db.read() as conn:
            row = self.store.device(conn, tenant_id, device)
            return self._revision_at(conn, device, row["id"], row["desired_version"])

    def revision(self, tenant_id: int, device: str, version: int) -> Revision:
        with self.store.db.read() as conn:
            row = self.store.device(conn, tenant_id, device)
            rev = self._revision_at(conn, device, row["id"], version)
        if rev is None:
            raise NotFound(f"device {device!r} has no revision {version}")
        return rev

    def revisions(self, tenant_id: int, device: str) -> list[Revision]:
        """Every revision of the device, oldest first."""
        with self.store.db.read() as conn:
            row = self.store.device(conn, tenant_id, device)
            rows = conn.execute(
                select(revisions)
                .where(revisions.c.device_id == row["id"])
                .order_by(revisions.c.version)
            ).mappings()
            return [_revision(device, r) for r in rows]

    # -- the agents' long poll ---------------------------------------------------------------

    def desired_after(self, device_id: int, device: str, after: int) -> Revision | None:
        """The newest revision if it is newer than `after` (the agent's long-poll question)."""
        with self.store.db.read() as conn:
            version = conn.execute(
                select(devices.c.desired_version).where(devices.c.id == device_id)
            ).scalar_one()
            if version <= after:
                return None
            revision = self._revision_at(conn, device, device_id, version)
            if revision is not None:
                self._refuse_unaudited(conn, device_id, revision)
            return revision

    def _refuse_unaudited(self, conn: Connection, device_id: int, revision: Revision) -> None:
        """Raise Tampered unless the audit log vouches for sending this revision to the agent:
        its entry, its document (by the audited content hash), that no newer revision was
        audited (a rolled-back desired version), and no break in the chain after it (a newer
        revision's entry may have been removed). An attacker with the database but not the
        key could otherwise push any document to the device."""
        facts = self.store.covered(conn)
        name = f"revision {revision.version} of {revision.device!r}"
        verify = "; not served (run `trueup server audit verify`; apply a revision again)"
        fact = facts.revisions.get((device_id, revision.version))
        if fact is None:
            raise Tampered(f"{name} has no audit entry{verify}")
        if fact.confirm_within != revision.confirm_within:
            raise Tampered(f"{name}: its confirmation window is not the audited one{verify}")
        try:
            digest = document_digest(parse_document(revision.document))
        except DocumentError:
            digest = None
        if fact.content_hash is not None and (
            digest != fact.content_hash or revision.content_hash != fact.content_hash
        ):
            raise Tampered(f"{name}: its document differs from the audited one{verify}")
        newest = max(v for (d, v) in facts.revisions if d == device_id)
        if newest > revision.version:
            raise Tampered(
                f"{name}: the audit log's newest revision is {newest}: the desired version "
                f"was rolled back behind the server's back{verify}"
            )
        broken = self.store.audit_break_after(fact.seq)
        if broken is not None:
            raise Tampered(
                f"{name}: the audit log does not hold together at seq={broken}, after this "
                f"revision was audited (seq={fact.seq}): a newer one may have been removed"
                f"{verify}"
            )

    def revisions_since(self, revision_id: int) -> list[tuple[int, int]]:
        """(revision id, device id) of every revision made after `revision_id`, any process."""
        with self.store.db.read() as conn:
            rows = conn.execute(
                select(revisions.c.id, revisions.c.device_id).where(revisions.c.id > revision_id)
            ).all()
        return [(int(r.id), int(r.device_id)) for r in rows]

    def max_revision_id(self) -> int:
        with self.store.db.read() as conn:
            return int(
                conn.execute(select(func.coalesce(func.max(revisions.c.id), 0))).scalar_one()
            )
