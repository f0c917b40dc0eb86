"""The OCI images packaging tests run: built once, cached by the hash of their inputs.

    from tests.packaging.images import server_image, postgres_image, podman, unique

`server_image()` and `postgres_image()` build the image on the first call (a
minute or two: mmdebstrap and pip into a root file system) and return at once
afterwards, in this process and in any later one, as long as nothing the image
is built from changed (see scripts/build_image.py). Concurrent callers (xdist
workers, other test runs) wait on a file lock instead of building twice.

`podman(...)` runs podman with CONTAINERS_CONF=packaging/containers.conf, as
every podman call on this machine must. Names from `unique(prefix)` carry the
process id and a random suffix, so concurrent runs never touch each other's
pods, volumes or secrets; clean-up removes them by exactly that name.
"""

from __future__ import annotations

import os
import secrets
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable
from functools import cache

import pytest

from scripts import build_image

__all__ = [
    "CONTAINERS_CONF",
    "podman",
    "podman_env",
    "postgres_image",
    "require_podman",
    "server_image",
    "unique",
    "wait_until",
]

CONTAINERS_CONF = build_image.CONTAINERS_CONF


def podman_env() -> dict[str, str]:
    """The environment every podman call needs (CONTAINERS_CONF)."""
    return build_image.podman_env()


def require_podman() -> None:
    """Fail loudly (never skip) when the image tests cannot run here."""
    if os.geteuid() != 0:
        pytest.fail("image and kube tests need root (podman in root mode, mmdebstrap, netns)")
    missing = [t for t in ("podman", "mmdebstrap", "catatonit") if shutil.which(t) is None]
    if missing:
        pytest.fail(
            f"image and kube tests need {', '.join(missing)}: "
            f"apt-get install {' '.join(missing)} (see `make system-deps`)"
        )


def podman(
    *args: str, check: bool = True, timeout: float = 300, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run podman with the project's containers.conf; raise with its stderr when it fails."""
    proc = subprocess.run(
        ["podman", *args],
        capture_output=True,
        text=True,
        env=podman_env(),
        timeout=timeout,
        input=input,
        check=False,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"podman {shlex.join(args)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}"
        )
    return proc


def _build(what: str, build: Callable[[], str]) -> str:
    require_podman()
    try:
        return build()
    except build_image.BuildError as exc:
        pytest.fail(f"building the {what} image failed: {exc}")


@cache
def server_image() -> str:
    """The control plane image for the working tree (`localhost/trueup-server:<ver>-<hash>`)."""
    return _build("control plane", build_image.build_server_image)


@cache
def postgres_image() -> str:
    """The PostgreSQL trial image, `localhost/postgres:15-bookworm`."""
    return _build("PostgreSQL", build_image.build_postgres_image)


def unique(prefix: str) -> str:
    """A name no concurrent test run uses: `<prefix>-<pid>-<random>`."""
    return f"{prefix}-{os.getpid()}-{secrets.token_hex(3)}"


def wait_until(
    predicate: Callable[[], object], *, what: str, timeout: float = 180, interval: float = 0.25
) -> object:
    """Poll until `predicate()` is truthy; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")
