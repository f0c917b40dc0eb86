"""Control-plane benchmark: agent reports ingested per second.

Real server processes (uvicorn) on 127.0.0.1, simulated agents in a separate
load process speaking plain HTTP/1.1 keep-alive. For SQLite and PostgreSQL,
with one and two server processes, batched ingest against the naive baseline
(one transaction per report). Then a simulated fleet (10,000 devices, one
report every 30 s each) held for a while, counting every report the server
acknowledged against the rows in the database: none may be missing.

    python -m scripts.bench_server                     # quick figures
    python -m scripts.bench_server --full              # longer runs, fleet held 10 minutes
    python -m scripts.bench_server --fleet-seconds 600 --fleet-devices 10000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import queue as queue_module
import random
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
from sqlalchemy import bindparam, func, insert, select, update

from trueup.server.app import SETTINGS_ENV, Settings
from trueup.server.audit import token_seal
from trueup.server.db import Database
from trueup.server.keys import load_or_create_server_key
from trueup.server.service import ControlPlane
from trueup.server.tables import device_reports, devices, tokens
from trueup.server.tokens import TokenKind, hash_token, new_token

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
MARKER = "bench-"  # observed_digest of a numbered report in the open-loop runs
REPORT = {
    "applied_version": 1,
    "observed_digest": "sha256:" + "ab" * 32,
    "diff_summary": {"paths": [], "subsystems": {}},
    "subsystems": {
        "management": {"health": "ok"},
        "links": {"health": "ok"},
        "addresses": {"health": "ok"},
        "routes": {"health": "ok"},
    },
    "reason_codes": [],
    "journal": {"open": None, "last": {"id": "t-1", "outcome": "committed"}},
    "heartbeat_interval": 30,
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Backend:
    name: str
    url: str
    key_file: Path
    credentials: list[str]
    cleanup: Any
    db_name: str = ""

    def count_reports(self) -> int:
        database = Database(self.url)
        try:
            with database.read() as conn:
                return int(
                    conn.execute(select(func.count()).select_from(device_reports)).scalar_one()
                )
        finally:
            database.dispose()

    def stored_markers(self) -> dict[int, float]:
        """Report number -> received_at, for every stored report the load process numbered."""
        database = Database(self.url)
        try:
            with database.read() as conn:
                return {
                    int(row.observed_digest[len(MARKER) :]): float(row.received_at)
                    for row in conn.execute(
                        select(device_reports.c.observed_digest, device_reports.c.received_at)
                    )
                    if row.observed_digest and row.observed_digest.startswith(MARKER)
                }
        finally:
            database.dispose()


def make_backend(
    name: str, workdir: Path, device_count: int, pg_settings: dict[str, str] | None = None
) -> Backend:
    if name == "sqlite":
        path = workdir / f"bench-{secrets.token_hex(3)}.db"
        url = f"sqlite:///{path}"

        def cleanup() -> None:
            for suffix in ("", "-wal", "-shm"):
                Path(str(path) + suffix).unlink(missing_ok=True)

    else:
        db_name = f"trueup_bench_{os.getpid()}_{secrets.token_hex(3)}"
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{db_name}"')
            for setting, value in (pg_settings or {}).items():
                conn.execute(f'ALTER DATABASE "{db_name}" SET {setting} = {value}')
        url = f"postgresql://postgres@127.0.0.1:5432/{db_name}"

        def cleanup() -> None:
            with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')

    key_file = workdir / "bench.key"
    database = Database(url)
    database.migrate()
    plane = ControlPlane(database, load_or_create_server_key(key_file))
    tenant_id = plane.create_tenant(f"bench-{secrets.token_hex(3)}", "bench")
    credentials = [new_token(TokenKind.DEVICE) for _ in range(device_count)]
    now = time.time()
    # Simulated devices are inserted in bulk (the enrollment path is not what is measured).
    with database.write() as conn:
        conn.execute(
            insert(devices),
            [
                {
                    "tenant_id": tenant_id,
                    "name": f"sim-{i:05d}",
                    "created_at": now,
                    "desired_version": 1,
                }
                for i in range(device_count)
            ],
        )
        ids = [
            row.id
            for row in conn.execute(
                select(devices.c.id)
                .where(devices.c.tenant_id == tenant_id)
                .order_by(devices.c.name)
            )
        ]
        conn.execute(
            insert(tokens),
            [
                {
                    "tenant_id": tenant_id,
                    "kind": TokenKind.DEVICE.value,
                    "device_id": device_id,
                    "token_hash": hash_token(credential),
                    "label": "bench",
                    "created_at": now,
                }
                for device_id, credential in zip(ids, credentials, strict=True)
            ],
        )
        # Every token row carries its seal (authentication refuses one without).
        key = load_or_create_server_key(key_file)
        rows = conn.execute(
            select(tokens.c.id, tokens.c.device_id, tokens.c.token_hash).where(
                tokens.c.tenant_id == tenant_id, tokens.c.kind == TokenKind.DEVICE.value
            )
        ).all()
        conn.execute(
            update(tokens).where(tokens.c.id == bindparam("token_id")),
            [
                {
                    "token_id": row.id,
                    "seal": token_seal(
                        key,
                        token_id=row.id,
                        tenant_id=tenant_id,
                        kind=TokenKind.DEVICE.value,
                        user_id=None,
                        device_id=row.device_id,
                        token_hash=row.token_hash,
                        expires_at=None,
                    ),
                }
                for row in rows
            ],
        )
    database.dispose()
    return Backend(name, url, key_file, credentials, cleanup, url.rsplit("/", 1)[-1])


async def floor_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The HTTP floor: uvicorn answering every request at once, no application behind it."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    while (await receive()).get("more_body"):
        pass
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json"), (b"content-length", b"15")],
        }
    )
    await send({"type": "http.response.body", "body": b'{"stored":true}'})


def start_servers(
    backend: Backend | None, count: int, mode: str
) -> list[tuple[subprocess.Popen[bytes], int]]:
    """`count` uvicorn processes of the control plane (or of `floor_app` without a backend)."""
    servers = []
    for _ in range(count):
        port = _free_port()
        if backend is None:
            target = ["scripts.bench_server:floor_app"]
            env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
        else:
            settings = Settings(
                db_url=backend.url,
                key_file=str(backend.key_file),
                ingest_mode=mode,
                auth_cache_seconds=30.0,
                migrate=False,
            )
            target = ["--factory", "trueup.server.app:create_app_from_env"]
            env = {**os.environ, SETTINGS_ENV: settings.to_env()}
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                *target,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--log-level",
                "warning",
                "--no-access-log",
                "--loop",
                "uvloop",
                "--http",
                "httptools",
                "--backlog",
                "4096",
            ],
            env=env,
        )
        servers.append((process, port))
    for process, port in servers:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise RuntimeError("bench server exited during start-up")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("bench server did not start")
            time.sleep(0.05)
    return servers


def stop_servers(servers: list[tuple[subprocess.Popen[bytes], int]]) -> None:
    for process, _port in servers:
        process.terminate()
    for process, _port in servers:
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


# -- the load process -----------------------------------------------------------------------------


def _request(credential: str, body: bytes) -> bytes:
    return (
        "POST /api/v1/agent/report HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {credential}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def _exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
) -> int:
    writer.write(request)
    await writer.drain()
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionError("server closed the connection")
    length = 0
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        name, _, value = line.decode("latin-1").partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    if length:
        await reader.readexactly(length)
    return int(status_line.split()[1])


async def _closed_loop(
    ports: list[int], credentials: list[str], connections: int, seconds: float, warmup: float
) -> dict[str, Any]:
    body = json.dumps(REPORT).encode()
    latencies: list[float] = []
    errors = 0
    ok = 0
    start = time.perf_counter()
    measure_from = start + warmup
    stop_at = measure_from + seconds

    async def worker(index: int) -> None:
        nonlocal errors, ok
        reader, writer = await asyncio.open_connection("127.0.0.1", ports[index % len(ports)])
        rng = random.Random(index)
        while True:
            now = time.perf_counter()
            if now >= stop_at:
                break
            request = _request(credentials[rng.randrange(len(credentials))], body)
            status = await _exchange(reader, writer, request)
            done = time.perf_counter()
            if status == 200:
                ok += 1
            else:
                errors += 1
            if now >= measure_from:
                latencies.append(done - now)
        writer.close()

    await asyncio.gather(*(worker(i) for i in range(connections)))
    return {"latencies": latencies, "seconds": seconds, "ok": ok, "errors": errors}


def _numbered_body() -> tuple[bytes, bytes]:
    """The report's JSON around its observed_digest: MARKER + the report's number."""
    placeholder = "\x00"
    text = json.dumps({**REPORT, "observed_digest": placeholder})
    prefix, suffix = text.split(json.dumps(placeholder))
    return (prefix + '"' + MARKER).encode(), ('"' + suffix).encode()


async def _fleet(
    ports: list[int],
    credentials: list[str],
    interval: float,
    seconds: float,
    connections: int,
    warmup: float = 0.0,
) -> dict[str, Any]:
    """Open loop: device i reports at offset i/N·interval, then every interval.

    Every report carries its number in observed_digest; the outcome lists the
    acknowledged ones with, in wall-clock time, when each was due, when its
    request was written and when its answer was read.
    """
    prefix, suffix = _numbered_body()
    queue: asyncio.Queue[tuple[float, int, str]] = asyncio.Queue()
    acknowledged: list[int] = []  # every report the server acknowledged
    timed: list[tuple[int, float, float, float]] = []  # after warm-up: (number, due, sent, done)
    counters = {"sent": 0, "ok": 0, "errors": 0}
    cpu_start = time.process_time()
    start = time.perf_counter()
    wall_offset = time.time() - start  # perf_counter + wall_offset = wall clock
    end = start + seconds

    async def scheduler() -> None:
        n = len(credentials)
        k = 0
        while True:
            due = start + (k / n) * interval
            if due >= end:
                break
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            queue.put_nowait((due, k, credentials[k % n]))
            k += 1
        for _ in range(connections):
            queue.put_nowait((0.0, -1, ""))

    async def worker(index: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", ports[index % len(ports)])
        while True:
            due, number, credential = await queue.get()
            if not credential:
                break
            counters["sent"] += 1
            request = _request(credential, prefix + str(number).encode() + suffix)
            sent = time.perf_counter()
            status = 0
            for _attempt in range(5):  # an agent retries until the server acknowledges
                try:
                    status = await _exchange(reader, writer, request)
                except (ConnectionError, asyncio.IncompleteReadError):
                    writer.close()
                    reader, writer = await asyncio.open_connection(
                        "127.0.0.1", ports[index % len(ports)]
                    )
                    continue
                if status == 200:
                    break
            done = time.perf_counter()
            if status == 200:
                counters["ok"] += 1
                acknowledged.append(number)
                if due >= start + warmup:
                    timed.append(
                        (number, due + wall_offset, sent + wall_offset, done + wall_offset)
                    )
            else:
                counters["errors"] += 1
        writer.close()

    await asyncio.gather(scheduler(), *(worker(i) for i in range(connections)))
    return {
        "acknowledged": acknowledged,
        "timed": timed,
        "end": end + wall_offset,  # the schedule's end, wall clock
        "seconds": seconds - warmup,
        "cpu": time.process_time() - cpu_start,
        **counters,
    }


def _load_process(kind: str, args: dict[str, Any], results: Any) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    runner = _closed_loop if kind == "closed" else _fleet
    results.put(asyncio.run(runner(**args)))


def run_load(kind: str, **args: Any) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    process = context.Process(target=_load_process, args=(kind, args, results))
    process.start()
    deadline = time.monotonic() + args.get("seconds", 60) + 300
    while True:
        try:
            outcome: dict[str, Any] = results.get(timeout=1)
            break
        except queue_module.Empty:
            if not process.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the load process failed (exit {process.exitcode})") from None
    process.join(30)
    return outcome


def percentile(values: list[float], fraction: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


# -- the runs --------------------------------------------------------------------------------------


def throughput_table(seconds: float, connections: int) -> tuple[list[str], list[dict[str, Any]]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="trueup-bench-") as tmp:
        workdir = Path(tmp)
        for backend_name in ("sqlite", "postgres"):
            for processes in (1, 2):
                for mode in ("batch", "naive"):
                    backend = make_backend(backend_name, workdir, 1000)
                    servers = start_servers(backend, processes, mode)
                    try:
                        before = backend.count_reports()
                        outcome = run_load(
                            "closed",
                            ports=[port for _, port in servers],
                            credentials=backend.credentials,
                            connections=connections,
                            seconds=seconds,
                            warmup=1.0,
                        )
                        stored = backend.count_reports() - before
                    finally:
                        stop_servers(servers)
                        backend.cleanup()
                    latencies = outcome["latencies"]
                    row = {
                        "backend": backend_name,
                        "processes": processes,
                        "mode": mode,
                        "rate": len(latencies) / outcome["seconds"],
                        "p50": percentile(latencies, 0.5) * 1000,
                        "p99": percentile(latencies, 0.99) * 1000,
                        "ok": outcome["ok"],
                        "errors": outcome["errors"],
                        "stored": stored,
                    }
                    rows.append(row)
                    print(
                        f"  {backend_name:8} x{processes} {mode:5}: {row['rate']:7.0f}/s "
                        f"p50 {row['p50']:.1f} ms p99 {row['p99']:.1f} ms "
                        f"(acknowledged {row['ok']}, stored {stored}, errors {row['errors']})",
                        file=sys.stderr,
                    )
    lines = [
        "| database | server processes | ingest | reports/s | p50 ms | p99 ms | acknowledged = stored |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['backend']} | {row['processes']} | {row['mode']} | {row['rate']:.0f} | "
            f"{row['p50']:.1f} | {row['p99']:.1f} | "
            f"{'yes' if row['ok'] == row['stored'] and not row['errors'] else 'NO'} "
            f"({row['ok']}/{row['stored']}) |"
        )
    return lines, rows


def _cpu_seconds(pid: int, tid: int | None = None) -> float:
    """User + system CPU time of a process (or one of its threads) so far; 0 once gone."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    try:
        fields = Path(path).read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _server_cpu(pids: list[int]) -> tuple[float, float]:
    """(event-loop thread, other threads) CPU seconds of server processes.

    The main thread runs the event loop: HTTP, routing, authentication from the
    cache, validation. The others are the ingest's writer and the thread pool
    (database reads for authentication; the naive ingest's writes).
    """
    loop = sum(_cpu_seconds(pid, pid) for pid in pids)
    return loop, sum(_cpu_seconds(pid) for pid in pids) - loop


def _machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    idle = values[3] + values[4]
    tick = os.sysconf("SC_CLK_TCK")
    return (sum(values) - idle) / tick, sum(values) / tick


def _postgres_pids(db_name: str) -> list[int]:
    """The PostgreSQL processes working for one database, and the shared WAL/checkpoint ones."""
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s OR backend_type IN "
            "('walwriter', 'checkpointer', 'background writer', 'autovacuum launcher')",
            (db_name,),
        ).fetchall()
    return [int(row[0]) for row in rows]


class CpuMeter:
    """CPU seconds of the server processes and PostgreSQL during a run, and the machine's."""

    def __init__(self, servers: list[int], db_name: str) -> None:
        self.servers = servers
        self.db_name = db_name
        self.start = self._sample()

    def _sample(self) -> dict[str, Any]:
        pg = (
            {pid: _cpu_seconds(pid) for pid in _postgres_pids(self.db_name)} if self.db_name else {}
        )
        return {
            "servers": _server_cpu(self.servers),
            "pg": pg,
            "machine": _machine_busy(),
            "load": os.getloadavg()[0],
        }

    def stop(self) -> dict[str, float]:
        end = self._sample()
        pg_start = self.start["pg"]
        busy = end["machine"][0] - self.start["machine"][0]
        total = end["machine"][1] - self.start["machine"][1]
        return {
            "loop": end["servers"][0] - self.start["servers"][0],
            "threads": end["servers"][1] - self.start["servers"][1],
            "postgres": sum(cpu - pg_start.get(pid, 0.0) for pid, cpu in end["pg"].items()),
            "busy": busy / total if total else float("nan"),
            "load_before": self.start["load"],
            "load_after": end["load"],
        }


@dataclass
class OfferedRow:
    label: str
    backend: str | None  # None: the HTTP floor
    processes: int
    pg_settings: dict[str, str] | None = None


OFFERED_ROWS = [
    OfferedRow("HTTP floor (uvicorn, no application)", None, 1),
    OfferedRow("sqlite", "sqlite", 1),
    OfferedRow("sqlite", "sqlite", 2),
    OfferedRow("postgres", "postgres", 1),
    OfferedRow("postgres", "postgres", 2),
    OfferedRow("postgres, `synchronous_commit=off`", "postgres", 2, {"synchronous_commit": "off"}),
]

OFFERED_HEADER = [
    "| database | server processes | answered in time, reports/s | p50 ms | p99 ms | p99 ratio to floor "
    "| lost | slowest 1 %: due → sent / sent → received / received → answered, ms "
    "| CPU ms per report: servers (event loop + ingest) / PostgreSQL / load generator | machine busy |",
    "|---|---:|---:|---:|---:|---:|---:|---|---|---:|",
]


def offered_rate_table(
    seconds: float, rate: float = 2000.0, rows: list[OfferedRow] | None = None
) -> tuple[list[str], list[dict[str, Any]]]:
    """Open loop at a fixed offered rate: what an agent sees when the fleet sends `rate`/s.

    A closed loop with many connections saturates the server and its latency
    grows with the queue (Little's law); the goal — 2,000 reports/s with p99
    under 100 ms — is a statement about this open-loop case. Every report is
    numbered; after the run every acknowledged number is looked up in the
    database (lost = acknowledged but not stored). The slowest 1 % are split
    into the load generator's lag (due → request written), the server's work
    before ingest (→ `received_at`, stamped when the ingest takes the report)
    and the ingest with its commit and the answer (→ answer read).
    """
    devices_count = 1000
    interval = devices_count / rate
    warmup = 2.0
    lines = list(OFFERED_HEADER)
    results: list[dict[str, Any]] = []
    floor_p99 = float("nan")
    with tempfile.TemporaryDirectory(prefix="trueup-bench-") as tmp:
        workdir = Path(tmp)
        for config in rows or OFFERED_ROWS:
            backend = (
                make_backend(config.backend, workdir, devices_count, config.pg_settings)
                if config.backend is not None
                else None
            )
            servers = start_servers(backend, config.processes, "batch")
            try:
                credentials = (
                    backend.credentials if backend else [f"floor-{i}" for i in range(devices_count)]
                )
                meter = CpuMeter(
                    [process.pid for process, _ in servers],
                    backend.db_name if backend and backend.name == "postgres" else "",
                )
                outcome = run_load(
                    "fleet",
                    ports=[port for _, port in servers],
                    credentials=credentials,
                    interval=interval,
                    seconds=seconds + warmup,
                    connections=128,
                    warmup=warmup,
                )
                cpu = meter.stop()
                stored = backend.stored_markers() if backend else {}
            finally:
                stop_servers(servers)
                if backend:
                    backend.cleanup()
            timed = outcome["timed"]
            if not timed:
                raise RuntimeError(
                    f"{config}: no report was answered 200; the servers refused every one "
                    "(see their log above)"
                )
            latencies = [done - due for _, due, _, done in timed]
            p99 = percentile(latencies, 0.99) * 1000
            if backend is None:
                floor_p99 = p99
            lost = len(set(outcome["acknowledged"]) - set(stored)) if backend else 0
            slowest = sorted(timed, key=lambda t: t[3] - t[1])[-max(1, len(timed) // 100) :]
            lag = sum(sent - due for _, due, sent, _ in slowest) / len(slowest) * 1000
            if backend:
                front = sum(stored.get(n, sent) - sent for n, _, sent, _ in slowest)
                back = sum(done - stored.get(n, sent) for n, _, sent, done in slowest)
                split = (
                    f"{lag:.1f} / {front / len(slowest) * 1000:.1f} / "
                    f"{back / len(slowest) * 1000:.1f}"
                )
            else:
                rest = sum(done - sent for _, _, sent, done in slowest) / len(slowest) * 1000
                split = f"{lag:.1f} / {rest:.1f} (answered at once)"
            reports = max(1, outcome["sent"])
            result = {
                "label": config.label,
                "backend": config.backend,
                "processes": config.processes,
                # Answered before the schedule ended: what the servers kept up with.
                "achieved": sum(1 for t in timed if t[3] <= outcome["end"]) / outcome["seconds"],
                "p50": percentile(latencies, 0.5) * 1000,
                "p99": p99,
                "lost": lost,
                "errors": outcome["errors"],
                "acknowledged": len(outcome["acknowledged"]),
                "cpu": cpu,
                # CPU seconds per report: servers, PostgreSQL, load generator.
                "per_report": (
                    (cpu["loop"] + cpu["threads"]) / reports,
                    cpu["postgres"] / reports if config.backend == "postgres" else 0.0,
                    outcome["cpu"] / reports,
                ),
            }
            results.append(result)
            goal = "" if backend is None else (" ✅" if p99 < 100 and not lost else " ❌")
            acked = len(outcome["acknowledged"])
            lost_text = "—" if backend is None else f"{lost} of {acked}"
            if outcome["errors"]:
                lost_text += f" ({outcome['errors']} errors)"
            pg_cpu = (
                f"{cpu['postgres'] / reports * 1000:.2f}" if config.backend == "postgres" else "—"
            )
            lines.append(
                f"| {config.label} | {config.processes} | {result['achieved']:.0f} | "
                f"{result['p50']:.1f} | {p99:.1f}{goal} | {p99 / floor_p99:.1f} | "
                f"{lost_text} | {split} | {cpu['loop'] / reports * 1000:.2f} + "
                f"{cpu['threads'] / reports * 1000:.2f} / {pg_cpu} / "
                f"{outcome['cpu'] / reports * 1000:.2f} | {cpu['busy'] * 100:.0f} % |"
            )
            print(f"  offered {rate:.0f}/s: {lines[-1]}", file=sys.stderr)
    return lines, results


def fleet_run(backend_name: str, devices_count: int, seconds: float, processes: int) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="trueup-bench-") as tmp:
        backend = make_backend(backend_name, Path(tmp), devices_count)
        servers = start_servers(backend, processes, "batch")
        try:
            outcome = run_load(
                "fleet",
                ports=[port for _, port in servers],
                credentials=backend.credentials,
                interval=30.0,
                seconds=seconds,
                connections=64,
            )
            stored = backend.stored_markers()
        finally:
            stop_servers(servers)
            backend.cleanup()
    latencies = [done - due for _, due, _, done in outcome["timed"]]
    lost = len(set(outcome["acknowledged"]) - set(stored))
    line = (
        f"| {backend_name} | {processes} | {devices_count} | {seconds:.0f} s | {outcome['sent']} | "
        f"{outcome['ok']} | {len(stored)} | {lost} | {percentile(latencies, 0.5) * 1000:.1f} | "
        f"{percentile(latencies, 0.99) * 1000:.1f} |"
    )
    print(
        f"  fleet {backend_name}: sent {outcome['sent']} stored {len(stored)} lost {lost}",
        file=sys.stderr,
    )
    return [line]


def _offered_summary(results: list[dict[str, Any]]) -> list[str]:
    """What the offered-load rows say, in sentences computed from them."""
    by_label = {(r["label"], r["processes"]): r for r in results}
    floor = by_label.get(("HTTP floor (uvicorn, no application)", 1))
    pg2 = by_label.get(("postgres", 2))
    async_pg2 = by_label.get(("postgres, `synchronous_commit=off`", 2))
    lost = sum(r["lost"] for r in results)
    acknowledged = sum(r["acknowledged"] for r in results if r["backend"])
    out = [
        f"Every acknowledged report was looked up in the database after its row: {lost} of "
        f"{acknowledged} missing."
    ]
    if pg2 is not None:
        met = pg2["p99"] < 100
        out.append(
            f"Goal (PostgreSQL, two server processes, p99 < 100 ms): p99 {pg2['p99']:.0f} ms, "
            + ("met." if met else "not met on this machine.")
        )
    if floor is not None:
        out.append(
            f"The HTTP floor (the load generator against uvicorn answering at once, same "
            f"connections and schedule) has p99 {floor['p99']:.1f} ms: that much of every row's "
            "tail is the generator and the HTTP path, not the server's work."
        )
    if pg2 is not None:
        servers, database, generator = pg2["per_report"]
        out.append(
            f"At 2,000 reports/s, PostgreSQL with two processes needs "
            f"{servers * 2000:.2f} CPUs for the servers, {database * 2000:.2f} for PostgreSQL "
            f"and {generator * 2000:.2f} for the load generator: "
            f"{(servers + database + generator) * 2000:.2f} of the machine's {os.cpu_count()} "
            "CPUs before anything else runs; the slowest reports wait mostly before they are "
            "sent (every connection busy, the generator waiting for a CPU), that is in the "
            "queue of a machine without CPU to spare."
        )
    if pg2 is not None and async_pg2 is not None:
        out.append(
            f"With `synchronous_commit=off` (the same two processes) p99 is "
            f"{async_pg2['p99']:.0f} ms against {pg2['p99']:.0f} ms."
        )
    first = results[0]["cpu"] if results else {"load_before": float("nan")}
    last = results[-1]["cpu"] if results else {"load_after": float("nan")}
    out.append(
        f"Load average (1 min) {first['load_before']:.2f} before the first row, "
        f"{last['load_after']:.2f} after the last, on {os.cpu_count()} CPUs."
    )
    return [" ".join(out)]


OFFERED_EXPLAINED = (
    "1,000 simulated devices each reporting every 0.5 s on their own schedule (128 "
    "connections, one load-generator process on the same machine); latency counts from the "
    "moment a report was due, after a 2 s warm-up (connections opened, every device's "
    "credential seen once). Each report carries its number; after each row every "
    "acknowledged number is looked up in `device_reports` (lost = acknowledged, not stored). "
    "The split of the slowest 1 % (mean ms): due → sent is the load generator's lag (it "
    "waits for a CPU, or all connections are busy); sent → received is the server before the "
    "ingest (HTTP, authentication, validation; `received_at` is stamped when the report is "
    "handed to the ingest); received → answered is the ingest queue, the batch's "
    "transaction and commit, and the answer. CPU columns: CPU time of the server processes "
    "(their event-loop thread: HTTP, routing, authentication, validation; + their other "
    "threads: the ingest's writer, and the thread pool), "
    "of PostgreSQL (the database's backends, WAL writer and checkpointer) and of the load "
    "generator, per report sent; machine busy = all CPUs, everything on the machine "
    "included. The floor row is the baseline of the ratio column. Goal: 2,000 reports/s "
    "with p99 < 100 ms."
)

DEPLOYMENT = """\
What a PostgreSQL deployment needs for this tail:

- **CPU for the database next to the servers.** Each report costs the server processes and \
PostgreSQL the CPU in the table above; at 2,000 reports/s that is their sum times 2,000 per \
second of CPU. When the machine is busy near 100 % (the load generator shares it here), \
reports wait for a CPU at every hop and the tail grows with the queue, whatever the \
database. Run PostgreSQL on its own cores (or host) and keep the servers' CPU below about \
70 %.
- **Server processes: one per core available to them, not more.** A server process \
writes reports through one connection (one ingest thread, group commit); a second process \
doubles the connections and transactions but on a shared 2-core machine only adds \
contention. Two processes pay off when they get cores of their own.
- **Pool size.** The ingest holds one connection per process for its transactions; the \
pool (10, overflow 30 per process) serves authentication and the other routes. \
PostgreSQL's `max_connections` must hold 40 per process plus the administration's.
- **`synchronous_commit`.** With `on` (the default), a report is acknowledged after its \
commit record is flushed to disk: a PostgreSQL crash or power loss loses nothing \
acknowledged. With `off`, PostgreSQL acknowledges the commit before the flush (the WAL \
writer flushes within `wal_writer_delay`, 200 ms by default; up to three times that in the worst \
case): the fsync leaves the request path, but a crash of the database host can lose the \
reports acknowledged in that window (the database stays consistent; a server crash alone \
loses nothing). Agents report every heartbeat, so a lost report is replaced by the next \
one; still, the control plane's guarantee (acknowledged = stored) then holds only while \
the database host does not crash. Setting it per database (`ALTER DATABASE … SET \
synchronous_commit = off`) is the deployment's choice; trueup does not set it.
"""


def run(quick: bool, *, fleet_seconds: float | None = None, fleet_devices: int = 10_000) -> str:
    """The control-plane section of docs/benchmarks.md."""
    seconds = 5.0 if quick else 20.0
    offered_seconds = 5.0 if quick else 15.0
    fleet_seconds = fleet_seconds if fleet_seconds is not None else (60.0 if quick else 600.0)
    connections = 64
    print("control plane: report ingest", file=sys.stderr)
    lines, rows = throughput_table(seconds, connections)
    best = max(r["rate"] for r in rows if r["mode"] == "batch")
    print("control plane: offered load", file=sys.stderr)
    offered_lines, offered = offered_rate_table(offered_seconds)
    fleet_lines = []
    for backend_name in ("sqlite", "postgres"):
        fleet_lines += fleet_run(backend_name, fleet_devices, fleet_seconds, 1)
    machine = f"{os.cpu_count()} CPUs"
    out = [
        "## Control plane: agent report ingest",
        "",
        f"Measured on this machine ({machine}), load generator on the same machine. "
        f"{connections} keep-alive connections from simulated agents (1,000 devices) post "
        f"reports as fast as they are answered for {seconds:.0f} s per row (after 1 s warm-up). "
        "`batch` is the server's ingest (reports queued in process, written in one "
        "transaction per batch, each response sent only after that commit); `naive` commits "
        "one transaction per report (the baseline). SQLite runs with `synchronous=FULL` (WAL). "
        '"acknowledged = stored" compares the 200 responses with the rows in the database.',
        "",
        *lines,
        "",
        f"Best batched rate (closed loop, saturated): {best:.0f} reports/s.",
        "",
        "### Offered load: 2,000 reports/s, open loop",
        "",
        f"{OFFERED_EXPLAINED} {offered_seconds:.0f} s measured per row.",
        "",
        *offered_lines,
        "",
        *_offered_summary(offered),
        "",
        DEPLOYMENT,
        f"### Simulated fleet: {fleet_devices} devices, one report each every 30 s",
        "",
        "Open loop (each device reports on its own schedule, retrying until acknowledged); "
        "latency counts from the moment the report was due. Lost = acknowledged reports "
        "missing from the database (each report numbered, every number looked up).",
        "",
        "| database | server processes | devices | held | sent | acknowledged | stored | lost | p50 ms | p99 ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *fleet_lines,
        "",
        "Full run (fleet held 10 minutes, 20 s per throughput row, 15 s per offered-load row): "
        "`.venv/bin/python -m scripts.bench_server --full`; the offered-load table alone: "
        "`.venv/bin/python -m scripts.bench_server --offered-only --full`.",
        "",
    ]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="longer runs; fleet held 600 s")
    parser.add_argument("--fleet-seconds", type=float, default=None)
    parser.add_argument("--fleet-devices", type=int, default=10_000)
    parser.add_argument(
        "--offered-only", action="store_true", help="only the 2,000/s open-loop table"
    )
    args = parser.parse_args()
    if args.offered_only:
        lines, results = offered_rate_table(15.0 if args.full else 5.0)
        print("\n".join([*lines, "", *_offered_summary(results)]))
        return
    print(run(not args.full, fleet_seconds=args.fleet_seconds, fleet_devices=args.fleet_devices))


if __name__ == "__main__":
    main()
