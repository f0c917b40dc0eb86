"""The control plane image: its size, and how fast a container answers /readyz.

Start → first `GET /readyz` = 200 from the host (polled every 20 ms), for
`trueup server run` in the image (`podman run`, read-only root, the key on a
read-only bind mount, the data directory on a tmpfs, a fresh SQLite database so
the schema migration is part of it) against the same command from the
development venv on the host, measured in the same run; and `podman run` of a
container that only exits, the runtime's own share.

`python -m scripts.bench_image [--quick]` prints the section.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from scripts import build_image
from scripts.benchlib import REPO, median, percentile

TRUEUP = str(REPO / ".venv" / "bin" / "trueup")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ready_after(port: int, started: float, alive: Callable[[], bool]) -> float:
    deadline = started + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return time.monotonic() - started
        except httpx.HTTPError:
            pass
        if not alive():
            raise RuntimeError("the control plane exited before it was ready")
        time.sleep(0.02)
    raise RuntimeError(f"127.0.0.1:{port}/readyz not 200 within 120 s")


def _container(image: str, keydir: Path) -> float:
    port = _port()
    name = f"tu-bench-image-{os.getpid()}-{secrets.token_hex(3)}"
    started = time.monotonic()
    build_image.podman(
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
        "--env",
        "TRUEUP_SERVER_DB=sqlite:////var/lib/trueup-server/server.db",
        "--env",
        "TRUEUP_SERVER_WORKERS=1",
        image,
    )
    try:

        def alive() -> bool:
            state = build_image.podman("inspect", "--format", "{{.State.Running}}", name)
            return state.stdout.strip() == "true"

        return _ready_after(port, started, alive)
    finally:
        build_image.podman("rm", "--force", "--time", "0", name, check=False)


def _host(keydir: Path, work: Path) -> float:
    port = _port()
    data = Path(tempfile.mkdtemp(dir=work))
    started = time.monotonic()
    proc = subprocess.Popen(
        [
            TRUEUP,
            "server",
            "run",
            "--db",
            f"sqlite:///{data}/server.db",
            "--key-file",
            str(keydir / "server.key"),
            "--data-dir",
            str(data),
            "--listen",
            f"127.0.0.1:{port}",
            "--workers",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        return _ready_after(port, started, lambda: proc.poll() is None)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _noop(image: str) -> float:
    started = time.monotonic()
    build_image.podman("run", "--rm", "--entrypoint", "/bin/true", image)
    return time.monotonic() - started


def run(quick: bool) -> str:
    rounds = 3 if quick else 10
    image = build_image.build_server_image()
    inspect = json.loads(build_image.podman("image", "inspect", image).stdout)[0]
    size_mb = inspect["Size"] / 1e6
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        keydir = work / "key"
        keydir.mkdir()
        (keydir / "server.key").write_text(secrets.token_hex(32) + "\n")
        (keydir / "server.key").chmod(0o644)  # read by uid 10001 through the bind mount
        keydir.chmod(0o755)
        _host(keydir, work)  # warm the page cache for both sides alike
        _container(image, keydir)
        host: list[float] = []
        container: list[float] = []
        noop: list[float] = []
        for _ in range(rounds):
            host.append(_host(keydir, work))
            container.append(_container(image, keydir))
            noop.append(_noop(image))

    def row(label: str, values: list[float]) -> str:
        return f"| {label} | {median(values):.2f} | {percentile(values, 90):.2f} |"

    ratio = median(container) / median(host)
    return "\n".join(
        [
            "## Control plane image",
            "",
            f"`{image}`: {size_mb:.0f} MB (`podman image inspect`). Start → first `/readyz` 200 "
            f"from the host, fresh SQLite database, one worker; {rounds} rounds, seconds:",
            "",
            "| start | median | p90 |",
            "|---|---|---|",
            row("`trueup server run` from the venv on the host (baseline)", host),
            row("`podman run` of the image (read-only root, key mounted)", container),
            row("`podman run` of a container that only exits (runtime share)", noop),
            "",
            f"Ratio container / host process: {ratio:.2f} (medians). Of the container's time, "
            f"{median(noop):.2f} s is the runtime creating and starting a container at all; "
            "the image's modules are byte-compiled, so Python compiles nothing on start.",
            "",
        ]
    )


if __name__ == "__main__":
    print(run("--quick" in sys.argv[1:]))
