"""The crash sweep over every subsystem, killed right after each subsystem's apply.

`tests.crashsweep` runs one router with links, addresses, routes, a
firewall, sysctls, Kea, Knot, keepalived, HAProxy and WireGuard; the agent
is killed by SIGKILL at `apply/applied:SUBSYSTEM` for each of them in turn.
After each restart the system equals the revision before the apply exactly,
no transaction is open, the audit chain verifies and management answers from
another namespace. The other fault points are in the `test_crash_sweep_*`
files beside this one (pytest-xdist runs files in parallel).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.crashsweep import SUBSYSTEMS, FullRouter, full_router, kill_at

pytestmark = pytest.mark.root


@pytest.fixture
def full(tmp_path: Path) -> Iterator[FullRouter]:
    yield from full_router(tmp_path)


# Ten kills and restarts with five daemons on a loaded 2-core machine: no time is asserted.
@pytest.mark.timeout(3600)
def test_killed_after_each_subsystem_applied_recovers_the_old_revision(full: FullRouter) -> None:
    full.prepare()
    for name in SUBSYSTEMS:
        kill_at(full, f"apply/applied:{name}")
    assert full.kills == len(SUBSYSTEMS)
