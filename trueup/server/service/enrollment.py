"""Devices and their credentials: create a device, issue a one-time enrollment
bundle, and exchange its token for the device credential.

A device can be given labels when it is created or enrolled (merged into the
labels it has; audited as `device.labels` in the same transaction).

Enrolling again revokes the device's current credential and any unused bundle
in the same transaction; the exchange is a compare-and-set on the enrollment
token, so a bundle is used at most once however many agents race with it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy import Connection, and_, select, update
from sqlalchemy.exc import IntegrityError

from trueup.server.service.errors import Invalid, NotFound, Unauthorized, device_name_problems
from trueup.server.service.labelrows import checked_labels, labels_of, replace_labels
from trueup.server.service.records import DeviceCredential, EnrollmentBundle
from trueup.server.service.store import Store, inserted_id
from trueup.server.tables import devices, tenants, tokens
from trueup.server.tokens import TokenKind, hash_token, new_token, tokens_equal

__all__ = ["ENROLLMENT_LIFETIME", "Enrollment"]

ENROLLMENT_LIFETIME = 24 * 3600.0


class Enrollment:
    def __init__(self, store: Store, credentials_changed: Callable[[], None]) -> None:
        self.store = store
        self._credentials_changed = credentials_changed

    def device_id(self, tenant_id: int, device: str) -> int:
        with self.store.db.read() as conn:
            return int(self.store.device(conn, tenant_id, device)["id"])

    def _create_device(self, conn: Connection, tenant_id: int, name: str, actor: str) -> int:
        device_id = inserted_id(
            conn.execute(
                devices.insert().values(tenant_id=tenant_id, name=name, created_at=time.time())
            )
        )
        self.store.audit(
            conn,
            tenant_id=tenant_id,
            actor=actor,
            action="device.create",
            target=f"device:{name}",
            detail={"device_id": device_id},
        )
        return device_id

    def _label(
        self,
        conn: Connection,
        tenant_id: int,
        device_id: int,
        device: str,
        labels: Mapping[str, str] | None,
        actor: str,
    ) -> None:
        """Merge `labels` (already checked) into the device's, audited; nothing when None."""
        if labels:
            merged = {**labels_of(conn, device_id), **labels}
            replace_labels(
                conn,
                self.store,
                tenant_id=tenant_id,
                device_id=device_id,
                device=device,
                labels=merged,
                actor=actor,
            )

    def create_device(
        self, tenant_id: int, name: str, actor: str, *, labels: Mapping[str, Any] | None = None
    ) -> int:
        problems = device_name_problems(name)
        if problems:
            raise Invalid(problems)
        checked = checked_labels(labels) if labels is not None else None
        try:
            with self.store.write() as conn:
                device_id = self._create_device(conn, tenant_id, name, actor)
                self._label(conn, tenant_id, device_id, name, checked, actor)
                return device_id
        except IntegrityError:
            raise Invalid([f"name: device {name!r} already exists"]) from None

    def _revoke_device_tokens(
        self, conn: Connection, device_id: int, kinds: list[str], now: float
    ) -> list[int]:
        """Revoke the device's live tokens of these kinds; their ids (recorded in the audit)."""
        ids = [
            int(r.id)
            for r in conn.execute(
                select(tokens.c.id).where(
                    and_(
                        tokens.c.device_id == device_id,
                        tokens.c.revoked_at.is_(None),
                        tokens.c.kind.in_(kinds),
                    )
                )
            )
        ]
        if ids:
            conn.execute(update(tokens).where(tokens.c.id.in_(ids)).values(revoked_at=now))
        return ids

    def enroll(
        self,
        tenant_id: int,
        device: str,
        actor: str,
        *,
        url: str,
        fingerprint: str | None = None,
        create_missing: bool = True,
        labels: Mapping[str, Any] | None = None,
    ) -> EnrollmentBundle:
        """A one-time enrollment bundle. Revokes the device's current credential. `labels`
        are merged into the device's (checked first: Invalid changes nothing)."""
        problems = device_name_problems(device)
        if problems:
            raise Invalid(problems)
        checked = checked_labels(labels) if labels is not None else None
        token = new_token(TokenKind.ENROLLMENT)
        now = time.time()
        with self.store.write() as conn:
            existing = conn.execute(
                select(devices.c.id).where(
                    and_(devices.c.tenant_id == tenant_id, devices.c.name == device)
                )
            ).one_or_none()
            if existing is None and not create_missing:
                raise NotFound(f"device {device!r} not found")
            device_id = (
                int(existing.id)
                if existing is not None
                else self._create_device(conn, tenant_id, device, actor)
            )
            self._label(conn, tenant_id, device_id, device, checked, actor)
            revoked = self._revoke_device_tokens(
                conn, device_id, [TokenKind.DEVICE.value, TokenKind.ENROLLMENT.value], now
            )
            token_hash = hash_token(token)
            token_id = self.store.insert_token(
                conn,
                tenant_id=tenant_id,
                kind=TokenKind.ENROLLMENT.value,
                device_id=device_id,
                token_hash=token_hash,
                label="enrollment",
                created_at=now,
                expires_at=now + ENROLLMENT_LIFETIME,
            )
            tenant = conn.execute(
                select(tenants.c.name).where(tenants.c.id == tenant_id)
            ).scalar_one()
            self.store.audit(
                conn,
                tenant_id=tenant_id,
                actor=actor,
                action="device.enroll",
                target=f"device:{device}",
                detail={
                    "token_id": token_id,
                    "kind": TokenKind.ENROLLMENT.value,
                    "device_id": device_id,
                    "token_hash": token_hash,
                    "revoked_credentials": len(revoked),
                    "revoked_token_ids": revoked,
                },
            )
        self._credentials_changed()
        bundle: EnrollmentBundle = {
            "kind": "trueup-enrollment",
            "control_plane": url,
            "tenant": tenant,
            "device": device,
            "token": token,
            "expires_at": now + ENROLLMENT_LIFETIME,
        }
        if fingerprint:
            bundle["server_certificate_sha256"] = fingerprint
        return bundle

    def exchange_enrollment(self, token: str) -> DeviceCredential:
        """Trade a one-time enrollment token for a device credential."""
        now = time.time()
        credential = new_token(TokenKind.DEVICE)
        self.store.ensure_sealed()
        with self.store.write() as conn:
            row = (
                conn.execute(
                    select(
                        tokens.c.id,
                        tokens.c.tenant_id,
                        tokens.c.kind,
                        tokens.c.user_id,
                        tokens.c.device_id,
                        tokens.c.token_hash,
                        tokens.c.expires_at,
                        tokens.c.seal,
                        devices.c.name.label("device"),
                        tenants.c.name.label("tenant"),
                    )
                    .join(devices, devices.c.id == tokens.c.device_id)
                    .join(tenants, tenants.c.id == tokens.c.tenant_id)
                    .where(
                        and_(
                            tokens.c.token_hash == hash_token(token),
                            tokens.c.kind == TokenKind.ENROLLMENT.value,
                        )
                    )
                )
                .mappings()
                .one_or_none()
            )
            if row is None or not tokens_equal(row["token_hash"], token):
                raise Unauthorized("unknown enrollment token")
            if not self.store.token_seal_ok(row):
                raise Unauthorized(
                    "enrollment token refused: its row was changed behind the server's back"
                )
            refusal = self.store.credential_refusal(conn, row["id"])
            if refusal is not None:
                raise Unauthorized(
                    f"enrollment token already used, revoked or expired ({refusal}); "
                    "run `trueup server device enroll` again"
                )
            rewound = self.store.anchor_problems(conn)
            if rewound:
                raise Unauthorized(
                    "enrollment refused: the audit chain contradicts its checkpoint "
                    f"({rewound[0]}); run `trueup server audit verify`"
                )
            used = conn.execute(
                update(tokens)
                .where(
                    and_(
                        tokens.c.id == row["id"],
                        tokens.c.used_at.is_(None),
                        tokens.c.revoked_at.is_(None),
                        tokens.c.expires_at > now,
                    )
                )
                .values(used_at=now, revoked_at=now)
            ).rowcount
            if used != 1:
                raise Unauthorized(
                    "enrollment token already used, revoked or expired; "
                    "run `trueup server device enroll` again"
                )
            revoked = self._revoke_device_tokens(
                conn, row["device_id"], [TokenKind.DEVICE.value], now
            )
            credential_hash = hash_token(credential)
            credential_id = self.store.insert_token(
                conn,
                tenant_id=row["tenant_id"],
                kind=TokenKind.DEVICE.value,
                device_id=row["device_id"],
                token_hash=credential_hash,
                label="device credential",
                created_at=now,
            )
            self.store.audit(
                conn,
                tenant_id=row["tenant_id"],
                actor=f"device:{row['tenant']}/{row['device']}",
                action="device.credential",
                target=f"device:{row['device']}",
                detail={
                    "token_id": credential_id,
                    "enrollment_token_id": row["id"],
                    "kind": TokenKind.DEVICE.value,
                    "device_id": row["device_id"],
                    "token_hash": credential_hash,
                    "revoked_token_ids": revoked,
                },
            )
        self._credentials_changed()
        return {"tenant": row["tenant"], "device": row["device"], "credential": credential}
