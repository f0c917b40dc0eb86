"""From device state to events and deliveries: transitions, heartbeat staleness, escalation.

`observe()` takes one agent report as ingest committed it; `scan()` looks at
every device periodically (reports the notifier missed, heartbeat staleness,
escalation thresholds). Both compare the device's new conditions with the ones
stored in `notify_devices` inside one write transaction (the row locked on
PostgreSQL), so each transition is turned into events exactly once, however
many server processes share the database. A report older than the one the
stored conditions came from is ignored.

Each event is stored once (`notify_events`, a UUID that receivers deduplicate
on) with one delivery per matching target (`notify_deliveries`, unique per
event and target); an event no rule matches is not stored.
"""

from __future__ import annotations

import json
import time

from sqlalchemy import Connection, and_, bindparam, delete, select, update

from trueup.model.jsontypes import JSONObject
from trueup.server.service.notify.emit import Device, device_of, emit
from trueup.server.service.notify.events import (
    FAILED,
    Match,
    conditions_of,
    iso,
    keep_pending_gateways,
)
from trueup.server.service.notify.records import EventDetail, QuietReport
from trueup.server.service.store import Store
from trueup.server.tables import (
    device_state,
    devices,
    notify_devices,
    notify_escalations,
    notify_rules,
)

__all__ = ["MISSED_AFTER", "Engine"]

MISSED_AFTER = 30.0


class Engine:
    def __init__(self, store: Store, *, stale_intervals: int = 3) -> None:
        self.store = store
        self.stale_intervals = stale_intervals

    # -- transitions ----------------------------------------------------------------------

    def observe(self, device_id: int, report: JSONObject, report_at: float) -> None:
        """One committed report (ingest's order): events for the conditions it opens/closes."""
        self.observe_batch([(device_id, report, report_at)])

    def observe_batch(self, items: list[tuple[int, JSONObject, float]]) -> None:
        """Committed reports in ingest's order, in one transaction (one commit per batch).

        A device whose reports change none of its conditions (the heartbeat case) only
        has its report time moved, in one statement for the whole batch."""
        by_device: dict[int, list[tuple[JSONObject, float]]] = {}
        for device_id, report, report_at in items:
            by_device.setdefault(device_id, []).append((report, report_at))
        now = time.time()
        with self.store.write() as conn:
            stored = {
                int(row.device_id): row
                for row in conn.execute(
                    select(notify_devices)
                    .where(notify_devices.c.device_id.in_(sorted(by_device)))
                    .with_for_update()
                )
            }
            quiet: list[QuietReport] = []
            for device_id in sorted(by_device):  # one lock order for every process
                row, reports = stored.get(device_id), by_device[device_id]
                if row is not None and all(
                    conditions_of(report) == json.loads(row.conditions) for report, _ in reports
                ):
                    latest = max(at for _, at in reports)
                    if row.report_at is None or latest > row.report_at:
                        quiet.append({"b_device": device_id, "b_at": latest})
                    continue
                for report, report_at in reports:
                    self._transition(conn, device_id, now, report=report, report_at=report_at)
            if quiet:
                conn.execute(
                    update(notify_devices)
                    .where(notify_devices.c.device_id == bindparam("b_device"))
                    .values(report_at=bindparam("b_at")),
                    quiet,
                )

    def _transition(
        self,
        conn: Connection,
        device_id: int,
        now: float,
        *,
        report: JSONObject | None = None,  # as the agent sent it
        report_at: float | None = None,
        stale: bool | None = None,
    ) -> None:
        row = (
            conn.execute(
                select(notify_devices)
                .where(notify_devices.c.device_id == device_id)
                .with_for_update()
            )
            .mappings()
            .one_or_none()
        )
        before: dict[str, list[str]] = json.loads(row["conditions"]) if row else {}
        after = dict(before)
        seen_at = row["report_at"] if row else None
        codes = sorted({c for c in (report or {}).get("reason_codes") or []})
        if report is not None and report_at is not None:
            if seen_at is not None and report_at <= seen_at:
                report = None  # an older report than the one already judged
            else:
                # A report arrived: the heartbeat is not stale.
                after = keep_pending_gateways(before, conditions_of(report), report)
                seen_at = report_at
        if stale is True:
            after["heartbeat_stale"] = []
        elif stale is False:
            after.pop("heartbeat_stale", None)
        if row is not None and after == before and seen_at == row["report_at"]:
            return
        device = device_of(conn, device_id)
        if device is None:
            return
        failed_since = row["failed_since"] if row else None
        failed = sorted(set(after) & FAILED)
        if failed and failed_since is None:
            failed_since = now
        elif not failed:
            failed_since = None
        common: EventDetail = {"conditions": sorted(after), "failed_since": iso(failed_since)}
        for kind in sorted(set(after) - set(before)):
            emit(conn, device, kind, now, {**common, "subsystems": after[kind]}, codes)
        for kind in sorted(set(before) - set(after)):
            emit(
                conn,
                device,
                "healed",
                now,
                {**common, "condition": kind, "subsystems": before[kind]},
                codes,
            )
        values = {
            "conditions": json.dumps(after, sort_keys=True),
            "failed_since": failed_since,
            "report_at": seen_at,
        }
        if row is None:
            conn.execute(notify_devices.insert().values(device_id=device_id, **values))
        else:
            conn.execute(
                update(notify_devices).where(notify_devices.c.device_id == device_id).values(values)
            )
        if failed_since is None:
            self._resolve_escalations(conn, device, now, codes)

    def _resolve_escalations(
        self, conn: Connection, device: Device, now: float, codes: list[str]
    ) -> None:
        fired = conn.execute(
            select(notify_escalations).where(notify_escalations.c.device_id == device.id)
        ).mappings()
        for esc in list(fired):
            emit(
                conn,
                device,
                "escalation_resolved",
                now,
                {
                    "failed_since": iso(esc["failed_since"]),
                    "escalated_at": iso(esc["fired_at"]),
                    "rule": self._rule_name(conn, int(esc["rule_id"])),
                    "conditions": [],
                },
                codes,
                rule_id=int(esc["rule_id"]),
            )
            conn.execute(
                delete(notify_escalations).where(
                    and_(
                        notify_escalations.c.rule_id == esc["rule_id"],
                        notify_escalations.c.device_id == device.id,
                    )
                )
            )

    @staticmethod
    def _rule_name(conn: Connection, rule_id: int) -> str:
        return str(
            conn.execute(select(notify_rules.c.name).where(notify_rules.c.id == rule_id)).scalar()
        )

    # -- the periodic scan ----------------------------------------------------------------

    def scan(self, now: float | None = None) -> None:
        """Missed reports, heartbeat staleness and escalation thresholds, for every device."""
        now = time.time() if now is None else now
        with self.store.db.read() as conn:
            rows = list(
                conn.execute(
                    select(
                        device_state.c.device_id,
                        device_state.c.last_report_at,
                        device_state.c.heartbeat_interval,
                        notify_devices.c.conditions,
                        notify_devices.c.report_at,
                    ).outerjoin(
                        notify_devices, notify_devices.c.device_id == device_state.c.device_id
                    )
                )
            )
        for row in rows:
            stale = now - row.last_report_at > self.stale_intervals * row.heartbeat_interval
            was_stale = row.conditions is not None and "heartbeat_stale" in json.loads(
                row.conditions
            )
            # A report the notifier has not judged MISSED_AFTER seconds after it arrived
            # (a crash, another process that died): the scan judges the latest one. A
            # younger one is left to the notifier's queue, which sees every state.
            missed = (
                row.report_at is None or row.report_at < row.last_report_at
            ) and row.last_report_at < now - MISSED_AFTER
            if not missed and stale == was_stale:
                continue
            with self.store.write() as conn:
                report = None
                if missed:
                    text = conn.execute(
                        select(device_state.c.report).where(
                            device_state.c.device_id == row.device_id
                        )
                    ).scalar()
                    report = json.loads(text) if text else {}
                self._transition(
                    conn,
                    int(row.device_id),
                    now,
                    report=report,
                    report_at=row.last_report_at,
                    stale=stale,
                )
        self._escalate(now)

    def _escalate(self, now: float) -> None:
        with self.store.db.read() as conn:
            due = list(
                conn.execute(
                    select(
                        notify_rules.c.id.label("rule_id"),
                        notify_rules.c.match,
                        notify_devices.c.device_id,
                        devices.c.name,
                    )
                    .join(devices, devices.c.tenant_id == notify_rules.c.tenant_id)
                    .join(notify_devices, notify_devices.c.device_id == devices.c.id)
                    .outerjoin(
                        notify_escalations,
                        and_(
                            notify_escalations.c.rule_id == notify_rules.c.id,
                            notify_escalations.c.device_id == devices.c.id,
                        ),
                    )
                    .where(
                        notify_rules.c.escalate_after.is_not(None),
                        notify_devices.c.failed_since.is_not(None),
                        notify_devices.c.failed_since + notify_rules.c.escalate_after <= now,
                        notify_escalations.c.rule_id.is_(None),
                    )
                )
            )
        for item in due:
            if not Match.from_json(json.loads(item.match)).device_matches(item.name):
                continue
            with self.store.write() as conn:
                self._fire(conn, int(item.rule_id), int(item.device_id), now)

    def _fire(self, conn: Connection, rule_id: int, device_id: int, now: float) -> None:
        """Escalate once per episode: re-checked under the write lock."""
        state = (
            conn.execute(
                select(notify_devices)
                .where(notify_devices.c.device_id == device_id)
                .with_for_update()
            )
            .mappings()
            .one_or_none()
        )
        rule = (
            conn.execute(select(notify_rules).where(notify_rules.c.id == rule_id))
            .mappings()
            .one_or_none()
        )
        if state is None or rule is None or state["failed_since"] is None:
            return
        if state["failed_since"] + rule["escalate_after"] > now:
            return
        fired = conn.execute(
            select(notify_escalations.c.rule_id).where(
                and_(
                    notify_escalations.c.rule_id == rule_id,
                    notify_escalations.c.device_id == device_id,
                )
            )
        ).one_or_none()
        if fired is not None:
            return
        device = device_of(conn, device_id)
        if device is None:
            return
        conditions = json.loads(state["conditions"])
        conn.execute(
            notify_escalations.insert().values(
                rule_id=rule_id,
                device_id=device_id,
                failed_since=state["failed_since"],
                fired_at=now,
            )
        )
        emit(
            conn,
            device,
            "escalation",
            now,
            {
                "rule": rule["name"],
                "escalate_after": rule["escalate_after"],
                "failed_since": iso(state["failed_since"]),
                "conditions": sorted(conditions),
                "failed": sorted(set(conditions) & FAILED),
            },
            [],
            rule_id=rule_id,
        )
