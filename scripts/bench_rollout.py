"""Rollout benchmark: 10,000 simulated devices (1,000 quick) in 4 waves, on SQLite and
PostgreSQL, in process.

1. **Baseline**: the raw insert of one revision per device (`insert_revision`, 500 to a
   transaction, the batch a rollout sends in): CPU and wall time per device.
2. **Rollout**: a change to every device published as a rollout of 4 waves (10 canaries,
   then 10 %, 50 % and 100 % of the rest; max_unavailable 100 %, no soak). The controller
   ticks in this thread (`RolloutController.step`); after each tick every device it sent
   reports the revision applied at once, through report ingest's batched writer (the
   path `POST /api/v1/agent/report` takes, without HTTP). Measured: the controller's CPU
   (this thread's) per device transition (sent, passed), and the wall time from publish
   to completed, agents' reports included.

The controller's CPU on PostgreSQL excludes the database server's own.
`python -m scripts.bench_rollout` (quick) or `--full`.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import select

from trueup.model.document import document_digest, parse_document
from trueup.model.layering import Provenance
from trueup.server.db import Database
from trueup.server.ingest import PendingReport, ReportIngest
from trueup.server.keys import load_or_create_server_key
from trueup.server.service import ControlPlane
from trueup.server.service.fleettypes import Plan, Target
from trueup.server.tables import devices, rollout_members

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
BATCH = 500


def _document(device: str, mtu: int | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"management": {"interface": "mgmt0", "addresses": ["198.51.100.2/24"]}}
    if mtu is not None:
        spec["interfaces"] = [
            {"name": "lan0", "state": "up", "mtu": mtu, "addresses": ["203.0.113.1/24"]}
        ]
    return {
        "apiVersion": "trueup/v1",
        "kind": "DeviceState",
        "metadata": {"device": device},
        "spec": spec,
    }


def _report(version: int, digest: str) -> dict[str, Any]:
    return {
        "applied_version": version,
        "applied_digest": digest,
        "applied_origin": "control-plane",
        "management_ready": True,
        "reason_codes": [],
        "heartbeat_interval": 30.0,
        "journal": {"last": {"version": version, "state": "commit", "outcome": "committed"}},
    }


def _run(url: str, key: Path, size: int) -> dict[str, Any]:
    db = Database(url)
    try:
        db.migrate()
        plane = ControlPlane(db, load_or_create_server_key(key))
        ingest = ReportIngest(db)
        tenant_id = plane.create_tenant("bench", "bench")
        now = time.time()
        names = [f"edge-{i:05d}" for i in range(size)]
        with db.write() as conn:
            conn.execute(
                devices.insert(),
                [{"tenant_id": tenant_id, "name": n, "created_at": now} for n in names],
            )
            ids = dict(
                conn.execute(select(devices.c.name, devices.c.id).order_by(devices.c.id)).all()
            )
        first = {n: parse_document(_document(n, None)) for n in names}
        # Baseline: the raw insert of one revision per device, in the rollout's batches.
        cpu, wall = time.thread_time(), time.perf_counter()
        for start in range(0, size, BATCH):
            with plane.desired_revisions.store.write() as conn:
                for name in names[start : start + BATCH]:
                    plane.desired_revisions.insert_revision(
                        conn,
                        tenant_id=tenant_id,
                        device_id=int(ids[name]),
                        device=name,
                        expected_version=0,
                        document=first[name],
                        author="bench",
                    )
        base_cpu, base_wall = time.thread_time() - cpu, time.perf_counter() - wall
        ingest.write_batch(
            [
                PendingReport(int(ids[n]), time.time(), _report(1, document_digest(first[n])))
                for n in names
            ]
        )
        targets = []
        digests: dict[int, str] = {}
        for name in names:
            body = parse_document(_document(name, 1400))
            digest = document_digest(body)
            digests[int(ids[name])] = digest
            targets.append(
                Target(
                    device_id=int(ids[name]),
                    device=name,
                    from_version=1,
                    document=body.canonical(),
                    digest=digest,
                    provenance=Provenance(profiles=(), variables_digest="", own_digest=None),
                    changes=(),
                )
            )
        controller = plane.rollout_controller
        wall = time.perf_counter()
        rollout = plane.start_rollout(
            tenant_id,
            Plan(targets=tuple(targets), refused=(), unchanged=0),
            waves=[{"devices": names[:10]}, {"percent": 10}, {"percent": 50}, {"percent": 100}],
            max_unavailable="100%",
            actor="bench",
        )
        start_wall = time.perf_counter() - wall
        rollout_id = int(rollout["id"])
        control_cpu, transitions, ticks = 0.0, 0, 0
        reported: set[int] = set()
        deadline = time.monotonic() + 3600
        while plane.rollout_unit.get(tenant_id, rollout_id)["state"] != "completed":
            assert time.monotonic() < deadline, "the rollout did not complete within an hour"
            cpu = time.thread_time()
            stats = controller.step()
            control_cpu += time.thread_time() - cpu
            transitions += stats.transitions
            ticks += 1
            with db.read() as conn:
                sent = [
                    (int(r.device_id), int(r.sent_version))
                    for r in conn.execute(
                        select(rollout_members.c.device_id, rollout_members.c.sent_version).where(
                            (rollout_members.c.rollout_id == rollout_id)
                            & (rollout_members.c.state == "sent")
                        )
                    )
                    if int(r.device_id) not in reported
                ]
            for chunk in range(0, len(sent), 2000):  # the agents report at once
                ingest.write_isolated(
                    [
                        PendingReport(d, time.time(), _report(v, digests[d]))
                        for d, v in sent[chunk : chunk + 2000]
                    ]
                )
            reported.update(d for d, _ in sent)
        total_wall = time.perf_counter() - wall
        view = plane.rollout_unit.get(tenant_id, rollout_id)
        assert all(m["state"] == "passed" for m in view["members"]), "a device did not pass"
        assert view["waves"][0]["members"] == 10
        return {
            "base_cpu_ms": base_cpu / size * 1000,
            "base_wall_ms": base_wall / size * 1000,
            "start_s": start_wall,
            "control_cpu_ms": control_cpu / max(1, transitions) * 1000,
            "transitions": float(transitions),
            "ticks": float(ticks),
            "wall_s": total_wall,
            "waves": float(len(view["waves"])),
            "sizes": json.dumps([w["members"] for w in view["waves"]]),
        }
    finally:
        db.dispose()


def run(quick: bool) -> str:
    size = 1_000 if quick else 10_000
    rows = []
    with tempfile.TemporaryDirectory(prefix="trueup-bench-rollout-") as tmp:
        for backend in ("sqlite", "postgres"):
            if backend == "sqlite":
                figures = _run(f"sqlite:///{tmp}/server.db", Path(tmp) / "sqlite.key", size)
            else:
                name = f"trueup_bench_rollout_{os.getpid()}"
                with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
                    conn.execute(f'CREATE DATABASE "{name}"')
                try:
                    figures = _run(
                        f"postgresql://postgres@127.0.0.1:5432/{name}", Path(tmp) / "pg.key", size
                    )
                finally:
                    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
                        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            ratio = figures["control_cpu_ms"] / figures["base_cpu_ms"]
            rows.append(
                f"| {backend} | {size:,} | {figures['sizes']} | {figures['base_cpu_ms']:.2f} "
                f"| {figures['base_wall_ms']:.2f} | {figures['transitions']:,.0f} "
                f"| {figures['control_cpu_ms']:.2f} | {ratio:.1f}x | {figures['start_s']:.1f} "
                f"| {figures['wall_s']:.1f} | {figures['ticks']:.0f} |"
            )
    return "\n".join(
        [
            "## Rollouts",
            "",
            f"In process, {size:,} simulated devices in one tenant (`scripts/bench_rollout.py`). "
            "Baseline: the raw insert of one revision per device (`insert_revision`, 500 to a "
            "transaction, audited). Rollout: a change to every device in 4 waves (10 canaries, "
            "then 10 %, 50 % and 100 % of the rest; max_unavailable 100 %, no soak), the "
            "controller ticking in the benchmark's thread and every device it sent reporting "
            "the revision applied at once through report ingest's batched writer. Transitions: "
            "each device sent, then passed. Controller CPU is this thread's (on PostgreSQL "
            "without the database server's); wall time is publish to completed, the agents' "
            "reports included.",
            "",
            "| database | devices | wave sizes | baseline CPU/revision (ms) | baseline wall/"
            "revision (ms) | transitions | controller CPU/transition (ms) | vs baseline "
            "| publish (s) | publish → complete (s) | ticks |",
            "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
            *rows,
            "",
        ]
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--full", action="store_true")
    print(run(quick=not parser.parse_args().full))
