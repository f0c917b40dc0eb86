"""Notification benchmark: reports judged, a fleet scanned, webhooks delivered.

In process, on SQLite and PostgreSQL, for a fleet of 10,000 devices (1,000 quick)
in one tenant with one match-all rule whose target is a webhook receiver on
127.0.0.1 (a small threaded HTTP server answering 204):

1. **Heartbeats judged**: every device reports an unchanged state, evaluated in
   batches of 2,000 as the notifier does (`Engine.observe_batch`): reports/s.
2. **Periodic scan** of the whole fleet with nothing to do: ms per scan.
3. **Transitions**: a tenth of the fleet reports drift: events and deliveries
   stored per second.
4. **Delivery**: the notifier sends those events, signed, to the receiver;
   deliveries/s from the first claim to the last recorded attempt.

`python -m scripts.bench_notify` (quick) or `--full`.
"""

from __future__ import annotations

import argparse
import os
import secrets
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import func, select

from trueup.server.db import Database
from trueup.server.keys import load_or_create_server_key
from trueup.server.service import ControlPlane
from trueup.server.tables import device_state, devices, notify_deliveries

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
CLEAN: dict[str, Any] = {"reason_codes": [], "heartbeat_interval": 30.0}
DRIFT: dict[str, Any] = {
    "reason_codes": ["STATE_DRIFT_DETECTED"],
    "diff_summary": {"subsystems": {"links": 1}},
    "heartbeat_interval": 30.0,
}


class _Sink(BaseHTTPRequestHandler):
    count = 0
    lock = threading.Lock()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with _Sink.lock:
            _Sink.count += 1
        self.send_response(204)
        self.end_headers()

    def log_message(self, *_args: Any) -> None:
        pass


def _fleet(db: Database, tenant_id: int, size: int) -> list[int]:
    now = time.time()
    with db.write() as conn:
        conn.execute(
            devices.insert(),
            [
                {"tenant_id": tenant_id, "name": f"edge-{i:05d}", "created_at": now}
                for i in range(size)
            ],
        )
        ids = [int(i) for i in conn.execute(select(devices.c.id).order_by(devices.c.id)).scalars()]
        conn.execute(
            device_state.insert(),
            [
                {
                    "device_id": device_id,
                    "last_report_at": now,
                    "reason_codes": "[]",
                    "report": "{}",
                    "heartbeat_interval": 30.0,
                }
                for device_id in ids
            ],
        )
    return ids


def _run(backend: str, url: str, tmp: Path, size: int) -> dict[str, float]:
    sink = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    db = Database(url)
    try:
        db.migrate()
        plane = ControlPlane(
            db,
            load_or_create_server_key(tmp / f"{backend}.key"),
            notify={"poll_seconds": 0.01, "scan_seconds": 3600.0},
        )
        tenant_id = plane.create_tenant("bench", "bench")
        hook = f"http://127.0.0.1:{sink.server_address[1]}/hook"
        # The receiver is on loopback: an internal receiver the tenant allowlists.
        plane.set_notify_allowlist(tenant_id, ["127.0.0.1/32"], "bench")
        plane.create_notify_target(tenant_id, "sink", hook, secrets.token_hex(16), "bench")
        plane.create_notify_rule(tenant_id, "all", "sink", {}, None, "bench")
        ids = _fleet(db, tenant_id, size)
        engine = plane.notify_engine
        base = time.time()
        for chunk in range(0, size, 2000):  # first sight: every device gets its row
            engine.observe_batch([(i, CLEAN, base) for i in ids[chunk : chunk + 2000]])
        started = time.perf_counter()
        for chunk in range(0, size, 2000):
            engine.observe_batch([(i, CLEAN, base + 1) for i in ids[chunk : chunk + 2000]])
        heartbeats = size / (time.perf_counter() - started)
        started = time.perf_counter()
        engine.scan(now=base + 1)
        scan_ms = (time.perf_counter() - started) * 1000
        drifting = ids[: max(1, size // 10)]
        started = time.perf_counter()
        engine.observe_batch([(i, DRIFT, base + 2) for i in drifting])
        transitions = len(drifting) / (time.perf_counter() - started)
        started = time.perf_counter()
        plane.notifier.start()
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            with db.read() as conn:
                left = conn.execute(
                    select(func.count())
                    .select_from(notify_deliveries)
                    .where(notify_deliveries.c.state == "pending")
                ).scalar_one()
            if left == 0:
                break
            time.sleep(0.05)
        delivered = len(drifting) / (time.perf_counter() - started)
        plane.notifier.stop()
        assert _Sink.count >= len(drifting), (_Sink.count, len(drifting))
        _Sink.count = 0
        return {
            "heartbeats": heartbeats,
            "scan_ms": scan_ms,
            "transitions": transitions,
            "delivered": delivered,
            "events": float(len(drifting)),
        }
    finally:
        db.dispose()
        sink.shutdown()
        sink.server_close()


def run(quick: bool) -> str:
    size = 1_000 if quick else 10_000
    rows = []
    with tempfile.TemporaryDirectory(prefix="trueup-bench-notify-") as tmp:
        for backend in ("sqlite", "postgres"):
            if backend == "sqlite":
                url = f"sqlite:///{tmp}/server.db"
                figures = _run(backend, url, Path(tmp), size)
            else:
                name = f"trueup_bench_notify_{os.getpid()}"
                with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
                    conn.execute(f'CREATE DATABASE "{name}"')
                try:
                    url = f"postgresql://postgres@127.0.0.1:5432/{name}"
                    figures = _run(backend, url, Path(tmp), size)
                finally:
                    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
                        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            rows.append(
                f"| {backend} | {size:,} | {figures['heartbeats']:,.0f} | {figures['scan_ms']:,.0f} "
                f"| {figures['transitions']:,.0f} | {figures['events']:,.0f} "
                f"| {figures['delivered']:,.0f} |"
            )
    return "\n".join(
        [
            "## Notifications",
            "",
            f"In process, one tenant of {size:,} devices, one match-all rule, a webhook "
            "receiver on 127.0.0.1 (`scripts/bench_notify.py`). Heartbeats: unchanged "
            "reports judged in batches of 2,000 (no event). Scan: the periodic pass over "
            "the whole fleet with nothing to do. Transitions: a tenth of the fleet reports "
            "drift (events and deliveries stored). Delivered: those events signed and "
            "sent by the notifier (4 concurrent requests).",
            "",
            "| database | devices | heartbeats judged/s | scan (ms) | transitions/s "
            "| events | delivered/s |",
            "|---|---:|---:|---:|---:|---:|---:|",
            *rows,
            "",
        ]
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--full", action="store_true")
    print(run(quick=not parser.parse_args().full))
