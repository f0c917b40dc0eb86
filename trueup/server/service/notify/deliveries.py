"""The delivery log: claiming due deliveries, recording attempts, the dead-letter list.

A delivery is `pending` until an attempt gets a 2xx answer (`delivered`), or
its attempts reach the limit (`dead`, the dead-letter list). Before sending, a
worker *claims* a delivery by setting `lease_until` with a compare-and-set;
another process skips it, and if the worker dies mid-flight the lease runs out
and the delivery is sent again (at least once; receivers deduplicate on the
event id). Between attempts the delay doubles from `base_delay` up to
`max_delay`, each scaled by a random factor in [0.5, 1] (jitter).
A dead (or discarded) delivery may be redelivered (its attempts start again);
a dead or pending one may be discarded (no more attempts); both are audited.

Nothing is sent to a target the audit log does not vouch for: before its sealed
signing secret and secret header are opened, the target's row is compared with
its audited state (url, name, sealed columns; no break in the chain after it),
and the tenant's allowlist with its audited entries. A row rewritten in the
database (a url pointed elsewhere, a deleted target brought back) would otherwise
hand the opened header value to whoever chose the new url; such a delivery goes
to the dead letters with the reason, and an allowlist the log does not vouch
for counts as empty.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, and_, or_, select, update

from trueup.server.keys import SecretRefused
from trueup.server.service.errors import Invalid, NotFound
from trueup.server.service.notify.events import iso
from trueup.server.service.notify.policy import Allowlist
from trueup.server.service.notify.records import (
    Attempt,
    DeliveryState,
    DeliveryUpdate,
    DeliveryView,
)
from trueup.server.service.notify.routing import tenant_box
from trueup.server.service.notify.vouch import audited_allowlist, unaudited_target
from trueup.server.service.store import Store
from trueup.server.tables import (
    devices,
    notify_attempts,
    notify_deliveries,
    notify_events,
    notify_rules,
    notify_targets,
)

__all__ = ["Claimed", "Deliveries", "TargetUnaudited", "backoff"]

_log = logging.getLogger(__name__)

STATES = tuple(state.value for state in DeliveryState)


class TargetUnaudited(Exception):
    """A target whose row the audit log does not vouch for; the message says why."""


def backoff(attempts: int, base: float, maximum: float, rand: float | None = None) -> float:
    """The delay after the `attempts`-th failure: base·2^(attempts-1), capped, with jitter."""
    factor = 0.5 + 0.5 * (random.random() if rand is None else rand)
    return float(min(maximum, base * 2.0 ** max(0, attempts - 1)) * factor)


@dataclass(frozen=True)
class Claimed:
    """A delivery this worker holds the lease on, with what it needs to send it."""

    id: int
    event_id: str
    kind: str
    attempt: int
    url: str
    secret: bytes
    body: bytes
    allowlist: Allowlist = field(default_factory=Allowlist)
    auth_header: tuple[str, str] | None = None  # (name, opened value); never logged


class Deliveries:
    def __init__(
        self,
        store: Store,
        *,
        base_delay: float = 5.0,
        max_delay: float = 600.0,
        max_attempts: int = 8,
        lease_seconds: float = 60.0,
    ) -> None:
        self.store = store
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.max_attempts = max_attempts
        self.lease_seconds = lease_seconds

    def claim(self, limit: int = 20, now: float | None = None) -> list[Claimed]:
        now = time.time() if now is None else now
        due = and_(
            notify_deliveries.c.state == "pending",
            notify_deliveries.c.next_attempt_at <= now,
            or_(notify_deliveries.c.lease_until.is_(None), notify_deliveries.c.lease_until < now),
        )
        with self.store.db.read() as conn:
            ids = list(
                conn.execute(
                    select(notify_deliveries.c.id)
                    .where(due)
                    .order_by(notify_deliveries.c.next_attempt_at, notify_deliveries.c.id)
                    .limit(limit)
                ).scalars()
            )
        if not ids:
            return []
        claimed: list[Claimed] = []
        with self.store.db.write() as conn:
            for delivery_id in ids:
                taken = conn.execute(
                    update(notify_deliveries)
                    .where(and_(notify_deliveries.c.id == delivery_id, due))
                    .values(lease_until=now + self.lease_seconds)
                )
                if taken.rowcount != 1:
                    continue  # another process took it
                try:
                    claimed.append(self._load(conn, delivery_id))
                except (SecretRefused, TargetUnaudited) as exc:  # straight to the dead letters
                    conn.execute(
                        update(notify_deliveries)
                        .where(notify_deliveries.c.id == delivery_id)
                        .values(
                            state="dead", lease_until=None, last_error=str(exc), finished_at=now
                        )
                    )
        return claimed

    def _load(self, conn: Connection, delivery_id: int) -> Claimed:
        row = (
            conn.execute(
                select(
                    notify_deliveries.c.id,
                    notify_deliveries.c.tenant_id,
                    notify_deliveries.c.attempts,
                    notify_deliveries.c.target_id,
                    notify_events.c.id.label("event_id"),
                    notify_events.c.kind,
                    notify_events.c.payload,
                    notify_targets.c.url,
                    notify_targets.c.secret_id,
                    notify_targets.c.nonce,
                    notify_targets.c.ciphertext,
                    notify_targets.c.auth_header_name,
                    notify_targets.c.auth_header_secret_id,
                    notify_targets.c.auth_header_nonce,
                    notify_targets.c.auth_header_ciphertext,
                )
                .join(notify_events, notify_events.c.id == notify_deliveries.c.event_id)
                .join(notify_targets, notify_targets.c.id == notify_deliveries.c.target_id)
                .where(notify_deliveries.c.id == delivery_id)
            )
            .mappings()
            .one()
        )
        tenant_id = int(row["tenant_id"])
        facts = self.store.covered(conn)
        target = (
            conn.execute(select(notify_targets).where(notify_targets.c.id == row["target_id"]))
            .mappings()
            .one()
        )
        problem = unaudited_target(self.store, facts, target)
        if problem is not None:
            raise TargetUnaudited(problem)
        box = tenant_box(self.store, conn, tenant_id)
        secret = box.open(row["secret_id"], row["nonce"], row["ciphertext"])
        auth_header = None
        if row["auth_header_name"] is not None:
            value = box.open(
                row["auth_header_secret_id"],
                row["auth_header_nonce"],
                row["auth_header_ciphertext"],
            )
            auth_header = (str(row["auth_header_name"]), value.decode())
        return Claimed(
            id=int(row["id"]),
            event_id=row["event_id"],
            kind=row["kind"],
            attempt=int(row["attempts"]) + 1,
            url=row["url"],
            secret=secret,
            body=row["payload"].encode(),
            allowlist=audited_allowlist(self.store, conn, facts, tenant_id),
            auth_header=auth_header,
        )

    def record(
        self,
        delivery_id: int,
        *,
        ok: bool,
        status_code: int | None,
        latency_ms: float,
        error: str | None,
        now: float | None = None,
        final: bool = False,
    ) -> str:
        """Log one attempt and move the delivery on; its new state. `final`: no retry
        helps (the target policy refused it), so a failure is dead at once."""
        now = time.time() if now is None else now
        with self.store.db.write() as conn:
            row = (
                conn.execute(select(notify_deliveries).where(notify_deliveries.c.id == delivery_id))
                .mappings()
                .one()
            )
            conn.execute(
                notify_attempts.insert().values(
                    delivery_id=delivery_id,
                    at=now,
                    status_code=status_code,
                    latency_ms=latency_ms,
                    error=error,
                )
            )
            attempts = int(row["attempts"]) + 1
            values: DeliveryUpdate = {
                "attempts": attempts,
                "lease_until": None,
                "last_error": error,
            }
            if ok:
                values.update({"state": "delivered", "finished_at": now})
            elif final or attempts >= self.max_attempts:
                values.update({"state": "dead", "finished_at": now})
            else:
                values["next_attempt_at"] = now + backoff(attempts, self.base_delay, self.max_delay)
            if row["state"] != "pending":
                return str(row["state"])  # discarded while it was being sent: it stays so
            conn.execute(
                update(notify_deliveries)
                .where(notify_deliveries.c.id == delivery_id)
                .values(values)
            )
            return str(values.get("state", "pending"))

    # -- the API's views ------------------------------------------------------------------

    def deliveries(
        self, tenant_id: int, *, state: str | None = None, limit: int = 100
    ) -> list[DeliveryView]:
        """The tenant's newest deliveries (optionally in one state), each with its attempts."""
        if state is not None and state not in STATES:
            raise Invalid([f"state: {state!r} is not one of {', '.join(STATES)}"])
        query = (
            select(
                notify_deliveries,
                notify_events.c.kind,
                notify_events.c.severity,
                notify_events.c.at.label("event_at"),
                devices.c.name.label("device"),
                notify_targets.c.name.label("target"),
                notify_rules.c.name.label("rule"),
            )
            .join(notify_events, notify_events.c.id == notify_deliveries.c.event_id)
            .join(devices, devices.c.id == notify_events.c.device_id)
            .join(notify_targets, notify_targets.c.id == notify_deliveries.c.target_id)
            .outerjoin(notify_rules, notify_rules.c.id == notify_deliveries.c.rule_id)
            .where(notify_deliveries.c.tenant_id == tenant_id)
            .order_by(notify_deliveries.c.id.desc())
            .limit(limit)
        )
        if state is not None:
            query = query.where(notify_deliveries.c.state == state)
        with self.store.db.read() as conn:
            rows = [dict(r) for r in conn.execute(query).mappings()]
            ids = [r["id"] for r in rows]
            attempts: dict[int, list[Attempt]] = {i: [] for i in ids}
            if ids:
                for a in conn.execute(
                    select(notify_attempts)
                    .where(notify_attempts.c.delivery_id.in_(ids))
                    .order_by(notify_attempts.c.id)
                ).mappings():
                    attempts[a["delivery_id"]].append(
                        {
                            "at": iso(a["at"]),
                            "status_code": a["status_code"],
                            "latency_ms": round(float(a["latency_ms"]), 1),
                            "error": a["error"],
                        }
                    )
        return [
            {
                "id": r["id"],
                "event_id": r["event_id"],
                "kind": r["kind"],
                "severity": r["severity"],
                "device": r["device"],
                "target": r["target"],
                "rule": r["rule"],
                "state": r["state"],
                "attempts": r["attempts"],
                "next_attempt_at": iso(r["next_attempt_at"]) if r["state"] == "pending" else None,
                "last_error": r["last_error"],
                "created_at": iso(r["created_at"]),
                "finished_at": iso(r["finished_at"]),
                "log": attempts[r["id"]],
            }
            for r in rows
        ]

    def _undelivered(
        self, conn: Connection, tenant_id: int, delivery_id: int, states: tuple[str, ...]
    ) -> Any:
        row = (
            conn.execute(
                select(notify_deliveries).where(
                    and_(
                        notify_deliveries.c.id == delivery_id,
                        notify_deliveries.c.tenant_id == tenant_id,
                    )
                )
            )
            .mappings()
            .one_or_none()
        )
        if row is None:
            raise NotFound(f"delivery {delivery_id} not found")
        if row["state"] not in states:
            raise Invalid(
                [f"delivery {delivery_id} is {row['state']}; this needs one {' or '.join(states)}"]
            )
        return row

    def redeliver(self, tenant_id: int, delivery_id: int, actor: str) -> None:
        """Send a dead (or discarded) delivery again, with fresh attempts (same event id)."""
        with self.store.write() as conn:
            row = self._undelivered(conn, tenant_id, delivery_id, ("dead", "discarded"))
            conn.execute(
                update(notify_deliveries)
                .where(notify_deliveries.c.id == delivery_id)
                .values(
                    state="pending",
                    attempts=0,
                    next_attempt_at=time.time(),
                    lease_until=None,
                    finished_at=None,
                )
            )
            self.store.audit(
                conn,
                tenant_id=tenant_id,
                actor=actor,
                action="notify.delivery.redeliver",
                target=f"notify-delivery:{delivery_id}",
                detail={"event_id": row["event_id"], "attempts": row["attempts"]},
            )

    def discard(self, tenant_id: int, delivery_id: int, actor: str) -> None:
        """Stop trying: a dead letter, or a pending delivery, becomes `discarded`."""
        with self.store.write() as conn:
            row = self._undelivered(conn, tenant_id, delivery_id, ("dead", "pending"))
            conn.execute(
                update(notify_deliveries)
                .where(notify_deliveries.c.id == delivery_id)
                .values(state="discarded", finished_at=time.time())
            )
            self.store.audit(
                conn,
                tenant_id=tenant_id,
                actor=actor,
                action="notify.delivery.discard",
                target=f"notify-delivery:{delivery_id}",
                detail={"event_id": row["event_id"], "attempts": row["attempts"]},
            )
