"""Reading the audit log: a tenant's entries (admins), verification of the whole chain,
and re-anchoring it after an operator restored the database from a backup.

Writing is `Store.audit`, inside each unit's own transaction; the chain itself
(HMAC per row, the head) is trueup.server.audit.
"""

from __future__ import annotations

import json

from sqlalchemy import select

from trueup.server import audit, chainproof
from trueup.server.anchor import Checkpoint
from trueup.server.service.records import AuditEntry
from trueup.server.service.store import Store
from trueup.server.tables import audit_log

__all__ = ["AuditTrail"]


class AuditTrail:
    def __init__(self, store: Store) -> None:
        self.store = store

    def audit_entries(self, tenant_id: int, limit: int) -> list[AuditEntry]:
        """The tenant's newest `limit` entries, newest first."""
        with self.store.db.read() as conn:
            rows = conn.execute(
                select(
                    audit_log.c.seq,
                    audit_log.c.at,
                    audit_log.c.actor,
                    audit_log.c.action,
                    audit_log.c.target,
                    audit_log.c.detail,
                    audit_log.c.row_hash,
                )
                .where(audit_log.c.tenant_id == tenant_id)
                .order_by(audit_log.c.seq.desc())
                .limit(limit)
            ).mappings()
            return [
                {
                    "seq": r["seq"],
                    "at": r["at"],
                    "actor": r["actor"],
                    "action": r["action"],
                    "target": r["target"],
                    "detail": json.loads(r["detail"]),
                    "row_hash": r["row_hash"],
                }
                for r in rows
            ]

    def verify_audit(self) -> list[audit.AuditProblem]:
        """Every problem with the chain and the tables it vouches for; [] when intact.
        Ends with each live credential the verified log contradicts or cannot vouch for."""
        with self.store.db.read() as conn:
            found = audit.verify(conn, self.store.key)
            try:
                found += chainproof.credential_problems(conn, self.store.key)
            except Exception as exc:  # verification reports; it never stops half-way
                found.append(
                    audit.AuditProblem("verify", "credentials", f"could not be checked: {exc!r}")
                )
            return found

    def unvouched_credentials(self) -> list[audit.AuditProblem]:
        """Each live credential the verified log contradicts or can no longer vouch for
        (a break in the chain after it was issued): refused until reissued."""
        with self.store.db.read() as conn:
            return chainproof.credential_problems(conn, self.store.key)

    def reanchor(self, actor: str) -> Checkpoint:
        """Accept the stored chain as it is: checkpoint its newest row unconditionally.

        For an operator who restored a backup (which rewinds the chain) and checked it
        with `verify`. Recorded as an `audit.reanchor` entry naming what was contradicted.
        It moves the checkpoint only: a break inside the chain keeps refusing the
        credentials issued before it (`unvouched_credentials`). Raises CheckpointError.
        """
        with self.store.db.read() as conn:
            contradicted = [str(p) for p in audit.anchor_problems(conn, self.store.key)]
        with self.store.write() as conn:
            self.store.audit(
                conn,
                tenant_id=None,
                actor=actor,
                action="audit.reanchor",
                target="checkpoint",
                detail={"contradicted": contradicted},
            )
        with self.store.db.read() as conn:
            return audit.reanchor(conn, self.store.key)
