"""deploy/compose ("Edge Lite"), run by podman-compose, drives a real agent.

The shipped compose.yaml is copied verbatim into a work directory with what an
operator adds beside it: `.env` made from `.env.example` (a password, this tree's
image tag, the control plane's port published on the host end of the agent's
veth) and `secrets/server.key` made with `openssl rand -hex 32`. `podman-compose
-p <unique> up -d` starts PostgreSQL and the control plane; the control plane
answers /readyz, runs hardened (uid 10001, read-only root, no capabilities, the
published address only), and the shared smoke steps (tests/packaging/smoke.py)
enroll an agent in a network namespace that applies revision 1 to its kernel.
`podman-compose down` removes both containers; `up -d` brings them back on the
same volumes: the tenant, token, device and revision are still there, the audit
chain verifies, and the agent applies revision 2. `down -v` removes the volumes;
every container, volume and the network are removed by exact name even when the
test fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.packaging import smoke
from tests.packaging.images import podman, podman_env, server_image, unique, wait_until
from tests.routers import Router

pytestmark = [pytest.mark.root, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parent.parent.parent
COMPOSE_DIR = REPO / "deploy" / "compose"
DNSNAME = Path("/usr/lib/cni/dnsname")
SERVICES = ("postgres", "controlplane")
VOLUMES = ("postgres", "data")


def _require_compose() -> None:
    if shutil.which("podman-compose") is None:
        pytest.fail("the compose test needs podman-compose: apt-get install podman-compose")
    if not DNSNAME.exists():
        pytest.fail(
            f"{DNSNAME} is missing: compose services find each other by name only with "
            "apt-get install golang-github-containernetworking-plugin-dnsname (see `make system-deps`)"
        )


def _env_file(example: Path, values: dict[str, str]) -> str:
    """`.env.example` with `values` filled in; every key set must be one the example names."""
    lines, seen = [], set()
    for line in example.read_text().splitlines():
        key, sep, _ = line.partition("=")
        if sep and not line.lstrip().startswith("#") and key in values:
            line = f"{key}={values[key]}"
            seen.add(key)
        lines.append(line)
    missing = set(values) - seen
    assert not missing, f"{example} does not name {', '.join(sorted(missing))}"
    return "\n".join(lines) + "\n"


class Compose:
    """The compose file as an operator lays it out, under a unique project name."""

    def __init__(self, workdir: Path, host_ip: str, image: str) -> None:
        self.project = unique("tc")
        self.workdir = workdir / "edge"
        self.workdir.mkdir()
        self.port = smoke.free_port()
        self.host_ip = host_ip
        self.url = f"http://{host_ip}:{self.port}"
        shutil.copy(COMPOSE_DIR / "compose.yaml", self.workdir / "compose.yaml")
        password = subprocess.run(
            ["openssl", "rand", "-hex", "24"], capture_output=True, text=True, check=True
        ).stdout.strip()
        assert image.startswith("localhost/trueup-server:"), image
        (self.workdir / ".env").write_text(
            _env_file(
                COMPOSE_DIR / ".env.example",
                {
                    "POSTGRES_PASSWORD": password,
                    # This tree's build, not whatever carries the bare version tag.
                    "TRUEUP_VERSION": image.rpartition(":")[2],
                    "TRUEUP_LISTEN_ADDRESS": host_ip,
                    "TRUEUP_PORT": str(self.port),
                    "TRUEUP_PUBLIC_URL": self.url,
                },
            )
        )
        secrets = self.workdir / "secrets"
        secrets.mkdir()
        key = secrets / "server.key"
        with key.open("w") as out:
            subprocess.run(["openssl", "rand", "-hex", "32"], stdout=out, check=True)
        os.chown(key, 10001, 10001)
        key.chmod(0o400)
        self.containers = [f"{self.project}_{s}_1" for s in SERVICES]
        self.volumes = [f"{self.project}_{v}" for v in VOLUMES]
        self.network = f"{self.project}_default"
        self.server = f"{self.project}_controlplane_1"
        self.postgres = f"{self.project}_postgres_1"

    def compose(self, *args: str, timeout: float = 300) -> str:
        argv = ["podman-compose", "-p", self.project, "-f", str(self.workdir / "compose.yaml")]
        proc = subprocess.run(
            [*argv, *args],
            capture_output=True,
            text=True,
            env=podman_env(),
            cwd=self.workdir,
            timeout=timeout,
            check=False,
        )
        output = proc.stdout + proc.stderr
        # podman-compose 1.0.3 goes on after a failed podman call: its output says so.
        failed = proc.returncode != 0 or any(
            line.startswith("exit code: ") and line != "exit code: 0"
            for line in proc.stdout.splitlines()
        )
        assert not failed, f"{shlex.join([*argv, *args])} failed ({proc.returncode}):\n{output}"
        return proc.stdout

    def up(self) -> float:
        """`up -d`; seconds until /readyz answers 200."""
        started = time.monotonic()
        self.compose("up", "-d")
        try:
            wait_until(lambda: smoke.ready(self.url) == 200, what=f"{self.url}/readyz", timeout=240)
        except AssertionError as exc:
            logs = podman("logs", "--tail", "30", self.server, check=False)
            raise AssertionError(f"{exc}\ncontrol plane log:\n{logs.stdout}{logs.stderr}") from None
        return time.monotonic() - started

    def exists(self, kind: str, name: str) -> bool:
        return podman(kind, "exists", name, check=False).returncode == 0

    def inspect(self, name: str) -> dict[str, Any]:
        info: dict[str, Any] = json.loads(podman("inspect", name).stdout)[0]
        return info

    def cli(self, *args: str, shell: str | None = None) -> str:
        """`trueup server …` inside the control plane's container (its environment)."""
        argv = ["sh", "-c", shell] if shell else ["trueup", "server", *args]
        proc = podman("exec", self.server, *argv, check=False, timeout=120)
        assert proc.returncode == 0, f"{argv} failed: {proc.stdout}{proc.stderr}"
        return proc.stdout

    def close(self) -> None:
        with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
            self.compose("down", "-v", timeout=180)
        for container in self.containers:
            if self.exists("container", container):
                podman("rm", "--force", "--time", "5", container, check=False, timeout=120)
        for volume in self.volumes:
            if self.exists("volume", volume):
                podman("volume", "rm", "--force", volume, check=False)
        if self.exists("network", self.network):
            podman("network", "rm", "--force", self.network, check=False)


@pytest.fixture
def edge(tmp_path: Path, agent_router: tuple[Router, str, str]) -> Iterator[Compose]:
    _require_compose()
    edge = Compose(tmp_path, agent_router[1], server_image())
    try:
        yield edge
    finally:
        edge.close()


def test_compose_file_runs_the_control_plane_and_postgres_for_an_agent(
    edge: Compose, agent_router: tuple[Router, str, str]
) -> None:
    router, host_ip, agent_ip = agent_router
    seconds = edge.up()
    print(f"podman-compose up -d → /readyz 200 in {seconds:.1f} s")

    # Hardened as the file says: uid 10001, read-only root, no capabilities, no new
    # privileges, restarted unless stopped, published on the configured address only.
    assert edge.cli(shell="id -u").strip() == "10001"
    assert podman("exec", edge.server, "touch", "/opt/x", check=False).returncode != 0
    edge.cli(shell="touch /var/lib/trueup-server/.w /tmp/.w && rm /var/lib/trueup-server/.w")
    info = edge.inspect(edge.server)
    assert info["HostConfig"]["ReadonlyRootfs"] is True
    assert not info["EffectiveCaps"], info["EffectiveCaps"]
    assert "no-new-privileges" in " ".join(info["HostConfig"]["SecurityOpt"])
    assert info["HostConfig"]["RestartPolicy"]["Name"] == "always"
    bindings = info["HostConfig"]["PortBindings"]["8443/tcp"]
    assert bindings == [{"HostIp": host_ip, "HostPort": str(edge.port)}], bindings
    # The key is the operator's file, read-only in the container; the volumes are named.
    assert edge.cli(shell="wc -c < /run/secrets/trueup/server.key").strip() == "65"
    assert edge.cli(shell="test ! -w /run/secrets/trueup/server.key && echo ro").strip() == "ro"
    mounts = {m["Destination"]: m.get("Name") for m in info["Mounts"]}
    assert mounts["/var/lib/trueup-server"] == f"{edge.project}_data", mounts
    # PostgreSQL's healthcheck (what docker compose's depends_on waits for) passes.
    assert podman("healthcheck", "run", edge.postgres, check=False).returncode == 0

    token = smoke.first_revision(edge, router, agent_ip)

    # A control plane that starts before PostgreSQL answers (podman-compose 1.0.3 does not wait
    # for depends_on's service_healthy) exits and is restarted until the database is back.
    podman("stop", "--time", "10", edge.postgres)
    wait_until(lambda: smoke.ready(edge.url) == 503, what="/readyz 503 without PostgreSQL")
    podman("restart", edge.server)
    wait_until(
        lambda: edge.inspect(edge.server)["RestartCount"] >= 1,
        what="the control plane restarted by its policy while PostgreSQL is down",
    )
    podman("start", edge.postgres)
    wait_until(lambda: smoke.ready(edge.url) == 200, what="/readyz 200 with PostgreSQL back")
    # The documented way in: `podman-compose exec controlplane trueup server …`.
    out = edge.compose("exec", "-T", "controlplane", "trueup", "server", "tenant", "create", "beta")
    assert "tenant beta created" in out, out

    # Both containers go; their volumes stay.
    edge.compose("down")
    for container in edge.containers:
        assert not edge.exists("container", container), f"{container} still there after down"
    for volume in edge.volumes:
        assert edge.exists("volume", volume), f"{volume} removed by down (without -v)"
    assert smoke.ready(edge.url) == 0
    seconds = edge.up()
    print(f"podman-compose up -d again → /readyz 200 in {seconds:.1f} s")

    view = smoke.device(edge.url, token)  # the old token: users and tokens survived
    assert view["desired_version"] == 1, view
    again = podman("exec", edge.server, "trueup", "server", "tenant", "create", "beta", check=False)
    assert again.returncode != 0 and "beta" in again.stderr, again  # still there
    verify = podman("exec", edge.server, "trueup", "server", "audit", "verify", check=False)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    smoke.next_revision(edge, router, agent_ip, token, 2)
    assert httpx.get(f"{edge.url}/healthz", timeout=30).status_code == 200

    edge.compose("down", "-v")
    for volume in edge.volumes:
        assert not edge.exists("volume", volume), f"{volume} still there after down -v"
