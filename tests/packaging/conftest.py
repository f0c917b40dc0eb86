from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.packaging.images import postgres_image, server_image
from tests.packaging.smoke import free_slash30
from tests.routers import Router, require_root, sh


@pytest.fixture(scope="session")
def server_image_name() -> str:
    """The control plane image, built once (cached on disk by its inputs' hash)."""
    return server_image()


@pytest.fixture(scope="session")
def postgres_image_name() -> str:
    """The PostgreSQL trial image (`localhost/postgres:15-bookworm`)."""
    return postgres_image()


@pytest.fixture
def agent_router(tmp_path: Path) -> Iterator[tuple[Router, str, str]]:
    """A router namespace whose mgmt0 is wired to the host: (router, host address, its address)."""
    require_root()
    router = Router(tmp_path / "router")
    host_link = f"tk{router.name.split('-', 1)[1].replace('-', '')}"[:15]
    try:
        host_ip, agent_ip = free_slash30()
        router.ip("link", "set", "mgmt0p", "name", host_link)
        router.ip("link", "set", host_link, "netns", "1")
        sh("ip", "addr", "add", f"{host_ip}/30", "dev", host_link)
        sh("ip", "link", "set", host_link, "up")
        router.ip("link", "set", "mgmt0", "up")
        router.ip("addr", "add", f"{agent_ip}/30", "dev", "mgmt0")
        yield router, host_ip, agent_ip
    finally:
        router.close()
        with contextlib.suppress(AssertionError):
            sh("ip", "link", "del", host_link, check=False)
