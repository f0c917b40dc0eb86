"""Fixtures for the control-plane tests: every API test runs on SQLite and on PostgreSQL.

PostgreSQL is the local server on 127.0.0.1:5432 (trust auth, user postgres);
each run creates and drops its own uniquely named databases. A missing
PostgreSQL fails these tests: it is never skipped.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from fastapi.testclient import TestClient

from trueup.server.app import SETTINGS_ENV, Settings, create_app
from trueup.server.service import ControlPlane
from trueup.server.tokens import Role

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
BACKENDS = ["sqlite", "postgres"]


def create_pg_database() -> str:
    name = f"trueup_test_{os.getpid()}_{secrets.token_hex(4)}"
    try:
        with psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.OperationalError as exc:
        pytest.fail(
            f"PostgreSQL on 127.0.0.1:5432 is required for the control-plane tests: {exc}",
            pytrace=False,
        )
    return name


def drop_pg_database(name: str) -> None:
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def document(device: str, *, address: str = "198.51.100.2/24", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "trueup/v1",
        "kind": "DeviceState",
        "metadata": {"device": device},
        "spec": {
            "management": {"interface": "mgmt0", "addresses": [address]},
            **spec,
        },
    }


@dataclass
class Tenant:
    name: str
    tokens: dict[str, str]
    devices: dict[str, str] = field(default_factory=dict)  # device -> credential

    def auth(self, role: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[role]}"}

    def device_auth(self, device: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.devices[device]}"}


@dataclass
class Server:
    backend: str
    url: str
    client: TestClient
    plane: ControlPlane
    key_file: Path

    def tenant(self, prefix: str = "t", devices: tuple[str, ...] = ()) -> Tenant:
        name = f"{prefix}-{secrets.token_hex(3)}"
        tenant_id = self.plane.create_tenant(name, "test")
        tokens = {}
        for role in Role:
            self.plane.create_user(tenant_id, f"{role.value}-user", role, "test")
            tokens[role.value] = self.plane.create_token(tenant_id, f"{role.value}-user", "test")[1]
        tenant = Tenant(name, tokens)
        for device in devices:
            self.enroll(tenant, device)
        return tenant

    def enroll(self, tenant: Tenant, device: str) -> str:
        bundle = self.plane.enroll(
            self.plane.tenant_id(tenant.name), device, "test", url="http://testserver"
        )
        response = self.client.post(
            "/api/v1/agent/enroll", headers={"Authorization": f"Bearer {bundle['token']}"}
        )
        assert response.status_code == 200, response.text
        tenant.devices[device] = response.json()["credential"]
        return tenant.devices[device]


def _server(backend: str, db_url: str, key_file: Path, **extra: Any) -> Iterator[Server]:
    settings = Settings(
        db_url=db_url,
        key_file=str(key_file),
        public_url="http://testserver",
        revision_poll_seconds=0.1,
        auth_cache_seconds=0.0,
        **extra,
    )
    app = create_app(settings)
    with TestClient(app) as client:
        yield Server(backend, db_url, client, app.state.plane, key_file)


@pytest.fixture(scope="session", params=BACKENDS)
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """One in-process server per backend, shared by the API tests (tenants keep them apart)."""
    backend = request.param
    tmp = tmp_path_factory.mktemp(f"server-{backend}")
    if backend == "sqlite":
        yield from _server(backend, f"sqlite:///{tmp}/server.db", tmp / "server.key")
        return
    name = create_pg_database()
    try:
        yield from _server(
            backend, f"postgresql://postgres@127.0.0.1:5432/{name}", tmp / "server.key"
        )
    finally:
        drop_pg_database(name)


@pytest.fixture
def isolated_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Server]:
    """A server on a database of its own (for tests that tamper with the database).

    `request.param` is the backend, or (backend, {Settings field: value})."""
    backend, extra = request.param if isinstance(request.param, tuple) else (request.param, {})
    if backend == "sqlite":
        yield from _server(
            backend, f"sqlite:///{tmp_path}/server.db", tmp_path / "server.key", **extra
        )
        return
    name = create_pg_database()
    try:
        yield from _server(
            backend,
            f"postgresql://postgres@127.0.0.1:5432/{name}",
            tmp_path / "server.key",
            **extra,
        )
    finally:
        drop_pg_database(name)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    """A real `uvicorn` control-plane process on 127.0.0.1."""

    def __init__(
        self,
        db_url: str,
        key_file: Path,
        port: int | None = None,
        log_path: Path | None = None,
        **settings: Any,
    ) -> None:
        self.log_path = log_path  # the process's stderr is appended here (default: inherited)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.settings = Settings(
            db_url=db_url, key_file=str(key_file), public_url=self.url, **settings
        )
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> ServerProcess:
        env = {**os.environ, SETTINGS_ENV: self.settings.to_env()}
        log = None if self.log_path is None else self.log_path.open("ab")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "--factory",
                "trueup.server.app:create_app_from_env",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--log-level",
                "warning",
                "--loop",
                "uvloop",
                "--http",
                "httptools",
            ],
            env=env,
            stderr=log,
        )
        if log is not None:
            log.close()  # the child holds its own descriptor
        deadline = time.monotonic() + 180  # generous: a loaded host imports slowly
        while time.monotonic() < deadline:
            assert self.process.poll() is None, "server process exited during start-up"
            try:
                if httpx.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"server on {self.url} did not become ready")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self.process = None
