"""Tenant-bound secrets: sealed with the tenant's data key, opened only for their device.

A secret is sealed with AES-256-GCM under the tenant's data key with `tenant id
+ secret id` as associated data (keys.py), so a ciphertext copied into another
tenant's row or onto another secret fails to open and is named, not served.
Humans list names; only the device the secret belongs to receives values.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from sqlalchemy import Connection, and_, select

from trueup.server.keys import SecretBox, SecretRefused
from trueup.server.service.errors import check_name
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
    ) -> dict[str, Any]:
        """Store (or replace) a device's secret; each version gets a new secret id."""
        check_name("name", name)
        secret_id = uuid.uuid4().hex
        with self.store.write() as conn:
            row = self.store.device(conn, tenant_id, device)
            nonce, ciphertext = self._box(conn, tenant_id).seal(secret_id, value.encode())
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
                detail={"secret_id": secret_id, "device_id": row["id"], "name": name},
            )
        return {"id": secret_id, "device": device, "name": name}

    def secret_names(self, tenant_id: int, device: str) -> list[dict[str, Any]]:
        with self.store.db.read() as conn:
            row = self.store.device(conn, tenant_id, device)
            rows = conn.execute(
                select(secrets.c.id, secrets.c.name, secrets.c.created_at)
                .where(secrets.c.device_id == row["id"])
                .order_by(secrets.c.name)
            ).mappings()
            return [dict(r) for r in rows]

    def device_secrets(self, tenant_id: int, device_id: int) -> dict[str, Any]:
        """Plaintext secrets of one device (the caller's own); ones that fail to open are named."""
        opened: dict[str, str] = {}
        refused: list[dict[str, str]] = []
        with self.store.db.read() as conn:
            box = self._box(conn, tenant_id)
            rows = conn.execute(
                select(secrets).where(
                    and_(secrets.c.device_id == device_id, secrets.c.tenant_id == tenant_id)
                )
            ).mappings()
            for row in rows:
                try:
                    opened[row["name"]] = box.open(
                        row["id"], row["nonce"], row["ciphertext"]
                    ).decode()
                except SecretRefused as exc:
                    refused.append({"name": row["name"], "error": str(exc)})
        return {"secrets": opened, "refused": refused}
