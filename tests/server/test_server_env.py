"""`trueup server run` configured from the environment alone, as in a container:
a key on a read-only mount, a separate writable data directory, no key creation."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from typer.testing import CliRunner

from tests.server.conftest import free_port
from trueup.cli.server import server_app
from trueup.server.anchor import SUFFIX
from trueup.server.keys import MissingServerKey, load_or_create_server_key

CLI = [sys.executable, "-m", "trueup.cli", "server"]


def env_only(**values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRUEUP_SERVER_")}
    return env | values


@contextmanager
def read_only_key(tmp_path: Path) -> Iterator[Path]:
    """A key on a read-only mount, as a Kubernetes or podman secret is (a bind mount
    remounted read-only: file modes alone do not stop root)."""
    secret = tmp_path / "secret"
    secret.mkdir()
    key = secret / "server.key"
    key.write_text("ab" * 32 + "\n")
    key.chmod(0o400)
    subprocess.run(["mount", "--bind", str(secret), str(secret)], check=True)
    try:
        subprocess.run(
            ["mount", "-o", "remount,ro,bind", str(secret)], check=True, capture_output=True
        )
        assert not os.access(secret, os.W_OK), f"{secret} is still writable"
        yield key
    finally:
        subprocess.run(["umount", str(secret)], check=True)


def test_a_missing_key_is_refused_when_creation_is_off_and_nothing_is_created(
    tmp_path: Path,
) -> None:
    key = tmp_path / "keys" / "server.key"
    try:
        load_or_create_server_key(key, create=False)
    except MissingServerKey as exc:
        assert str(key) in str(exc) and "openssl rand -hex 32" in str(exc)
    else:
        raise AssertionError("a missing key was not refused")
    assert not key.parent.exists()
    result = CliRunner().invoke(
        server_app,
        ["run", "--listen", f"127.0.0.1:{free_port()}"],
        env={
            "TRUEUP_SERVER_DB": f"sqlite:///{tmp_path}/server.db",
            "TRUEUP_SERVER_KEY_FILE": str(key),
            "TRUEUP_SERVER_CREATE_KEY": "false",
        },
    )
    assert result.exit_code == 1, result.output
    assert f"server key {key}: no such file" in result.output
    assert not (tmp_path / "server.db").exists() and not key.exists()


def test_a_read_only_key_needs_a_writable_data_directory(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/server.db"
    with read_only_key(tmp_path) as key:
        no_data_dir = CliRunner().invoke(
            server_app, ["run", "--db", db, "--key-file", str(key), "--listen", "127.0.0.1:1"]
        )
        assert no_data_dir.exit_code == 1, no_data_dir.output
        assert "not writable" in no_data_dir.output
        assert "TRUEUP_SERVER_DATA_DIR" in no_data_dir.output
        not_a_dir = CliRunner().invoke(
            server_app,
            ["run", "--db", db, "--key-file", str(key), "--data-dir", str(tmp_path / "nope")],
        )
        assert not_a_dir.exit_code == 1 and "not a directory" in not_a_dir.output
        bad_flag = CliRunner().invoke(
            server_app,
            ["tenant", "create", "acme", "--db", db, "--key-file", str(key)],
            env={"TRUEUP_SERVER_CREATE_KEY": "maybe"},
        )
        assert bad_flag.exit_code == 1 and "TRUEUP_SERVER_CREATE_KEY=maybe" in bad_flag.output
        assert not (tmp_path / "server.db").exists()


def test_server_runs_from_the_environment_with_the_checkpoint_in_the_data_directory(
    tmp_path: Path,
) -> None:
    with read_only_key(tmp_path) as key:
        run_from_environment(tmp_path, key)


def run_from_environment(tmp_path: Path, key: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    port = free_port()
    env = env_only(
        TRUEUP_SERVER_DB=f"sqlite:///{tmp_path}/server.db",
        TRUEUP_SERVER_KEY_FILE=str(key),
        TRUEUP_SERVER_DATA_DIR=str(data),
        TRUEUP_SERVER_CREATE_KEY="false",
        TRUEUP_SERVER_LISTEN=f"127.0.0.1:{port}",
        TRUEUP_SERVER_PUBLIC_URL="https://trueup.example.net",
    )
    # Administration inside the container reads the same variables.
    created = subprocess.run(
        [*CLI, "tenant", "create", "acme"], env=env, capture_output=True, text=True
    )
    assert created.returncode == 0, created.stderr
    token = subprocess.run(
        [*CLI, "token", "create", "--tenant", "acme", "--user", "ops", "--role", "admin"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    checkpoint = data / (key.name + SUFFIX)
    assert checkpoint.exists() and not (key.parent / (key.name + SUFFIX)).exists()
    assert stat.S_IMODE(checkpoint.stat().st_mode) == 0o600
    process = subprocess.Popen([*CLI, "run"], env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert process.poll() is None, "the server exited"
            assert time.monotonic() < deadline, "/readyz never answered 200"
            time.sleep(0.1)
        auth = {"Authorization": f"Bearer {token}"}
        assert httpx.get(url + "/api/v1/devices", timeout=5).status_code == 401
        created = httpx.post(
            url + "/api/v1/devices", json={"name": "edge-01"}, headers=auth, timeout=10
        )
        assert created.status_code == 201, created.text
        enrolled = httpx.post(url + "/api/v1/devices/edge-01/enrollment", headers=auth, timeout=10)
        assert enrolled.status_code == 201, enrolled.text
        # Enrollment bundles carry the public URL from the environment.
        assert "https://trueup.example.net" in enrolled.text
    finally:
        process.terminate()
        assert process.wait(20) is not None
    verified = subprocess.run([*CLI, "audit", "verify"], env=env, capture_output=True, text=True)
    assert verified.returncode == 0, verified.stdout + verified.stderr
