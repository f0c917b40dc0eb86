"""Shared by the Debian package tests: the packages under test and a Debian root in podman.

The packages are built by `scripts.build_deb` (cached by the hash of their inputs); the
test root is a bookworm tarball from mmdebstrap with systemd, python3, iproute2, nftables
and kea-dhcp4-server (cached by the hash of its package list), imported as a podman image
of a unique name and booted with systemd as PID 1. Every container and image is removed by its exact name.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from scripts import build_deb

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("TRUEUP_BUILD_CACHE", "/var/cache/trueup-build"))
CONTAINERS_CONF = str(REPO / "packaging" / "containers.conf")
# kea-dhcp4-server: the agent's Kea must outlive `systemctl restart` of the agent (KillMode).
ROOT_PACKAGES = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "python3",
    "iproute2",
    "nftables",
    "procps",
    "kea-dhcp4-server",
)
V1, V2, V3 = "0.1.0+t1", "0.1.0+t2", "0.1.0+t3"
UNIT = "trueup-agent.service"
# The module the broken release lacks: the agent and `trueup preflight` both import it.
BROKEN_MODULE = "trueup/journal/state"


def sh(*argv: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(
            f"{' '.join(argv)} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
        )
    return result


def podman(
    *args: str, check: bool = True, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    if shutil.which("podman") is None:
        raise AssertionError("podman is not installed (make system-deps installs it)")
    env = {**os.environ, "CONTAINERS_CONF": CONTAINERS_CONF}
    result = subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=timeout, env=env
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"podman {' '.join(args)} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
        )
    return result


def wait_for(what: str, probe: Callable[[], Any], deadline: float = 180) -> Any:
    end = time.monotonic() + deadline
    last: Any = None
    while time.monotonic() < end:
        last = probe()
        if last:
            return last
        time.sleep(0.5)
    raise AssertionError(f"timed out after {deadline:.0f} s waiting for {what} (last: {last!r})")


def repack(deb: Path, version: str, without_module: str, out: Path) -> Path:
    """`deb` as package `version`, its environment lacking `without_module` (source and bytecode)."""
    tree = out / f"{version}-tree"
    shutil.rmtree(tree, ignore_errors=True)
    sh("dpkg-deb", "-R", str(deb), str(tree))
    site = next((tree / "opt/trueup/package/lib").glob("python3*/site-packages"))
    module = site / f"{without_module}.py"
    assert module.exists(), module
    module.unlink()
    for pyc in module.parent.glob(f"__pycache__/{module.stem}.*.pyc"):
        pyc.unlink()
    old = sh("dpkg-deb", "-f", str(deb), "Version").stdout.strip()
    control = tree / "DEBIAN" / "control"
    control.write_text(control.read_text().replace(f"Version: {old}", f"Version: {version}"))
    postinst = tree / "DEBIAN" / "postinst"
    postinst.write_text(postinst.read_text().replace(f"VERSION='{old}'", f"VERSION='{version}'"))
    repacked = out / f"trueup-agent_{version}_amd64.deb"
    sh("dpkg-deb", "--root-owner-group", "-Znone", "--build", str(tree), str(repacked))
    shutil.rmtree(tree)
    return repacked


def build_packages(out: Path) -> dict[str, Path]:
    """v1 and v2 from the source; v3 is v2 without a module its agent and its preflight need."""
    debs = {v: build_deb.build(v, out, CACHE) for v in (V1, V2)}
    debs[V3] = repack(debs[V2], V3, BROKEN_MODULE, out)
    return debs


def _root_tarball() -> Path:
    digest = hashlib.sha256(" ".join(ROOT_PACKAGES).encode()).hexdigest()[:16]
    tarball = CACHE / f"deb-test-root-{digest}.tar"
    lock = CACHE / "deb-test-root.lock"
    CACHE.mkdir(parents=True, exist_ok=True)
    with build_deb._locked(lock):
        if not tarball.exists():
            partial = tarball.with_name(tarball.name + ".partial")
            sh(
                "mmdebstrap",
                "--quiet",
                "--variant=apt",
                "--format=tar",
                f"--include={','.join(ROOT_PACKAGES)}",
                "bookworm",
                str(partial),
            )
            partial.rename(tarball)
    return tarball


class DebianRoot:
    """A bookworm container booted with systemd, the packages mounted at /debs."""

    def __init__(self, debs: dict[str, Path]) -> None:
        suffix = secrets.token_hex(4)
        self.name = f"trueup-deb-{os.getpid()}-{suffix}"
        self.image = f"localhost/trueup-deb-test-{suffix}:1"
        self.debs = debs

    def start(self) -> None:
        debs = self.debs
        podman("import", "--quiet", str(_root_tarball()), self.image)
        deb_dir = next(iter(debs.values())).parent
        podman(
            "run", "-d", "--name", self.name, "--systemd=always", "--network", "none",
            "--cap-add", "NET_ADMIN", "--cap-add", "NET_RAW",
            "-v", f"{deb_dir}:/debs:ro", self.image, "/sbin/init",
        )  # fmt: skip
        wait_for(
            "systemd to finish booting in the container",
            lambda: (
                self.run("systemctl", "is-system-running", check=False).stdout.strip()
                in ("running", "degraded")
            ),
        )

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return podman("exec", self.name, *argv, check=check)

    def deb(self, version: str) -> str:
        return f"/debs/{self.debs[version].name}"

    def unit(self) -> dict[str, str]:
        out = self.run(
            "systemctl", "show", UNIT, "-p", "ActiveState", "-p", "SubState", "-p", "MainPID",
            "-p", "ConditionResult", "-p", "Type", "-p", "WatchdogUSec", "-p", "NRestarts",
        ).stdout  # fmt: skip
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def versions(self) -> str:
        """`trueup --version`: the CLI's version and the version of the agent that answers."""
        return self.run("trueup", "--version").stdout

    def status(self) -> dict[str, Any]:
        return dict(json.loads(self.run("trueup", "status", "-o", "json").stdout))

    def current(self) -> str:
        return self.run("readlink", "/opt/trueup/current").stdout.strip()

    def exists(self, path: str) -> bool:
        return self.run("test", "-e", path, check=False).returncode == 0

    def read(self, path: str) -> str:
        return self.run("cat", path).stdout

    def close(self) -> None:
        podman("rm", "-f", "-t", "0", self.name, check=False)
        podman("rmi", "-f", self.image, check=False)


def debian_root(debs: dict[str, Path]) -> Iterator[DebianRoot]:
    root = DebianRoot(debs)
    try:
        root.start()
        yield root
    finally:
        root.close()
