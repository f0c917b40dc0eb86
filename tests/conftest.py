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


# The files that take longest (real daemons, image builds, crash sweeps) go to the
# workers first, so that no long file starts last and the run ends with one busy
# worker. `scripts/run-tests.sh` prints the slowest tests, to keep this list true.
LONGEST_FIRST = (
    "tests/packaging/test_image.py",
    "tests/packaging/test_compose.py",
    "tests/packaging/test_kube_play.py",
    "tests/packaging/test_deb_lifecycle.py",
    "tests/integration/test_crash_sweep_random.py",
    "tests/integration/test_crash_sweep.py",
    "tests/integration/test_crash_sweep_step.py",
    "tests/integration/test_crash_sweep_applied.py",
    "tests/integration/test_crash_sweep_rollback.py",
    "tests/integration/test_crash_sweep_recovery.py",
    "tests/integration/test_dashboard_e2e.py",
    "tests/integration/test_hung_daemons.py",
    "tests/integration/test_restore_hostage.py",
    "tests/integration/test_hostage.py",
    "tests/integration/test_restore_incident.py",
    "tests/integration/test_dhcp_fence_flood.py",
    "tests/integration/test_boot.py",
    "tests/integration/test_ha.py",
    "tests/integration/test_proxy.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: index for index, path in enumerate(LONGEST_FIRST)}

    def key(item: pytest.Item) -> int:
        return rank.get(item.nodeid.split("::", 1)[0], len(rank))

    items.sort(key=key)  # stable: every other file keeps its order
