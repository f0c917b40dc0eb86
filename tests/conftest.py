from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.routers import Router, router_fixture


@pytest.fixture
def router(tmp_path: Path) -> Iterator[Router]:
    yield from router_fixture(tmp_path)


@pytest.fixture
def router_with_client(tmp_path: Path) -> Iterator[Router]:
    yield from router_fixture(tmp_path, client=True)
