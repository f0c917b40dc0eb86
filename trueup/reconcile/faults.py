"""Test-only fault points: `TRUEUP_FAULT=POINT[:sleep=SECONDS]`.

At the named point the process kills itself with SIGKILL (or sleeps, to hold
the writer lock). Points: `begin`, `step:SUBSYSTEM` (after the first step of
a subsystem), `applied:SUBSYSTEM`, `before-commit`, `after-commit`,
`rollback:SUBSYSTEM`, `recovery:SUBSYSTEM` (after crash recovery converged
it); the engine's points also fire as `KIND/POINT` (`apply/step:links`).
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
        if name != point:
            continue
        if action:
            time.sleep(float(action))
        else:
            os.kill(os.getpid(), signal.SIGKILL)
