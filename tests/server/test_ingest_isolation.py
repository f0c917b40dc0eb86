"""One report never fails another: the ingest batch isolates faults, on SQLite and PostgreSQL.

The API edge refuses most values the columns cannot hold, so the isolation is
proven twice: against `ReportIngest` directly, with values the database itself
refuses (an integer beyond 64 bits, a NUL on PostgreSQL), and end to end, with
a trigger that makes the database refuse one marked report inside a batch of
good ones (the batch is forced by holding the database's write lock while the
reports queue).
"""

from __future__ import annotations

import asyncio
import math
import secrets
import shutil
import sqlite3
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from sqlalchemy import Connection, func, insert, select
from sqlalchemy import exc as sa_exc

from tests.server.conftest import (
    BACKENDS,
    Server,
    create_pg_database,
    drop_pg_database,
    free_port,
)
from trueup.server.db import Database
from trueup.server.ingest import PendingReport, ReportIngest, ReportRejected
from trueup.server.tables import device_reports, device_state, devices, tenants

GOOD = {"applied_version": 1, "observed_digest": "sha256:" + "ab" * 32, "heartbeat_interval": 30}
POISON_MARK = "poisoned-by-the-test"


# -- ReportIngest directly -------------------------------------------------------------------------


@contextmanager
def fresh_database(backend: str, tmp_path: Path) -> Iterator[Database]:
    if backend == "sqlite":
        database = Database(f"sqlite:///{tmp_path}/ingest.db")
        database.migrate()
        try:
            yield database
        finally:
            database.dispose()
        return
    name = create_pg_database()
    database = Database(f"postgresql://postgres@127.0.0.1:5432/{name}")
    try:
        database.migrate()
        yield database
    finally:
        database.dispose()
        drop_pg_database(name)


def add_devices(database: Database, count: int) -> list[int]:
    now = time.time()
    with database.write() as conn:
        tenant_id = conn.execute(
            insert(tenants).values(name=f"t-{secrets.token_hex(3)}", created_at=now)
        ).inserted_primary_key[0]
        conn.execute(
            insert(devices),
            [
                {"tenant_id": tenant_id, "name": f"d-{i:03d}", "created_at": now}
                for i in range(count)
            ],
        )
        return [
            int(row.id)
            for row in conn.execute(
                select(devices.c.id).where(devices.c.tenant_id == tenant_id).order_by(devices.c.id)
            )
        ]


def stored_reports(database: Database) -> dict[int, int]:
    with database.read() as conn:
        return {
            int(row.device_id): int(row.n)
            for row in conn.execute(
                select(device_reports.c.device_id, func.count().label("n")).group_by(
                    device_reports.c.device_id
                )
            )
        }


def state_versions(database: Database) -> dict[int, int | None]:
    with database.read() as conn:
        return {
            int(row.device_id): row.applied_version
            for row in conn.execute(
                select(device_state.c.device_id, device_state.c.applied_version)
            )
        }


class CountingDatabase:
    """Counts the write transactions the ingest opens."""

    def __init__(self, database: Database) -> None:
        self.database = database
        self.is_sqlite = database.is_sqlite
        self.transactions = 0

    def write(self) -> AbstractContextManager[Connection]:
        self.transactions += 1
        return self.database.write()


def settle_batch(ingest: ReportIngest, batch: list[tuple[int, dict[str, Any]]]) -> list[Any]:
    """Run `write_isolated` on one batch; each report's outcome (None or its exception)."""

    async def run() -> list[Any]:
        loop = asyncio.get_running_loop()
        items = [
            PendingReport(device_id, time.time(), payload, loop.create_future(), loop)
            for device_id, payload in batch
        ]
        await asyncio.to_thread(ingest.write_isolated, items)
        return await asyncio.gather(
            *(item.future for item in items if item.future is not None), return_exceptions=True
        )

    return asyncio.run(run())


DATABASE_REFUSES = [
    pytest.param("sqlite", {"applied_version": 2**63}, id="sqlite-integer-2^63"),
    pytest.param("postgres", {"applied_version": 2**63}, id="postgres-integer-2^63"),
    pytest.param(
        "postgres", {"observed_digest": "sha256:\x00" + "ab" * 31}, id="postgres-nul-in-digest"
    ),
]


@pytest.mark.parametrize(("backend", "poison"), DATABASE_REFUSES)
def test_a_report_the_database_refuses_fails_alone_in_a_shared_batch(
    backend: str, poison: dict[str, Any], tmp_path: Path
) -> None:
    with fresh_database(backend, tmp_path) as database:
        ids = add_devices(database, 52)
        good, bad, twice = ids[:50], ids[50], ids[51]
        batch = [(device_id, dict(GOOD)) for device_id in good[:25]]
        batch.append((twice, {**GOOD, "applied_version": 1}))
        batch.append((bad, {**GOOD, **poison}))
        batch += [(device_id, dict(GOOD)) for device_id in good[25:]]
        batch.append((twice, {**GOOD, "applied_version": 2}))
        counting = CountingDatabase(database)
        ingest = ReportIngest(counting)  # type: ignore[arg-type]

        outcomes = settle_batch(ingest, batch)

        rejected = [
            (device_id, outcome)
            for (device_id, _), outcome in zip(batch, outcomes, strict=True)
            if outcome is not None
        ]
        assert [device_id for device_id, _ in rejected] == [bad]
        assert isinstance(rejected[0][1], ReportRejected)
        assert str(rejected[0][1])
        stored = stored_reports(database)
        assert {device_id: stored.get(device_id, 0) for device_id in good} == dict.fromkeys(good, 1)
        assert stored.get(twice) == 2
        assert bad not in stored
        versions = state_versions(database)
        assert versions[twice] == 2  # the later report is still the one the state keeps
        assert bad not in versions
        # Bisected, not retried one by one: one poisoned report costs O(log n) transactions.
        assert counting.transactions <= 2 * math.ceil(math.log2(len(batch))) + 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_error_other_than_refused_values_also_reaches_its_sender_alone(
    backend: str, tmp_path: Path
) -> None:
    with fresh_database(backend, tmp_path) as database:
        ids = add_devices(database, 11)
        good, bad = ids[:10], ids[10]
        batch = [(device_id, dict(GOOD)) for device_id in good[:5]]
        batch.append((bad, {**GOOD, "heartbeat_interval": "soon"}))
        batch += [(device_id, dict(GOOD)) for device_id in good[5:]]

        outcomes = settle_batch(ReportIngest(database), batch)

        failed = {
            device_id: outcome
            for (device_id, _), outcome in zip(batch, outcomes, strict=True)
            if outcome is not None
        }
        assert list(failed) == [bad]
        assert isinstance(failed[bad], ValueError)
        assert not isinstance(failed[bad], ReportRejected)
        assert stored_reports(database) == dict.fromkeys(good, 1)


@contextmanager
def unavailable_database(backend: str, tmp_path: Path) -> Iterator[Database]:
    """A database that cannot be reached: every write fails, whatever the report."""
    if backend == "sqlite":
        directory = tmp_path / "gone"
        directory.mkdir()
        database = Database(f"sqlite:///{directory}/ingest.db")
        shutil.rmtree(directory)  # the database creates its file (0600) when it is opened
    else:
        database = Database(f"postgresql://postgres@127.0.0.1:{free_port()}/nothing")
    try:
        yield database
    finally:
        database.dispose()


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_unavailable_database_fails_every_report_at_once(backend: str, tmp_path: Path) -> None:
    with unavailable_database(backend, tmp_path) as database:
        counting = CountingDatabase(database)
        batch = [(device_id, dict(GOOD)) for device_id in range(1, 41)]

        outcomes = settle_batch(ReportIngest(counting), batch)  # type: ignore[arg-type]

        assert all(isinstance(outcome, sa_exc.OperationalError) for outcome in outcomes)
        assert counting.transactions == 1  # no report is at fault: nothing to bisect


@pytest.mark.parametrize(("backend", "poison"), DATABASE_REFUSES)
def test_the_writer_thread_answers_a_queued_batch_report_by_report(
    backend: str, poison: dict[str, Any], tmp_path: Path
) -> None:
    """Through `submit()` and the writer thread: every report queued before it starts."""
    with fresh_database(backend, tmp_path) as database:
        ids = add_devices(database, 21)
        good, bad = ids[:20], ids[20]
        ingest = ReportIngest(database)

        async def run() -> list[Any]:
            tasks = [asyncio.create_task(ingest.submit(d, dict(GOOD))) for d in good[:10]]
            tasks.append(asyncio.create_task(ingest.submit(bad, {**GOOD, **poison})))
            tasks += [asyncio.create_task(ingest.submit(d, dict(GOOD))) for d in good[10:]]
            while ingest.queued() < len(tasks):
                await asyncio.sleep(0)  # let each task queue its report
            ingest.start()
            try:
                return await asyncio.gather(*tasks, return_exceptions=True)
            finally:
                await asyncio.to_thread(ingest.stop)

        outcomes = asyncio.run(run())

        assert outcomes[:10] + outcomes[11:] == [None] * 20
        assert isinstance(outcomes[10], ReportRejected)
        assert ingest.in_flight() == 0
        assert stored_reports(database) == dict.fromkeys(good, 1)


@pytest.mark.parametrize(("backend", "poison"), DATABASE_REFUSES)
def test_naive_ingest_rejects_the_refused_report(
    backend: str, poison: dict[str, Any], tmp_path: Path
) -> None:
    with fresh_database(backend, tmp_path) as database:
        good, bad = add_devices(database, 2)
        ingest = ReportIngest(database, mode="naive")
        asyncio.run(ingest.submit(good, dict(GOOD)))
        with pytest.raises(ReportRejected):
            asyncio.run(ingest.submit(bad, {**GOOD, **poison}))
        assert stored_reports(database) == {good: 1}


# -- end to end, through the API -------------------------------------------------------------------


def sqlite_path(server: Server) -> str:
    return server.url[len("sqlite:///") :]


def install_poison_trigger(server: Server) -> None:
    """The database refuses a report whose observed_digest is POISON_MARK (a data error)."""
    if server.backend == "sqlite":
        with sqlite3.connect(sqlite_path(server)) as conn:
            conn.execute(
                "CREATE TRIGGER poison BEFORE INSERT ON device_reports "
                f"WHEN NEW.observed_digest = '{POISON_MARK}' "
                "BEGIN SELECT RAISE(ABORT, 'poisoned report'); END"
            )
        return
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute(
            "CREATE FUNCTION poison() RETURNS trigger AS $$ BEGIN "
            f"IF NEW.observed_digest = '{POISON_MARK}' THEN "
            "RAISE EXCEPTION 'integer out of range' USING ERRCODE = 'numeric_value_out_of_range'; "
            "END IF; RETURN NEW; END $$ LANGUAGE plpgsql"
        )
        conn.execute(
            "CREATE TRIGGER poison BEFORE INSERT ON device_reports "
            "FOR EACH ROW EXECUTE FUNCTION poison()"
        )


@contextmanager
def reports_held(server: Server) -> Iterator[None]:
    """Hold the database so that the ingest writer waits inside its transaction."""
    if server.backend == "sqlite":
        lite = sqlite3.connect(sqlite_path(server), isolation_level=None)
        lite.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            lite.execute("ROLLBACK")
            lite.close()
        return
    with psycopg.connect(server.url) as conn:
        conn.execute("LOCK TABLE device_reports IN SHARE MODE")
        try:
            yield
        finally:
            conn.rollback()


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 90
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def reports_by_device(server: Server) -> dict[str, int]:
    database = Database(server.url)
    try:
        with database.read() as conn:
            return {
                row.name: int(row.n)
                for row in conn.execute(
                    select(devices.c.name, func.count().label("n"))
                    .join(device_reports, device_reports.c.device_id == devices.c.id)
                    .group_by(devices.c.name)
                )
            }
    finally:
        database.dispose()


@pytest.mark.parametrize("isolated_server", BACKENDS, indirect=True)
def test_a_poisoned_report_among_50_good_devices_fails_only_its_sender(
    isolated_server: Server,
) -> None:
    server = isolated_server
    good = [f"good-{i:02d}" for i in range(50)]
    tenant = server.tenant(devices=(*good, "bad"))
    other = server.tenant(devices=("bad",))
    install_poison_trigger(server)
    ingest: ReportIngest = server.client.app.state.ingest  # type: ignore[attr-defined]

    def post(owner: Any, device: str, payload: dict[str, Any]) -> httpx.Response:
        return server.client.post(
            "/api/v1/agent/report", json=payload, headers=owner.device_auth(device)
        )

    with ThreadPoolExecutor(max_workers=len(good) + 4) as pool:
        # A batch of the 50 good reports and the poisoned one (another tenant's device):
        # the writer holds a first report while the database is held, the rest queue.
        with reports_held(server):
            first = pool.submit(post, tenant, good[0], GOOD)
            wait_for(lambda: ingest.in_flight() == 1 and ingest.queued() == 0, "the first report")
            futures: dict[str, Future[httpx.Response]] = {
                device: pool.submit(post, tenant, device, GOOD) for device in good
            }
            poisoned = pool.submit(post, other, "bad", {**GOOD, "observed_digest": POISON_MARK})
            wait_for(lambda: ingest.queued() == len(good) + 1, "the batch to queue")
        assert first.result().status_code == 200
        answers = {device: future.result() for device, future in futures.items()}
        refused = poisoned.result()

        # The reproduction: values the columns cannot hold, among concurrent reports.
        limit = 2**63 if server.backend == "sqlite" else 2**31
        again = {device: pool.submit(post, tenant, device, GOOD) for device in good}
        edge = [
            pool.submit(post, tenant, "bad", {**GOOD, "applied_version": limit}),
            pool.submit(post, tenant, "bad", {**GOOD, "observed_digest": "sha256:\x00ab"}),
        ]
        answers_again = {device: future.result() for device, future in again.items()}
        edge_answers = [future.result() for future in edge]

    assert {d: r.status_code for d, r in answers.items()} == dict.fromkeys(good, 200)
    assert refused.status_code == 422, refused.text
    assert refused.json()["detail"] == "invalid report; nothing was stored"
    assert {d: r.status_code for d, r in answers_again.items()} == dict.fromkeys(good, 200)
    assert [r.status_code for r in edge_answers] == [422, 422]
    stored = reports_by_device(server)
    assert stored == {**dict.fromkeys(good, 2), good[0]: 3}  # nothing from either "bad"
