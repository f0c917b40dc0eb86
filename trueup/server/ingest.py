"""Agent report ingest: batched, durable, nothing lost.

`submit()` hands a report to one writer thread and returns only after the
transaction holding it has committed. The writer drains whatever has queued
while it was committing the previous batch and writes it in one transaction
(group commit), so throughput grows with load while a lone report still
commits at once. A report is never acknowledged before it is durable.

One report must never fail another: when a batch's transaction fails, the
writer tells apart a database that is unavailable (connection lost, server
shutting down: every caller in the batch gets the error and retries, nothing
is acknowledged) from a batch that holds a report the database refuses. It
then bisects the batch, each half in a transaction of its own, until the
reports that fail are alone; the others commit and are acknowledged. A lone
report refused for its values (an integer out of range, a string too long, a
NUL on PostgreSQL) or a constraint fails with `ReportRejected`, which the
route answers 422 to that sender alone; any other error reaches that sender
alone too. A deadlock or serialization failure is retried as a whole.

Each report's `confirmation` (the agent's confirm-or-rollback of a revision
delivered with a window) is stored latest per device in the same transaction
(`trueup.server.confirmation`); a newly reported rollback is audited there
as `revision.rolled_back`.

`mode="naive"` commits one transaction per report; the benchmark's baseline.

Why this module is over 400 lines: it is the one writer of everything a report
stores — the report itself, the device's state, its drift records, its
confirmation and the audit entry of a rollback — in one transaction per
batch, beside the batching and isolation logic those writes share.
"""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, TypedDict

from sqlalchemy import Connection, and_, bindparam, case, select
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from starlette.concurrency import run_in_threadpool

from trueup.model.jsontypes import JSONObject
from trueup.server import audit
from trueup.server.confirmation import confirmation_row, write_confirmations
from trueup.server.db import Database, is_transient, is_unavailable, original_error
from trueup.server.drift import drift_rows, end_unreported_drift, write_drift
from trueup.server.fleet import in_sync_now
from trueup.server.keys import ServerKey
from trueup.server.records import ConfirmationRow, DriftRow
from trueup.server.tables import device_reports, device_state, devices, revisions

__all__ = ["PendingReport", "ReportIngest", "ReportRejected"]

log = logging.getLogger(__name__)

# Attempts of a whole batch that failed with a deadlock or serialization failure.
TRANSIENT_ATTEMPTS = 3


class ReportRejected(Exception):
    """The database refused this report's values: the sender's fault, answered 422."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _rejection(exc: BaseException) -> ReportRejected | None:
    """`ReportRejected` when a lone report failed for its values; None otherwise."""
    if isinstance(exc, OverflowError):  # SQLite binds integers as 64-bit
        return ReportRejected("an integer is out of the range the database holds")
    if isinstance(exc, sa_exc.DataError):
        orig = original_error(exc)
        diag = getattr(orig, "diag", None)
        message = getattr(diag, "message_primary", None) or str(orig or exc)
        return ReportRejected(message.splitlines()[0][:200])
    if isinstance(exc, sa_exc.IntegrityError):
        # A constraint this report alone breaks (its device deleted meanwhile, say);
        # the database's message would name the schema's internals.
        return ReportRejected("the database refused this report (a constraint failed)")
    return None


@dataclass
class PendingReport:
    device_id: int
    received_at: float
    payload: JSONObject  # the report's body as received (`AgentReport`, validated), stored as is
    future: asyncio.Future[None] | None = None
    loop: asyncio.AbstractEventLoop | None = None


def _settle(item: PendingReport, error: BaseException | None) -> None:
    future = item.future
    if future is None or item.loop is None:
        return

    def settle() -> None:
        if future.done():
            return
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)

    item.loop.call_soon_threadsafe(settle)


class _Identity(TypedDict):
    applied_digest: str | None
    applied_origin: str | None
    override: str | None  # JSON text


def _identity(payload: JSONObject) -> _Identity:
    """The applied revision's identity columns: digest, origin and override (JSON or None)."""
    override = payload.get("override")
    return {
        "applied_digest": payload.get("applied_digest"),
        "applied_origin": payload.get("applied_origin"),
        "override": json.dumps(override, sort_keys=True) if override is not None else None,
    }


class ReportIngest:
    def __init__(
        self,
        database: Database,
        *,
        mode: str = "batch",
        max_batch: int = 2000,
        stale_intervals: int = 3,
        on_batch: Any = None,
        on_committed: Any = None,
        server_key: ServerKey | None = None,
    ) -> None:
        if mode not in ("batch", "naive"):
            raise ValueError(f"ingest mode {mode!r}: use batch or naive")
        self.db = database
        self.mode = mode
        self.max_batch = max_batch
        self.stale_intervals = stale_intervals
        self.on_batch = on_batch
        # Called with each committed report (device id, payload, received_at), in order;
        # the notifier's hook. It must not block, and its failure fails no report.
        self.on_committed = on_committed
        # Audits a newly reported rollback (`revision.rolled_back`) in the batch's
        # transaction; without it (tests of the batching alone) none is audited.
        self.server_key = server_key
        self._queue: queue.Queue[PendingReport | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._in_flight = 0
        self._statements()

    def start(self) -> None:
        if self.mode == "batch" and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="report-ingest", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=30)
            self._thread = None

    async def submit(self, device_id: int, payload: JSONObject) -> None:
        item = PendingReport(device_id, time.time(), payload)
        if self.mode == "naive":
            await self._submit_naive(item)
            return
        loop = asyncio.get_running_loop()
        item.loop = loop
        item.future = loop.create_future()
        self._in_flight += 1
        try:
            self._queue.put(item)
            await item.future
        finally:
            self._in_flight -= 1

    def queued(self) -> int:
        """Reports waiting for the writer (not yet in a transaction)."""
        return self._queue.qsize()

    def in_flight(self) -> int:
        """Reports submitted and not yet answered: queued or in the writer's transaction."""
        return self._in_flight

    async def _submit_naive(self, item: PendingReport) -> None:
        try:
            await run_in_threadpool(self.write_batch, [item])
        except Exception as exc:
            rejected = _rejection(exc)
            if rejected is None:
                raise
            log.warning("report of device %s rejected: %s", item.device_id, rejected.reason)
            raise rejected from exc

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            stopping = False
            while len(batch) < self.max_batch:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stopping = True
                    break
                batch.append(item)
            try:
                self.write_isolated(batch)
            except BaseException as exc:  # the writer thread must outlive any failure
                log.exception("report ingest failed")
                for item in batch:
                    _settle(item, exc)
            if stopping:
                return

    def write_isolated(self, batch: list[PendingReport]) -> None:
        """Write `batch`, settling each report: committed, rejected, or the database's error.

        Reports that commit are settled as soon as their transaction has
        committed; a failing batch is bisected so that only the reports that
        fail alone get an error.
        """
        try:
            self.write_batch(batch)
        except Exception as exc:
            if is_unavailable(exc):
                log.error("report ingest: database unavailable: %s", exc)
                for item in batch:
                    _settle(item, exc)
                return
            if len(batch) == 1:
                item = batch[0]
                rejected = _rejection(exc)
                if rejected is not None:
                    log.warning("report of device %s rejected: %s", item.device_id, rejected.reason)
                    _settle(item, rejected)
                else:
                    log.error("report of device %s failed", item.device_id, exc_info=exc)
                    _settle(item, exc)
                return
            middle = len(batch) // 2
            # In order, so the later report of a device is still the one its state keeps.
            self.write_isolated(batch[:middle])
            self.write_isolated(batch[middle:])
            return
        for item in batch:
            _settle(item, None)

    def write_batch(self, batch: list[PendingReport]) -> None:
        """One transaction holding `batch` (retried whole after a deadlock)."""
        for attempt in range(1, TRANSIENT_ATTEMPTS + 1):
            try:
                with self.db.write() as conn:
                    self._write(conn, batch)
            except Exception as exc:
                if attempt < TRANSIENT_ATTEMPTS and is_transient(exc):
                    continue
                raise
            break
        if self.on_batch is not None:
            try:
                self.on_batch(len(batch))
            except Exception:  # a metrics failure never fails committed reports
                log.exception("report ingest: on_batch failed")
        if self.on_committed is not None:
            try:
                for item in batch:
                    self.on_committed(item.device_id, item.payload, item.received_at)
            except Exception:  # the notifier's scan catches up from device_state
                log.exception("report ingest: on_committed failed")

    def _statements(self) -> None:
        """The batch's three statements, built once (a batch's fixed cost is mostly CPU)."""
        # The desired revision's number and content hash (the latter decides "same
        # document" when the agent reports the applied document's digest).
        self._desired = (
            select(devices.c.id, devices.c.desired_version, revisions.c.content_hash)
            .outerjoin(
                revisions,
                and_(
                    revisions.c.device_id == devices.c.id,
                    revisions.c.version == devices.c.desired_version,
                ),
            )
            .where(devices.c.id.in_(bindparam("ids", expanding=True)))
        )
        self._insert_reports = device_reports.insert()
        insert = pg_insert(device_state) if not self.db.is_sqlite else sqlite_insert(device_state)
        excluded = insert.excluded
        # Keep the start of an unbroken in-sync period; a gap longer than the stale
        # threshold, or any out-of-sync report, starts it again.
        continuing = and_(
            device_state.c.in_sync_since.is_not(None),
            device_state.c.last_report_at
            >= excluded.last_report_at - self.stale_intervals * device_state.c.heartbeat_interval,
        )
        self._upsert_state = insert.on_conflict_do_update(
            index_elements=[device_state.c.device_id],
            set_={
                "last_report_at": excluded.last_report_at,
                "applied_version": excluded.applied_version,
                "observed_digest": excluded.observed_digest,
                "reason_codes": excluded.reason_codes,
                "report": excluded.report,
                "heartbeat_interval": excluded.heartbeat_interval,
                "applied_digest": excluded.applied_digest,
                "applied_origin": excluded.applied_origin,
                "override": excluded.override,
                "in_sync_since": case(
                    (excluded.in_sync_since.is_(None), None),
                    (continuing, device_state.c.in_sync_since),
                    else_=excluded.in_sync_since,
                ),
            },
        )

    def _write(self, conn: Connection, batch: list[PendingReport]) -> None:
        device_ids = sorted({item.device_id for item in batch})
        # The desired revision's number and content hash (the latter decides "same
        # document" when the agent reports the applied document's digest).
        desired: dict[int, tuple[int, str | None]] = {
            int(row.id): (int(row.desired_version), row.content_hash)
            for row in conn.execute(self._desired, {"ids": device_ids})
        }
        encoded = [json.dumps(item.payload, sort_keys=True) for item in batch]
        conn.execute(
            self._insert_reports,
            [
                {
                    "device_id": item.device_id,
                    "received_at": item.received_at,
                    "applied_version": item.payload.get("applied_version"),
                    "observed_digest": item.payload.get("observed_digest"),
                    "payload": text,
                    **_identity(item.payload),
                }
                for item, text in zip(batch, encoded, strict=True)
            ],
        )
        latest: dict[int, tuple[PendingReport, str]] = {}
        for item, text in zip(batch, encoded, strict=True):
            latest[item.device_id] = (item, text)
        rows = []
        for device_id in sorted(latest):
            item, text = latest[device_id]
            applied = item.payload.get("applied_version")
            identity = _identity(item.payload)
            desired_version, desired_digest = desired.get(device_id, (None, None))
            in_sync = in_sync_now(
                desired_version=desired_version,
                applied_version=applied,
                desired_digest=desired_digest,
                applied_digest=identity["applied_digest"],
                override=identity["override"] is not None,
                reported_codes=item.payload.get("reason_codes") or [],
            )
            rows.append(
                {
                    "device_id": device_id,
                    "last_report_at": item.received_at,
                    "applied_version": applied,
                    "observed_digest": item.payload.get("observed_digest"),
                    "reason_codes": json.dumps(item.payload.get("reason_codes") or []),
                    "report": text,
                    "heartbeat_interval": float(item.payload.get("heartbeat_interval") or 30.0),
                    "in_sync_since": item.received_at if in_sync else None,
                    **identity,
                }
            )
        conn.execute(self._upsert_state, rows)
        self._write_drift(conn, batch)
        confirmations = [
            row
            for item in batch
            if (row := confirmation_row(item.device_id, item.payload, item.received_at))
        ]
        write_confirmations(
            conn,
            confirmations,
            is_sqlite=self.db.is_sqlite,
            on_rolled_back=self._audit_rolled_back if self.server_key is not None else None,
        )

    def _audit_rolled_back(
        self, conn: Connection, tenant_id: int, tenant: str, device: str, row: ConfirmationRow
    ) -> None:
        """`revision.rolled_back`: the device's agent rolled a revision back by itself."""
        assert self.server_key is not None
        audit.append(
            conn,
            self.server_key,
            tenant_id=tenant_id,
            actor=f"device:{tenant}/{device}",
            action="revision.rolled_back",
            target=f"device:{device}",
            detail={
                "device_id": row["device_id"],
                "version": row["version"],
                "rollback_to": row["rollback_to"],
                "rolled_back_to_version": row["rolled_back_to_version"],
                "deadline": row["deadline"],
                "reason": row["reason"],
            },
            at=row["reported_at"],
        )

    def _write_drift(self, conn: Connection, batch: list[PendingReport]) -> None:
        """The drift records the batch's reports carry, each once (a record's later
        report wins, but an end seen earlier in the batch is kept)."""
        merged: dict[tuple[int, str, float], DriftRow] = {}
        for item in batch:
            for row in drift_rows(item.device_id, item.payload, item.received_at):
                key = (row["device_id"], row["subsystem"], row["since"])
                earlier = merged.get(key)
                if earlier is not None:
                    row["first_reported_at"] = earlier["first_reported_at"]
                    for ended in ("healed_at", "healed_by"):
                        if row[ended] is None:
                            row[ended] = earlier[ended]
                merged[key] = row
        write_drift(conn, list(merged.values()), is_sqlite=self.db.is_sqlite)
        latest: dict[int, PendingReport] = {}
        for item in batch:
            # An agent that reports its drift history names its version; an older agent
            # (no history: the model's default) says nothing about what ended.
            if item.payload.get("agent_version") and isinstance(
                item.payload.get("drift_history"), list
            ):
                latest[item.device_id] = item  # the batch is in arrival order
        for device_id, item in sorted(latest.items()):
            end_unreported_drift(conn, device_id, item.payload, item.received_at)
