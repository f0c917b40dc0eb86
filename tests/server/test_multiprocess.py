"""Several real server processes (uvicorn) sharing one database."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.conftest import ServerProcess, create_pg_database, document, drop_pg_database
from trueup.server.db import Database
from trueup.server.keys import load_or_create_server_key
from trueup.server.service import ControlPlane
from trueup.server.tokens import Role


@pytest.fixture
def shared_postgres(tmp_path: Path):
    name = create_pg_database()
    url = f"postgresql://postgres@127.0.0.1:5432/{name}"
    key_file = tmp_path / "server.key"
    database = Database(url)
    database.migrate()
    plane = ControlPlane(database, load_or_create_server_key(key_file))
    servers = [
        ServerProcess(url, key_file, revision_poll_seconds=0.2),
        ServerProcess(url, key_file, revision_poll_seconds=0.2),
    ]
    try:
        for server in servers:
            server.start()
        yield plane, servers
    finally:
        for server in servers:
            server.stop()
        database.dispose()
        drop_pg_database(name)


def attempt(
    url: str, token: str, expected: int, barrier: threading.Barrier, i: int
) -> tuple[int, dict[str, Any]]:
    body = document("edge-01", address=f"198.51.100.{10 + i}/24")
    with httpx.Client(timeout=30) as client:
        barrier.wait()
        response = client.put(
            f"{url}/api/v1/devices/edge-01/desired",
            json=body,
            headers={"Authorization": f"Bearer {token}", "If-Match": str(expected)},
        )
    return response.status_code, response.json()


def test_concurrent_puts_with_the_same_if_match_one_wins(shared_postgres) -> None:
    plane, servers = shared_postgres
    tenant_id = plane.create_tenant("acme", "test")
    plane.create_user(tenant_id, "ops", Role.OPERATOR, "test")
    plane.create_device(tenant_id, "edge-01", "test")
    token = plane.create_token(tenant_id, "ops", "test")[1]
    writers = 16
    urls = [servers[i % 2].url for i in range(writers)]
    for expected in range(3):
        barrier = threading.Barrier(writers)
        with ThreadPoolExecutor(writers) as pool:
            results = list(
                pool.map(
                    attempt,
                    urls,
                    [token] * writers,
                    [expected] * writers,
                    [barrier] * writers,
                    range(writers),
                )
            )
        statuses = [status for status, _ in results]
        assert sorted(statuses) == [201] + [409] * (writers - 1), statuses
        refused = [body for status, body in results if status == 409]
        assert all(b["reason"] == "STATE_CONCURRENT_MODIFICATION" for b in refused)
        assert all(b["current_version"] == expected + 1 for b in refused)
    revisions = plane.revisions(tenant_id, "edge-01")
    assert [r.version for r in revisions] == [1, 2, 3]
    assert [r.parent_version for r in revisions] == [None, 1, 2]
    assert plane.verify_audit() == []


def test_long_poll_on_one_process_wakes_for_a_revision_made_on_the_other(
    shared_postgres,
) -> None:
    plane, servers = shared_postgres
    tenant_id = plane.create_tenant("acme", "test")
    plane.create_user(tenant_id, "ops", Role.OPERATOR, "test")
    token = plane.create_token(tenant_id, "ops", "test")[1]
    bundle = plane.enroll(tenant_id, "edge-01", "test", url=servers[1].url)
    credential = httpx.post(
        servers[1].url + "/api/v1/agent/enroll",
        headers={"Authorization": f"Bearer {bundle['token']}"},
    ).json()["credential"]
    result: dict[str, float | int] = {}

    def poll() -> None:
        started = time.monotonic()
        response = httpx.get(
            servers[1].url + "/api/v1/agent/desired",
            params={"after": 0, "wait": 20},
            headers={"Authorization": f"Bearer {credential}"},
            timeout=30,
        )
        result["status"] = response.status_code
        result["elapsed"] = time.monotonic() - started

    waiter = threading.Thread(target=poll)
    waiter.start()
    time.sleep(0.5)
    created = httpx.put(
        servers[0].url + "/api/v1/devices/edge-01/desired",
        json=document("edge-01"),
        headers={"Authorization": f"Bearer {token}", "If-Match": "0"},
    )
    assert created.status_code == 201
    waiter.join(25)
    assert result["status"] == 200
    assert result["elapsed"] < 3
