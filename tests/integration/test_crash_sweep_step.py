"""The crash sweep over every subsystem, killed right after each subsystem's first step.

See `tests.crashsweep`: SIGKILL at `apply/step:SUBSYSTEM` for every
subsystem of a document with all of them; after each restart the system
equals the revision before the apply exactly (nft JSON, sysctl values, Kea's
`config-get`, Knot's zone, keepalived's and HAProxy's configurations,
`wg show dump`, the kernel), management answers from another namespace and
the audit chain verifies.
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
def test_killed_after_each_subsystems_first_step_recovers_the_old_revision(
    full: FullRouter,
) -> None:
    full.prepare()
    for name in SUBSYSTEMS:
        kill_at(full, f"apply/step:{name}")
    assert full.kills == len(SUBSYSTEMS)
