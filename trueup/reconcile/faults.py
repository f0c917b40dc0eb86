"""Test-only fault points: `TRUEUP_FAULT=POINT[:sleep=SECONDS|:wait=PATH]`.

At the named point the process kills itself with SIGKILL (or sleeps, to hold
the writer lock; or waits until PATH exists, at most five minutes, so a test
can change the world — fill the state directory — at exactly that point).
Points: `begin`, `step:SUBSYSTEM` (after the first step of a subsystem),
`applied:SUBSYSTEM`, `before-commit`, `after-commit`, `rollback:SUBSYSTEM`,
`recovery:SUBSYSTEM` (after crash recovery converged it); the engine's points
also fire as `KIND/POINT` (`apply/step:links`).
Unset in production, where `hit()` is one dictionary lookup. The agent
checks the variable when it starts (`problems`) and logs every entry that
names no fault point or has a bad action — a mistyped point never fires, so
a test set up with one would otherwise pass without the crash it asked for.
A malformed action never raises at its point: the entry is ignored there.
"""

from __future__ import annotations

import math
import os
import signal
import time
from collections.abc import Iterable

from trueup.journal.restore import STATES as RESTORE_STATES

__all__ = ["hit", "problems"]

BARE = ("begin", "before-commit", "after-commit")
PER_SUBSYSTEM = ("step", "applied", "rollback", "recovery")


def _parse(entry: str) -> tuple[str, str, str]:
    """(point, sleep seconds text, wait path) of one `POINT[:sleep=S|:wait=PATH]` entry."""
    name, _, action = entry.partition(":sleep=")
    name, _, wait_for = name.partition(":wait=")
    return name, action, wait_for


def _seconds(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def problems(spec: str, subsystems: Iterable[str]) -> list[str]:
    """What is wrong with `TRUEUP_FAULT=spec` for an agent running `subsystems`; [] when fine."""
    names = set(subsystems)
    out: list[str] = []
    for entry in spec.split(","):
        if not entry:
            continue
        point, sleep, wait_for = _parse(entry)
        if ":sleep=" in entry and _seconds(sleep) is None:
            out.append(f"{entry!r}: sleep= takes seconds (a number, 0 or more), not {sleep!r}")
        if ":wait=" in entry and not wait_for:
            out.append(f"{entry!r}: wait= takes a path")
        bare = point.split("/", 1)[1] if "/" in point else point
        where, _, what = bare.partition(":")
        if bare in BARE or (where in PER_SUBSYSTEM and what in names):
            continue
        if where == "restore" and what in RESTORE_STATES:
            continue
        out.append(
            f"{entry!r}: {point!r} is no fault point, so it never fires (points: "
            f"{', '.join(BARE)}, {'|'.join(PER_SUBSYSTEM)}:SUBSYSTEM with SUBSYSTEM one of "
            f"{', '.join(sorted(names))}, restore:STATE, each also as KIND/POINT)"
        )
    return out


def hit(point: str) -> None:
    spec = os.environ.get("TRUEUP_FAULT")
    if not spec:
        return
    for entry in spec.split(","):
        name, action, wait_for = _parse(entry)
        if name != point:
            continue
        if wait_for:
            deadline = time.monotonic() + 300.0
            while not os.path.exists(wait_for) and time.monotonic() < deadline:
                time.sleep(0.05)
        elif ":sleep=" in entry:
            seconds = _seconds(action)
            if seconds is not None:  # a bad one was logged at start (`problems`)
                time.sleep(seconds)
        else:
            os.kill(os.getpid(), signal.SIGKILL)
