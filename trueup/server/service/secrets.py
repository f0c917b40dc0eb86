"""Tenant-bound secrets: sealed with the tenant's data key, opened only for their device.

A secret is sealed with AES-256-GCM under the tenant's data key with `tenant id
+ secret id` as associated data (keys.py), so a ciphertext copied into another
tenant's row or onto another secret fails to open and is named, not served.
Humans list names; only the device the secret belongs to receives values.

Each put is audited with the secret's version number (1, 2, … per device and
name) and a keyed digest of its value (coverage.secret_digest: an HMAC under
the server key, never the plaintext or a plain hash). A device receives a
secret only if its row is the newest audited version and its value matches
that digest: a row rolled back to an earlier (validly sealed) version, or one
the log does not know, is refused by name in `refused`, which the agent logs.
"""

from __future__ import annotations

import time
import uuid

from sqlalchemy import Connection, RowMapping, and_, select

from trueup.server.coverage import CoverFacts, secret_digest
from trueup.server.keys import SecretBox, SecretRefused
from trueup.server.service.errors import check_name
from trueup.server.service.records import DeviceSecrets, RefusedSecret, SecretName, StoredSecret
from trueup.server.service.store import Store
from trueup.server.tables import secrets, tenants

__all__ = ["TenantSecrets"]


class TenantSecrets:
    def __init__(self, store: Store) -> None:
        self.store = store

    def _box(self, conn: Connection, tenant_id: int) -> SecretBox:
        wrapped = conn.execute(
            select(tenants.c.data_key_wrapped).where(tenants.c.id == tenant_id)
        ).scalar_one()
        return SecretBox(tenant_id, self.store.key.unwrap_tenant_key(tenant_id, wrapped))

    def put_secret(
        self, tenant_id: int, device: str, name: str, value: str, actor: str
    ) -> StoredSecret:
        """Store (or replace) a device's secret; each version gets a new secret id."""
        check_name("name", name)
        secret_id = uuid.uuid4().hex
        with self.store.write() as conn:
            row = self.store.device(conn, tenant_id, device)
            nonce, ciphertext = self._box(conn, tenant_id).seal(secret_id, value.encode())
            previous = self.store.covered(conn).newest_secret(row["id"], name)
            version = 1 if previous is None else previous.version + 1
            digest = secret_digest(
                self.store.key,
                secret_id=secret_id,
                tenant_id=tenant_id,
                device_id=row["id"],
                name=name,
                value=value.encode(),
            )
            existing = conn.execute(
                select(secrets.c.id).where(
                    and_(secrets.c.device_id == row["id"], secrets.c.name == name)
                )
            ).one_or_none()
            if existing is not None:
                conn.execute(secrets.delete().where(secrets.c.id == existing.id))
            conn.execute(
                secrets.insert().values(
                    id=secret_id,
                    tenant_id=tenant_id,
                    device_id=row["id"],
                    name=name,
                    nonce=nonce,
                    ciphertext=ciphertext,
                    created_at=time.time(),
                )
            )
            self.store.audit(
                conn,
                tenant_id=tenant_id,
                actor=actor,
                action="secret.put",
                target=f"device:{device}/secret:{name}",
                detail={
                    "secret_id": secret_id,
                    "device_id": row["id"],
                    "name": name,
                    "version": version,
                    "digest": digest,
                },
            )
        return {"id": secret_id, "device": device, "name": name, "version": version}

    def secret_names(self, tenant_id: int, device: str) -> list[SecretName]:
        with self.store.db.read() as conn:
            row = self.store.device(conn, tenant_id, device)
            rows = conn.execute(
                select(secrets.c.id, secrets.c.name, secrets.c.created_at)
                .where(secrets.c.device_id == row["id"])
                .order_by(secrets.c.name)
            ).mappings()
            return [{"id": r["id"], "name": r["name"], "created_at": r["created_at"]} for r in rows]

    def device_secrets(self, tenant_id: int, device_id: int) -> DeviceSecrets:
        """Plaintext secrets of one device (the caller's own); the ones that fail to open,
        or that are not the newest audited version with the audited value, are named in
        `refused` and not served."""
        answer = self._device_secrets(tenant_id, device_id)
        if answer["refused"]:
            # A put committed between reading the rows and reading the log looks like a
            # rollback for a moment (PostgreSQL reads each statement's own snapshot): look
            # again once; a real rollback stays.
            answer = self._device_secrets(tenant_id, device_id)
        return answer

    def _device_secrets(self, tenant_id: int, device_id: int) -> DeviceSecrets:
        opened: dict[str, str] = {}
        refused: list[RefusedSecret] = []
        with self.store.db.read() as conn:
            box = self._box(conn, tenant_id)
            rows = list(
                conn.execute(
                    select(secrets).where(
                        and_(secrets.c.device_id == device_id, secrets.c.tenant_id == tenant_id)
                    )
                ).mappings()
            )
            facts = self.store.covered(conn)
            for row in rows:
                try:
                    value = box.open(row["id"], row["nonce"], row["ciphertext"])
                except SecretRefused as exc:
                    refused.append({"name": row["name"], "error": str(exc)})
                    continue
                problem = self._unaudited(facts, row, value)
                if problem is None:
                    opened[row["name"]] = value.decode()
                else:
                    refused.append({"name": row["name"], "error": problem})
        return {"secrets": opened, "refused": refused}

    def _unaudited(self, facts: CoverFacts, row: RowMapping, value: bytes) -> str | None:
        """Why the audit log does not vouch for serving this row's value; None if it does."""
        name = row["name"]
        verify = "; not served (run `trueup server audit verify`)"
        audited = facts.secret_ids.get(row["id"])
        newest = facts.newest_secret(row["device_id"], name)
        if audited is None or newest is None:
            return f"secret {name!r}: the stored version has no audit entry{verify}"
        if newest.secret_id != row["id"]:
            return (
                f"secret {name!r}: the stored row is version {audited[2].version} but the "
                f"audit log's newest is version {newest.version} (seq={newest.seq}): rolled "
                f"back behind the server's back{verify}"
            )
        broken = self.store.audit_break_after(newest.seq)
        if broken is not None:
            return (
                f"secret {name!r}: the audit log does not hold together at seq={broken}, after "
                f"this secret's newest audited version (seq={newest.seq}): a newer version may "
                f"have been removed from the log{verify}"
            )
        if newest.digest is not None:
            digest = secret_digest(
                self.store.key,
                secret_id=row["id"],
                tenant_id=row["tenant_id"],
                device_id=row["device_id"],
                name=name,
                value=value,
            )
            if digest != newest.digest:
                return f"secret {name!r}: its value differs from the audited digest{verify}"
        return None
