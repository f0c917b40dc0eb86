"""Targets and rules: the part of notifications an admin manages (every change audited).

A target is a webhook: a name, an http(s) URL, a signing secret and optionally a
secret header (`auth_header`: a name and a value, for receivers that want a
token). The secret and the header's value are each sealed with the tenant's
data key under a secret id of their own (keys.py), exactly like device secrets;
neither is ever returned, except the signing secret once when the server
generated it. The URL must pass the target policy (policy.py) given the
tenant's allowlist, and carries no credentials. A rule sends the events its match selects to one target, and may
escalate (`escalate_after` seconds of a failed device).

Every write of a target audits its state after the write
(coverage.target_audit_detail: its id, the columns in coverage.TARGET_COLUMNS
as stored, and a keyed digest of its sealed secret), so `audit verify` names a
target changed in the table alone.
"""

from __future__ import annotations

import json
import re
import secrets as pysecrets
import time
import uuid

from sqlalchemy import Connection, RowMapping, and_, delete, select, update

from trueup.model.jsontypes import JSONObject
from trueup.model.reasons import ReasonCode
from trueup.server.coverage import target_audit_detail
from trueup.server.keys import SecretBox
from trueup.server.limits import HEADER_NAME_LENGTH, HEADER_VALUE_LENGTH, NAME_LENGTH, URL_LENGTH
from trueup.server.service.errors import Invalid, NotFound, check_name
from trueup.server.service.notify.allowlist import load_allowlist
from trueup.server.service.notify.audited import TARGET_AUDITED_FIELDS, audited
from trueup.server.service.notify.events import KINDS, SEVERITIES, Match, iso
from trueup.server.service.notify.policy import Allowlist, check_url, redact
from trueup.server.service.notify.records import RuleView, TargetRow, TargetView
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


_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an HTTP header name (RFC 9110)
# Headers the notifier sets itself, or that belong to the connection: not a secret header.
_OWN_HEADERS = {
    "host",
    "content-length",
    "content-type",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "te",
    "upgrade",
    "expect",
    "user-agent",
    "idempotency-key",
}


def _check_url(url: str, allowlist: Allowlist) -> None:
    if len(url) > URL_LENGTH:
        raise Invalid([f"url: longer than {URL_LENGTH} characters"])
    check_url(url, allowlist)


def _check_auth_header(header: tuple[str, str]) -> None:
    name, value = header
    problems = []
    lowered = name.lower()
    if len(name) > HEADER_NAME_LENGTH or not _TOKEN.fullmatch(name):
        problems.append(f"auth_header.name: {name[:100]!r} is not an HTTP header name")
    elif lowered in _OWN_HEADERS or lowered.startswith(("x-trueup-", "proxy-")):
        problems.append(f"auth_header.name: {name!r} is a header the server sets itself")
    if not 1 <= len(value) <= HEADER_VALUE_LENGTH or not re.fullmatch(r"[\x20-\x7e\t]+", value):
        problems.append(
            f"auth_header.value: 1-{HEADER_VALUE_LENGTH} printable ASCII characters "
            "(no line breaks)"
        )
    if problems:
        raise Invalid(problems)


def target_problem(url: str, allowlist: Allowlist) -> str | None:
    """Why deliveries to a stored URL are refused now (a row from before the policy, or
    an allowlist entry since removed), or None."""
    if redact(url) != url:
        return (
            "url: carries credentials, which are not sent: deliveries are refused; "
            "delete the target and add it again with an auth_header"
        )
    try:
        check_url(url, allowlist)
    except Invalid as exc:
        return exc.problems[0]
    return None


def _check_match(match: JSONObject) -> Match:
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


def _target_view(row: RowMapping, allowlist: Allowlist) -> TargetView:
    return {
        "name": row["name"],
        "url": redact(row["url"]),
        "auth_header": row["auth_header_name"],
        "problem": target_problem(row["url"], allowlist),
        "created_at": iso(row["created_at"]),
    }


class Routing:
    def __init__(self, store: Store) -> None:
        self.store = store

    def create_target(
        self,
        tenant_id: int,
        name: str,
        url: str,
        secret: str | None,
        actor: str,
        auth_header: tuple[str, str] | None = None,
    ) -> TargetView:
        """Add a webhook target. Without `secret` one is generated and returned, this once.
        `auth_header` (name, value) is sent with every delivery; its value is sealed."""
        check_name("name", name)
        if ".deleted-" in name:
            raise Invalid([f"name: {name!r}: '.deleted-' marks deleted targets; choose another"])
        if len(url) > URL_LENGTH:
            raise Invalid([f"url: longer than {URL_LENGTH} characters"])
        if auth_header is not None:
            _check_auth_header(auth_header)
        generated = secret is None
        value = secret if secret is not None else pysecrets.token_urlsafe(32)
        secret_id = uuid.uuid4().hex
        now = time.time()
        with self.store.write() as conn:
            _check_url(url, load_allowlist(conn, tenant_id))
            exists = conn.execute(
                select(notify_targets.c.id).where(
                    and_(notify_targets.c.tenant_id == tenant_id, notify_targets.c.name == name)
                )
            ).one_or_none()
            if exists is not None:
                raise Invalid([f"name: target {name!r} already exists; delete it first"])
            box = tenant_box(self.store, conn, tenant_id)
            nonce, ciphertext = box.seal(secret_id, value.encode())
            row: TargetRow = {
                "tenant_id": tenant_id,
                "name": name,
                "url": url,
                "secret_id": secret_id,
                "nonce": nonce,
                "ciphertext": ciphertext,
                "created_at": now,
            }
            if auth_header is not None:
                header_id = uuid.uuid4().hex
                header_nonce, header_ciphertext = box.seal(header_id, auth_header[1].encode())
                row["auth_header_name"] = auth_header[0]
                row["auth_header_secret_id"] = header_id
                row["auth_header_nonce"] = header_nonce
                row["auth_header_ciphertext"] = header_ciphertext
            target_id = inserted_id(conn.execute(notify_targets.insert().values(row)))
            self.store.audit(
                conn,
                tenant_id=tenant_id,
                actor=actor,
                action="notify.target.create",
                target=f"notify-target:{name}",
                detail={
                    **audited(row, TARGET_AUDITED_FIELDS),
                    "secret_generated": generated,
                    **target_audit_detail(conn, self.store.key, target_id),
                },
            )
        view: TargetView = {
            "name": name,
            "url": url,
            "auth_header": auth_header[0] if auth_header else None,
            "problem": None,
            "created_at": iso(now),
        }
        if generated:
            view["secret"] = value
        return view

    def targets(self, tenant_id: int) -> list[TargetView]:
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
            allowlist = load_allowlist(conn, tenant_id)
            return [_target_view(r, allowlist) for r in rows]

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
                detail={
                    "pending_discarded": int(discarded),
                    **target_audit_detail(conn, self.store.key, target_id),
                },
            )

    def create_rule(
        self,
        tenant_id: int,
        name: str,
        target: str,
        match: JSONObject,  # as the caller wrote it; _check_match checks it
        escalate_after: float | None,
        actor: str,
    ) -> RuleView:
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
            view: RuleView = {
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

    def rules(self, tenant_id: int) -> list[RuleView]:
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
