"""The control plane image and the PostgreSQL trial image, as built by scripts/build_image.py.

The server image: non-root (10001), `trueup server run` as its entry point,
configuration from the environment, no key made up when the mounted one is
missing, every module byte-compiled (it runs on a read-only root), nothing of
apt or the documentation left in it, and a cached rebuild returns the same
image. The PostgreSQL image: the official image's environment contract
(POSTGRES_USER, POSTGRES_PASSWORD, POSTGRES_DB, PGDATA) with password
authentication for network clients.
"""

from __future__ import annotations

import json
import secrets
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from scripts import build_image
from tests.packaging.images import podman, postgres_image, server_image, unique, wait_until

pytestmark = [pytest.mark.root, pytest.mark.timeout(900)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def containers() -> Iterator[list[str]]:
    """Names of the containers a test starts; each removed by that name afterwards."""
    names: list[str] = []
    yield names
    for name in names:
        podman("rm", "--force", "--time", "0", name, check=False)


def _run(
    image: str, *args: str, entrypoint: str | None = None, options: list[str] | None = None
) -> tuple[int, str]:
    argv = ["run", "--rm", "--read-only", *(options or [])]
    if entrypoint is not None:
        argv += ["--entrypoint", entrypoint]
    proc = podman(*argv, image, *args, check=False, timeout=120)
    return proc.returncode, proc.stdout + proc.stderr


def test_server_image_configuration() -> None:
    image = server_image()
    config = json.loads(podman("image", "inspect", image).stdout)[0]["Config"]
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"] == ["/opt/trueup/bin/trueup", "server", "run"]
    assert "8443/tcp" in config["ExposedPorts"]
    env = dict(item.split("=", 1) for item in config["Env"])
    assert env["TRUEUP_SERVER_LISTEN"] == "0.0.0.0:8443"
    assert env["TRUEUP_SERVER_KEY_FILE"] == "/run/secrets/trueup/server.key"
    assert env["TRUEUP_SERVER_DATA_DIR"] == "/var/lib/trueup-server"
    assert env["TRUEUP_SERVER_CREATE_KEY"] == "false"
    # Start-up lines and errors reach `podman logs`: the CLI's default (warning) says nothing.
    assert env["TRUEUP_SERVER_LOG_LEVEL"] == "info"
    assert env["PATH"].startswith("/opt/trueup/bin:")
    assert config["WorkingDir"] == "/var/lib/trueup-server"
    labels = config["Labels"]
    assert labels["org.opencontainers.image.version"] == build_image.version()
    assert labels[build_image.INPUTS_LABEL] == build_image.server_inputs()
    assert len(labels["org.opencontainers.image.revision"]) == 40
    # Cached: asking again returns the same image, not a rebuild.
    image_id = json.loads(podman("image", "inspect", image).stdout)[0]["Id"]
    assert build_image.build_server_image() == image
    assert json.loads(podman("image", "inspect", image).stdout)[0]["Id"] == image_id


def test_server_image_contents() -> None:
    image = server_image()
    script = (
        "id -u; id -g; getent passwd trueup; stat -c '%u %a' /var/lib/trueup-server; "
        "command -v apt-get || echo no-apt; ls /var/lib/apt/lists | wc -l; "
        "find /usr/share/man /usr/share/locale -type f 2>/dev/null | wc -l; "
        "dpkg-query -W -f='${db:Status-Status}\\n' apt perl usrmerge | grep -c '^installed'; "
        # Every module comes from its bytecode: nothing is compiled at start (read-only root).
        "python3 - <<'EOF'\n"
        "import subprocess, sys\n"
        "out = subprocess.run([sys.executable, '-v', '-c', 'import trueup.server.app, trueup.cli.server'],\n"
        "                     capture_output=True, text=True).stderr\n"
        "sources = [l for l in out.splitlines() if l.startswith('# code object from') and l.endswith('.py')]\n"
        "print('uncompiled', len(sources), sources[:3])\n"
        "EOF\n"
    )
    code, out = _run(image, "-c", script, entrypoint="/bin/sh")
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0:2] == ["10001", "10001"], out
    assert lines[2].endswith(":/var/lib/trueup-server:/usr/sbin/nologin"), out
    assert lines[3] == "10001 700", out
    assert lines[4] == "no-apt", out
    assert lines[5:8] == ["0", "0", "0"], out
    assert lines[8].startswith("uncompiled 0 "), out


def test_server_refuses_a_missing_key_naming_the_path() -> None:
    code, out = _run(
        server_image(),
        "--db",
        "sqlite:////var/lib/trueup-server/x.db",
        options=["--tmpfs", "/var/lib/trueup-server:rw,U,mode=0700"],
    )
    assert code != 0
    assert "/run/secrets/trueup/server.key" in out, out
    assert "openssl rand -hex 32" in out, out


def test_server_runs_from_the_environment(tmp_path: Path, containers: list[str]) -> None:
    keydir = tmp_path / "key"
    keydir.mkdir(mode=0o755)
    (keydir / "server.key").write_text(secrets.token_hex(32) + "\n")
    (keydir / "server.key").chmod(0o644)
    (keydir / "db-url").write_text("sqlite:////var/lib/trueup-server/server.db\n")
    (keydir / "db-url").chmod(0o644)
    port = _free_port()
    name = unique("tu-image")
    containers.append(name)
    podman(
        "run",
        "--detach",
        "--name",
        name,
        "--read-only",
        "--publish",
        f"127.0.0.1:{port}:8443",
        "--volume",
        f"{keydir}:/run/secrets/trueup:ro",
        "--tmpfs",
        "/var/lib/trueup-server:rw,U,mode=0700",
        # The database URL from a file on the key's mount: it stays out of `podman inspect`.
        "--env",
        "TRUEUP_SERVER_DB_FILE=/run/secrets/trueup/db-url",
        server_image(),
    )

    def ready() -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(ready, what="the container's /readyz")
    assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
    created = podman("exec", name, "trueup", "server", "tenant", "create", "acme")
    assert "tenant acme created" in created.stdout
    # The administrative command used the container's database and key (environment).
    listed = podman("exec", name, "trueup", "server", "fleet", "list", "--tenant", "acme")
    assert listed.returncode == 0
    checkpoint = podman("exec", name, "ls", "/var/lib/trueup-server").stdout
    assert "server.db" in checkpoint, checkpoint
    inspected = podman("inspect", name).stdout
    assert "server.db" not in inspected and "TRUEUP_SERVER_DB=" not in inspected
    # An operator reading `podman logs` sees where the server listens.
    logs = podman("logs", name)
    assert "Uvicorn running on http://0.0.0.0:8443" in logs.stdout + logs.stderr, logs
    # SIGTERM to PID 1 ends the server cleanly (a SIGKILL after the grace time would be 137).
    podman("stop", "--time", "60", name, timeout=120)
    state = json.loads(podman("inspect", name).stdout)[0]["State"]
    assert state["ExitCode"] == 0, state
    logs = podman("logs", name)
    assert "Finished server process" in logs.stdout + logs.stderr, logs


def test_postgres_image_environment_contract(containers: list[str]) -> None:
    image = postgres_image()
    assert image == "localhost/postgres:15-bookworm"
    port = _free_port()
    name = unique("tu-pg")
    containers.append(name)
    password = secrets.token_hex(8)
    podman(
        "run",
        "--detach",
        "--name",
        name,
        "--publish",
        f"127.0.0.1:{port}:5432",
        "--env",
        "POSTGRES_USER=trueup",
        "--env",
        f"POSTGRES_PASSWORD={password}",
        "--env",
        "POSTGRES_DB=fleet",
        "--env",
        "PGDATA=/var/lib/postgresql/data/pgdata",
        # The short name the manifests use resolves to the local image.
        "postgres:15-bookworm",
    )

    def query(pw: str, sql: str) -> tuple[int, str]:
        # psql inside the container over TCP: network clients authenticate with the password.
        proc = podman(
            "exec",
            "--env",
            f"PGPASSWORD={pw}",
            name,
            "psql",
            "-h",
            "127.0.0.1",
            "-U",
            "trueup",
            "-d",
            "fleet",
            "-tAc",
            sql,
            check=False,
        )
        return proc.returncode, proc.stdout.strip() + proc.stderr

    wait_until(lambda: query(password, "select 1")[0] == 0, what="PostgreSQL up, database fleet")
    assert query(password, "select current_user, current_database()") == (0, "trueup|fleet")
    refused, message = query("wrong", "select 1")
    assert refused != 0 and "password authentication failed" in message, message
    pgdata = podman("exec", name, "ls", "/var/lib/postgresql/data/pgdata").stdout
    assert "PG_VERSION" in pgdata
    # Without a password the entry point refuses to start, saying which variable is missing.
    code, out = _run(image)
    assert code != 0 and "POSTGRES_PASSWORD" in out, out


def _manifest_container() -> dict[str, Any]:
    docs = yaml.safe_load_all((build_image.REPO / "deploy/kubernetes/base/server.yaml").read_text())
    deployment = next(d for d in docs if d and d["kind"] == "Deployment")
    container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


def _mebibytes(quantity: str) -> float:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return float(quantity[: -len(suffix)]) * factor
    raise AssertionError(f"memory quantity {quantity!r}: expected Ki, Mi or Gi")


def _working_set_mib(name: str) -> float:
    """The container's working set as the kubelet counts it: memory in use less inactive
    file cache (cgroup v2 or v1)."""
    script = (
        "if [ -f /sys/fs/cgroup/memory.current ]; then "
        "cat /sys/fs/cgroup/memory.current; grep '^inactive_file ' /sys/fs/cgroup/memory.stat; "
        "else cat /sys/fs/cgroup/memory/memory.usage_in_bytes; "
        "grep '^total_inactive_file ' /sys/fs/cgroup/memory/memory.stat; fi"
    )
    out = podman("exec", name, "/bin/sh", "-c", script).stdout.split()
    return (int(out[0]) - int(out[2])) / 2**20


def _serve(name: str, port: int, options: list[str], env: dict[str, str]) -> None:
    argv = ["run", "--detach", "--name", name, "--read-only"]
    argv += ["--publish", f"127.0.0.1:{port}:8443", *options]
    for key, value in env.items():
        argv += ["--env", f"{key}={value}"]
    podman(*argv, server_image())

    def ready() -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(ready, what=f"/readyz of {name}")


def test_manifest_memory_request_covers_the_running_server(
    tmp_path: Path, containers: list[str]
) -> None:
    """The Deployment's memory request is at least what the server uses idle with the
    manifest's workers, and its limit leaves room to grow."""
    container = _manifest_container()
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    resources = container["resources"]
    keydir = tmp_path / "key"
    keydir.mkdir(mode=0o755)
    (keydir / "server.key").write_text(secrets.token_hex(32) + "\n")
    (keydir / "server.key").chmod(0o644)
    name = unique("tu-image-mem")
    containers.append(name)
    _serve(
        name,
        _free_port(),
        [
            "--volume",
            f"{keydir}:/run/secrets/trueup:ro",
            "--tmpfs",
            "/var/lib/trueup-server:rw,U,mode=0700",
        ],
        {
            "TRUEUP_SERVER_DB": "sqlite:////var/lib/trueup-server/server.db",
            "TRUEUP_SERVER_WORKERS": env["TRUEUP_SERVER_WORKERS"],
        },
    )
    podman("exec", name, "trueup", "server", "tenant", "create", "acme")
    used = _working_set_mib(name)
    request = _mebibytes(resources["requests"]["memory"])
    limit = _mebibytes(resources["limits"]["memory"])
    print(f"{env['TRUEUP_SERVER_WORKERS']} workers: {used:.0f} MiB in use")
    assert request >= used, f"memory request {request:.0f} MiB < {used:.0f} MiB in use"
    assert limit >= 2 * used, f"memory limit {limit:.0f} MiB < twice {used:.0f} MiB in use"
