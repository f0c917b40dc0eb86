"""The crash sweep over every subsystem, killed while recovery puts each one back.

See `tests.crashsweep`: an apply killed right before its commit leaves every
subsystem at the new revision with the transaction open; the next agent is
killed at `recovery:SUBSYSTEM` for each subsystem in turn, and the one after
it recovers. The system then equals the committed revision exactly.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.crashsweep import SUBSYSTEMS, FullRouter, full_router, kill_in_recovery

pytestmark = pytest.mark.root


@pytest.fixture
def full(tmp_path: Path) -> Iterator[FullRouter]:
    yield from full_router(tmp_path)


# Twenty kills and restarts with five daemons on a loaded 2-core machine: no time is asserted.
@pytest.mark.timeout(3600)
def test_recovery_killed_at_each_subsystem_is_recovered_to_the_committed_revision(
    full: FullRouter,
) -> None:
    full.prepare()
    for name in SUBSYSTEMS:
        kill_in_recovery(full, name)
    assert full.kills == 2 * len(SUBSYSTEMS)
