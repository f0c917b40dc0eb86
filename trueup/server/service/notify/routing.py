"""Targets and rules: the part of notifications an admin manages (every change audited).

A target is a webhook: a name, an http(s) URL and a signing secret. The secret
is sealed with the tenant's data key under a secret id of its own (keys.py),
exactly like device secrets; it is never returned, except once when the server
generated it. A rule sends the events its match selects to one target, and may
escalate (`escalate_after` seconds of a failed device).
"""

from __future__ import annotations

import json
import secrets as pysecrets
import time
import uuid
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import Connection, and_, delete, select, update

from trueup.model.reasons import ReasonCode
from trueup.server.keys import SecretBox
from trueup.server.limits import NAME_LENGTH, URL_LENGTH
from trueup.server.service.errors import Invalid, NotFound, check_name
from trueup.server.service.notify.events import KINDS, SEVERITIES, Match, iso
from trueup.server.service.store import Store, inserted_id
from trueup.server.tables import (
    notify_deliveries,
    notify_escalations,
    notify_rules,
    notify_targets,
)
from trueup.server.tables import tenants as tenants_table

__all__ = ["Routing", "tenant_box"]


def tenant_box(store: Store, conn: Connection, tenant_id: int) -> SecretBox:
    wrapped = conn.execute(
        select(tenants_table.c.data_key_wrapped).where(tenants_table.c.id == tenant_id)
    ).scalar_one()
    return SecretBox(tenant_id, store.key.unwrap_tenant_key(tenant_id, wrapped))


def _check_url(url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or len(url) > URL_LENGTH:
        raise Invalid([f"url: {url[:200]!r} is not an http:// or https:// URL with a host"])


def _check_match(match: dict[str, Any]) -> Match:
    problems = []
    parsed = Match.from_json(match)
    for kind in parsed.kinds:
        if kind not in KINDS:
            problems.append(f"match.kinds: {kind!r} is not one of {', '.join(KINDS)}")
    codes = {c.value for c in ReasonCode}
    for code in parsed.reason_codes:
        if code not in codes:
            problems.append(
                f"match.reason_codes: {code!r} is not one of {', '.join(sorted(codes))}"
            )
    if parsed.min_severity not in SEVERITIES:
        problems.append(
            f"match.min_severity: {parsed.min_severity!r} is not one of {', '.join(SEVERITIES)}"
        )
    if problems:
        raise Invalid(problems)
    return parsed


def _target_view(row: Any) -> dict[str, Any]:
    return {"name": row["name"], "url": row["url"], "created_at": iso(row["created_at"])}


class Routing:
    def __init__(self, store: Store) -> None:
        self.store = store

    def create_target(
        self, tenant_id: int, name: str, url: str, secret: str | None, actor: str
    ) -> dict[str, Any]:
        """Add a webhook target. Without `secret` one is generated and returned, this once."""
        check_name("name", name)
        if ".deleted-" in name:
            raise Invalid([f"name: {name!r}: '.deleted-' marks deleted targets; choose another"])
        _check_url(url)
        generated = secret is None
        value = secret if secret is not None else pysecrets.token_urlsafe(32)
        secret_id = uuid.uuid4().hex
        now = time.time()
        with self.store.write() as conn:
            exists = conn.execute(
                select(notify_targets.c.id).where(
                    and_(notify_targets.c.tenant_id == tenant_id, notify_targets.c.name == name)
                )
            ).one_or_none()
            if exists is not None:
                raise Invalid([f"name: target {name!r} already exists; delete it first"])
            nonce, ciphertext = tenant_box(self.store, conn, tenant_id).seal(
                secret_id, value.encode()
            )
            conn.execute(
                notify_targets.insert().values(
                    tenant_id=tenant_id,
                    name=name,
                    url=url,
                    secret_id=secret_id,
                    nonce=nonce,
                    ciphertext=ciphertext,
                    created_at=now,
                )
            )
            self.store.audit(
                conn,
                tenant_id=tenant_id,
                actor=actor,
                action="notify.target.create",
                target=f"notify-target:{name}",
                detail={"url": url, "secret_generated": generated},
            )
        view: dict[str, Any] = {"name": name, "url": url, "created_at": iso(now)}
        if generated:
            view["secret"] = value
        return view

    def targets(self, tenant_id: int) -> list[dict[str, Any]]:
        with self.store.db.read() as conn:
            rows = conn.execute(
                select(notify_targets)
                .where(
                    and_(
                        notify_targets.c.tenant_id == tenant_id,
                        notify_targets.c.deleted_at.is_(None),
                    )
                )
                .order_by(notify_targets.c.name)
            ).mappings()
            return [_target_view(r) for r in rows]

    def _target_id(self, conn: Connection, tenant_id: int, name: str) -> int:
        row = conn.execute(
            select(notify_targets.c.id).where(
                and_(
                    notify_targets.c.tenant_id == tenant_id,
                    notify_targets.c.name == name,
                    notify_targets.c.deleted_at.is_(None),
                )
            )
        ).one_or_none()
        if row is None:
            raise NotFound(f"notification target {name!r} not found")
        return int(row.id)

    def delete_target(self, tenant_id: int, name: str, actor: str) -> None:
        """Delete a target no rule uses. Its delivery log is kept: the row stays, renamed
        `NAME.deleted-ID` (the name is free again), and its pending deliveries are discarded."""
        now = time.time()
        with self.store.write() as conn:
            target_id = self._target_id(conn, tenant_id, name)
            used = conn.execute(
                select(notify_rules.c.name).where(notify_rules.c.target_id == target_id)
            ).scalars()
            rules = sorted(used)
            if rules:
                raise Invalid([f"name: target {name!r} is used by rules {', '.join(rules)}"])
            suffix = f".deleted-{target_id}"
            discarded = conn.execute(
                update(notify_deliveries)
                .where(
                    and_(
                        notify_deliveries.c.target_id == target_id,
                        notify_deliveries.c.state == "pending",
                    )
                )
                .values(state="discarded", finished_at=now, last_error="target deleted")
            ).rowcount
            conn.execute(
                update(notify_targets)
                .where(notify_targets.c.id == target_id)
                .values(name=name[: NAME_LENGTH - len(suffix)] + suffix, deleted_at=now)
            )
            self.store.audit(
                conn,
                tenant_id=tenant_id,
                actor=actor,
                action="notify.target.delete",
                target=f"notify-target:{name}",
                detail={"pending_discarded": int(discarded)},
            )

    def create_rule(
        self,
        tenant_id: int,
        name: str,
        target: str,
        match: dict[str, Any],
        escalate_after: float | None,
        actor: str,
    ) -> dict[str, Any]:
        check_name("name", name)
        parsed = _check_match(match)
        if escalate_after is not None and escalate_after <= 0:
            raise Invalid(["escalate_after: must be a positive number of seconds"])
        now = time.time()
        with self.store.write() as conn:
            target_id = self._target_id(conn, tenant_id, target)
            exists = conn.execute(
                select(notify_rules.c.id).where(
                    and_(notify_rules.c.tenant_id == tenant_id, notify_rules.c.name == name)
                )
            ).one_or_none()
            if exists is not None:
                raise Invalid([f"name: rule {name!r} already exists; delete it first"])
            inserted_id(
                conn.execute(
                    notify_rules.insert().values(
                        tenant_id=tenant_id,
                        name=name,
                        target_id=target_id,
                        match=json.dumps(parsed.to_json(), sort_keys=True),
                        escalate_after=escalate_after,
                        created_at=now,
                    )
                )
            )
            view = {
                "name": name,
                "target": target,
                "match": parsed.to_json(),
                "escalate_after": escalate_after,
                "created_at": iso(now),
            }
            self.store.audit(
                conn,
                tenant_id=tenant_id,
                actor=actor,
                action="notify.rule.create",
                target=f"notify-rule:{name}",
                detail=view,
            )
        return view

    def rules(self, tenant_id: int) -> list[dict[str, Any]]:
        with self.store.db.read() as conn:
            rows = conn.execute(
                select(notify_rules, notify_targets.c.name.label("target_name"))
                .join(notify_targets, notify_targets.c.id == notify_rules.c.target_id)
                .where(notify_rules.c.tenant_id == tenant_id)
                .order_by(notify_rules.c.name)
            ).mappings()
            return [
                {
                    "name": r["name"],
                    "target": r["target_name"],
                    "match": json.loads(r["match"]),
                    "escalate_after": r["escalate_after"],
                    "created_at": iso(r["created_at"]),
                }
                for r in rows
            ]

    def delete_rule(self, tenant_id: int, name: str, actor: str) -> None:
        with self.store.write() as conn:
            row = conn.execute(
                select(notify_rules.c.id).where(
                    and_(notify_rules.c.tenant_id == tenant_id, notify_rules.c.name == name)
                )
            ).one_or_none()
            if row is None:
                raise NotFound(f"notification rule {name!r} not found")
            conn.execute(delete(notify_escalations).where(notify_escalations.c.rule_id == row.id))
            conn.execute(delete(notify_rules).where(notify_rules.c.id == row.id))
            self.store.audit(
                conn,
                tenant_id=tenant_id,
                actor=actor,
                action="notify.rule.delete",
                target=f"notify-rule:{name}",
            )
