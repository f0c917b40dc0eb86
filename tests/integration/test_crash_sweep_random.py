"""The crash sweep over every subsystem, killed at random moments of an apply.

See `tests.crashsweep`: the agent applies the other revision and is killed
by SIGKILL at a random moment after the journal's `begin`; after each
restart the system equals one of the two revisions exactly — the old one,
or the new one when the kill came after its commit — and it is the one the
agent reports as applied.
"""

from __future__ import annotations

import random
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.crashsweep import BOUND, FullRouter, full_router
from tests.routers import TRUEUP

pytestmark = pytest.mark.root

KILLS = 12


@pytest.fixture
def full(tmp_path: Path) -> Iterator[FullRouter]:
    yield from full_router(tmp_path)


# Twelve kills and restarts with five daemons on a loaded 2-core machine: no time is asserted.
@pytest.mark.timeout(3600)
def test_sigkill_at_random_moments_leaves_one_revision_exactly(full: FullRouter) -> None:
    router = full.router
    full.prepare()
    rng = random.Random(61)
    versions = {"a": router.api("/v1/status")["versions"]["applied"]}
    for _ in range(KILLS):
        before = full.current
        target = "b" if before == "a" else "a"
        agent = router.agents[-1]
        begins = full.begins()
        router.spawn(
            *TRUEUP, "apply", str(full.paths[target]), "--state-dir", str(router.state_dir)
        )
        router.wait_for(lambda b=begins: full.begins() > b, what="begin written", timeout=BOUND)
        # An apply with five daemons takes seconds: kill anywhere in it, or after it.
        time.sleep(rng.uniform(0.0, 4.0))
        agent.send_signal(signal.SIGKILL)
        full.killed(agent)
        full.restart()
        found = full.matches(before, target)
        applied = router.api("/v1/status")["versions"]["applied"]
        if found == target:
            versions[target] = applied
        assert versions.get(found) == applied, (found, applied, versions)
        full.current = found
        full.consistent()
    assert full.kills == KILLS
