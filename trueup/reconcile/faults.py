"""Test-only fault points: `TRUEUP_FAULT=POINT[:sleep=SECONDS|:wait=PATH]`.

At the named point the process kills itself with SIGKILL (or sleeps, to hold
the writer lock; or waits until PATH exists, at most five minutes, so a test
can change the world — fill the state directory — at exactly that point).
Points: `begin`, `step:SUBSYSTEM` (after the first step of a subsystem),
`applied:SUBSYSTEM`, `before-commit`, `after-commit`, `rollback:SUBSYSTEM`,
`recovery:SUBSYSTEM` (after crash recovery converged it); the engine's points
also fire as `KIND/POINT` (`apply/step:links`).
Unset in production, where `hit()` is one dictionary lookup.
"""

from __future__ import annotations

import os
import signal
import time

__all__ = ["hit"]


def hit(point: str) -> None:
    spec = os.environ.get("TRUEUP_FAULT")
    if not spec:
        return
    for entry in spec.split(","):
        name, _, action = entry.partition(":sleep=")
        name, _, wait_for = name.partition(":wait=")
        if name != point:
            continue
        if wait_for:
            deadline = time.monotonic() + 300.0
            while not os.path.exists(wait_for) and time.monotonic() < deadline:
                time.sleep(0.05)
        elif action:
            time.sleep(float(action))
        else:
            os.kill(os.getpid(), signal.SIGKILL)
