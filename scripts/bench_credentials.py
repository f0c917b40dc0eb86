"""Credential benchmark: what deciding a token from the verified audit chain costs.

In process, on SQLite and PostgreSQL, a tenant with N tokens (2,000 quick,
10,000 full), one in five revoked: about 1.2 N audit rows.

1. **First walk**: a fresh process's first authentication verifies every row
   (HMAC, seq, link) and replays it. Baseline in the same run: reading the same
   rows and computing each row's HMAC, nothing else (what any verification of
   the chain must at least do).
2. **Uncached authentication** (`auth_cache_seconds=0`: every call reads the
   database and walks the rows appended since the previous call — none):
   µs per call. Baseline: the bare token lookup (one SELECT by hash).
3. **Cached authentication** (the default 2 s cache): µs per call.
4. **After one new audit row**: the next uncached authentication walks one row.

`python -m scripts.bench_credentials` (quick) or `--full`.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import select

from trueup.server.auditchain import entry_hash
from trueup.server.db import Database
from trueup.server.keys import ServerKey, load_or_create_server_key
from trueup.server.service import ControlPlane
from trueup.server.tables import audit_log, tokens
from trueup.server.tokens import Role, hash_token

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


def _floor_walk(db: Database, key: ServerKey) -> float:
    """Seconds to read every audit row and compute its HMAC."""
    derived = key.derive("audit")
    started = time.perf_counter()
    with db.read() as conn:
        rows = list(conn.execute(select(audit_log).order_by(audit_log.c.seq)).mappings())
    for row in rows:
        entry_hash(derived, row)
    return time.perf_counter() - started


def _per_call(work: Any, calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        work()
    return (time.perf_counter() - started) / calls * 1e6


def _run(url: str, key_file: Path, size: int, calls: int) -> dict[str, float]:
    db = Database(url)
    db.migrate()
    key = load_or_create_server_key(key_file)
    plane = ControlPlane(db, key, auth_cache_seconds=0.0)
    tenant_id = plane.create_tenant("bench", "bench")
    plane.create_user(tenant_id, "ops", Role.OPERATOR, "bench")
    kept = ""
    for index in range(size):
        token_id, token = plane.create_token(tenant_id, "ops", "bench", label=f"t{index}")
        if index % 5 == 4:
            plane.revoke_token(tenant_id, token_id, "bench")
        else:
            kept = token
    with db.read() as conn:
        audit_rows = len(list(conn.execute(select(audit_log.c.seq))))
    floor = min(_floor_walk(db, key) for _ in range(3))
    firsts = []
    for _ in range(3):
        fresh = ControlPlane(db, key, auth_cache_seconds=0.0)
        started = time.perf_counter()
        fresh.authenticate(kept)
        firsts.append(time.perf_counter() - started)
    first = min(firsts)
    uncached = ControlPlane(db, key, auth_cache_seconds=0.0)
    uncached.authenticate(kept)
    uncached_us = _per_call(lambda: uncached.authenticate(kept), calls)
    token_hash = hash_token(kept)

    def lookup() -> None:
        with db.read() as conn:
            conn.execute(select(tokens).where(tokens.c.token_hash == token_hash)).one()

    lookup_us = _per_call(lookup, calls)
    cached = ControlPlane(db, key)
    cached.authenticate(kept)
    cached_us = _per_call(lambda: cached.authenticate(kept), calls)
    after_row = []
    for index in range(20):
        plane.create_token(tenant_id, "ops", "bench", label=f"late{index}")
        started = time.perf_counter()
        uncached.authenticate(kept)
        after_row.append(time.perf_counter() - started)
    db.dispose()
    return {
        "rows": audit_rows,
        "first_ms": first * 1e3,
        "floor_ms": floor * 1e3,
        "uncached_us": uncached_us,
        "lookup_us": lookup_us,
        "cached_us": cached_us,
        "after_row_us": sorted(after_row)[len(after_row) // 2] * 1e6,
    }


def run(quick: bool) -> str:
    size = 2_000 if quick else 10_000
    calls = 300 if quick else 2_000
    rows = []
    with tempfile.TemporaryDirectory(prefix="trueup-bench-creds-") as tmp:
        for backend in ("sqlite", "postgres"):
            key_file = Path(tmp) / f"{backend}.key"
            if backend == "sqlite":
                figures = _run(f"sqlite:///{tmp}/server.db", key_file, size, calls)
            else:
                name = f"trueup_bench_creds_{os.getpid()}"
                with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
                    conn.execute(f'CREATE DATABASE "{name}"')
                try:
                    url = f"postgresql://postgres@127.0.0.1:5432/{name}"
                    figures = _run(url, key_file, size, calls)
                finally:
                    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
                        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            f = figures
            rows.append(
                f"| {backend} | {f['rows']:,.0f} | {f['first_ms']:,.0f} | {f['floor_ms']:,.0f} "
                f"| {f['first_ms'] / f['floor_ms']:.1f} | {f['uncached_us']:,.0f} "
                f"| {f['lookup_us']:,.0f} | {f['uncached_us'] / f['lookup_us']:.1f} "
                f"| {f['after_row_us']:,.0f} | {f['cached_us']:,.1f} |"
            )
    load = os.getloadavg()[0]
    return "\n".join(
        [
            "## Credentials from the verified audit chain",
            "",
            f"In process, a tenant with {size:,} tokens, one in five revoked. *First walk*: a "
            "fresh process's first authentication, which verifies every audit row (HMAC, seq, "
            "link) and replays it; *floor*: reading the same rows and computing each HMAC, "
            "nothing else. *Uncached*: every call reads the database and walks the rows "
            "appended since the previous call (none); *lookup*: the bare token SELECT by hash. "
            "*After a write*: the median uncached call right after one new audit row. "
            f"*Cached*: the default 2 s cache. {calls:,} calls per figure; load average "
            f"{load:.1f} at the end.",
            "",
            "| database | audit rows | first walk ms | floor ms | ratio | uncached µs "
            "| lookup µs | ratio | after a write µs | cached µs |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            *rows,
            "",
            "Measured by `.venv/bin/python -m scripts.bench_credentials` "
            f"({'quick' if quick else '--full'}).",
            "",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--full", action="store_true")
    print(run(quick=not parser.parse_args().full))


if __name__ == "__main__":
    main()
