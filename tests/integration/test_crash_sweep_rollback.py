"""The crash sweep over every subsystem, killed while a failed apply rolls each one back.

See `tests.crashsweep`: the `bad` revision is `b` with WireGuard on a UDP
port another program holds, so the apply fails at its last subsystem and
rolls every other one back, last first; SIGKILL at `rollback:SUBSYSTEM` for
each of them. After each restart the system equals the revision before the
apply exactly.
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
def test_killed_during_each_subsystems_rollback_recovers_the_old_revision(
    full: FullRouter,
) -> None:
    full.prepare()
    full.hold_port()
    # Without a kill, the failed apply is rolled back in full.
    failed = full.apply("bad")
    assert failed.returncode != 0, failed.stdout
    assert "wireguard" in failed.stdout + failed.stderr
    assert full.matches("a") == "a"
    full.consistent()
    for name in SUBSYSTEMS:
        kill_at(full, f"rollback:{name}", "bad")
    assert full.kills == len(SUBSYSTEMS)
