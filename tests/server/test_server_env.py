"""`trueup server run` configured from the environment alone, as in a container:
a key on a read-only mount, a separate writable data directory, no key creation."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
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


def read_only_key(tmp_path: Path) -> Path:
    secret = tmp_path / "secret"
    secret.mkdir()
    key = secret / "server.key"
    key.write_text("ab" * 32 + "\n")
    key.chmod(0o400)
    secret.chmod(0o555)
    return key


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
    key = read_only_key(tmp_path)
    db = f"sqlite:///{tmp_path}/server.db"
    try:
        # The key's directory read-only as a Secret mount is: root ignores a 0555 mode,
        # so as root the directory is bind-mounted read-only in a mount namespace.
        argv = [*CLI, "run", "--db", db, "--key-file", str(key)]
        argv += ["--listen", f"127.0.0.1:{free_port()}"]
        if os.geteuid() == 0:
            mount = f'mount --bind -o ro {key.parent} {key.parent} && exec "$@"'
            argv = ["unshare", "--mount", "sh", "-c", mount, "sh", *argv]
        # A timeout, not a hang, should the check ever let the server start.
        no_data_dir = subprocess.run(
            argv, env=env_only(), capture_output=True, text=True, timeout=120
        )
        assert no_data_dir.returncode == 1, no_data_dir.stderr
        assert "not writable" in no_data_dir.stderr, no_data_dir.stderr
        assert "TRUEUP_SERVER_DATA_DIR" in no_data_dir.stderr, no_data_dir.stderr
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
    finally:
        key.parent.chmod(0o755)


def test_server_runs_from_the_environment_with_the_checkpoint_in_the_data_directory(
    tmp_path: Path,
) -> None:
    key = read_only_key(tmp_path)
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
    try:
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
            enrolled = httpx.post(
                url + "/api/v1/devices/edge-01/enrollment", headers=auth, timeout=10
            )
            assert enrolled.status_code == 201, enrolled.text
            # Enrollment bundles carry the public URL from the environment.
            assert "https://trueup.example.net" in enrolled.text
        finally:
            process.terminate()
            assert process.wait(20) is not None
        verified = subprocess.run(
            [*CLI, "audit", "verify"], env=env, capture_output=True, text=True
        )
        assert verified.returncode == 0, verified.stdout + verified.stderr
    finally:
        key.parent.chmod(0o755)


def test_the_database_url_can_come_from_a_file(tmp_path: Path) -> None:
    """TRUEUP_SERVER_DB_FILE: the URL (which may hold a password) from a mounted Secret,
    not from the container's configuration; --db and TRUEUP_SERVER_DB still win."""
    key = tmp_path / "server.key"
    key.write_text("cd" * 32 + "\n")
    url_file = tmp_path / "db-url"
    url_file.write_text(f"sqlite:///{tmp_path}/from-file.db\n")
    base = {
        "TRUEUP_SERVER_DB": None,
        "TRUEUP_SERVER_KEY_FILE": str(key),
        "TRUEUP_SERVER_CREATE_KEY": "false",
        # Wide enough that the error box does not wrap the path.
        "COLUMNS": "400",
    }
    runner = CliRunner()
    created = runner.invoke(
        server_app,
        ["tenant", "create", "acme"],
        env=base | {"TRUEUP_SERVER_DB_FILE": str(url_file)},
    )
    assert created.exit_code == 0, created.output
    assert (tmp_path / "from-file.db").exists()
    # The environment's URL wins over the file's.
    from_env = runner.invoke(
        server_app,
        ["tenant", "create", "beta"],
        env=base
        | {
            "TRUEUP_SERVER_DB_FILE": str(url_file),
            "TRUEUP_SERVER_DB": f"sqlite:///{tmp_path}/from-env.db",
        },
    )
    assert from_env.exit_code == 0, from_env.output
    assert (tmp_path / "from-env.db").exists()
    listed = runner.invoke(
        server_app,
        ["fleet", "list", "--tenant", "beta"],
        env=base | {"TRUEUP_SERVER_DB_FILE": str(url_file)},
    )
    assert listed.exit_code == 1 and "trueup server tenant create beta" in listed.output
    # A missing or empty file is an error naming it; no database appears.
    for content, reason in ((None, "No such file or directory"), ("\n", "empty")):
        bad = tmp_path / "bad-url"
        if content is not None:
            bad.write_text(content)
        refused = runner.invoke(
            server_app, ["migrate"], env=base | {"TRUEUP_SERVER_DB_FILE": str(bad)}
        )
        assert refused.exit_code == 2, refused.output
        assert f"TRUEUP_SERVER_DB_FILE={bad}" in refused.output, refused.output
        assert reason in refused.output, refused.output
    assert not (tmp_path / "trueup-server.db").exists() and not Path("trueup-server.db").exists()
