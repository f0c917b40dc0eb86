"""Processes by what the kernel says of them: sessions, liveness, a daemon's own last words.

Who uses this: the daemon supervisor (`trueup.system.daemon`), which ends
what a killed instance left in its session before it starts a new one, and
names a daemon that exits at once by its own last log lines.

```python
left = session_members(recorded_pid, recorded_start_time)   # the old instance's session
signal_all(left, signal.SIGTERM)                                # pid → start time
wait_gone(left, timeout=10.0)
log_tail(Path("run/haproxy/haproxy.log"), offset)          # "[ALERT] … cannot bind socket …"
```

Every reading is from `/proc/PID/stat` (fields after the last `)`: the
command name may hold spaces and parentheses). A zombie counts as gone.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from pathlib import Path

from trueup.system.safefile import open_file, read_file

__all__ = [
    "TAIL_LINES",
    "clear_stale_pidfile",
    "log_tail",
    "session_members",
    "signal_all",
    "stat_fields",
    "wait_gone",
]

# How many of a daemon's own last log lines name why it failed.
TAIL_LINES = 6


def stat_fields(pid: int) -> list[str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :].split()


def session_members(
    session: int, started: int | None, proc: Path = Path("/proc"), marker: str | None = None
) -> dict[int, int]:
    """Live processes of session `session` started no earlier than `started`: pid → start time.

    With `marker` (`NAME=VALUE`), only those whose environment holds it. The
    start time goes with each pid so that a pid reused after it exits is
    never taken for it (`signal_all`, `wait_gone`)."""
    members: dict[int, int] = {}
    if session <= 1:
        return members
    try:
        names = os.listdir(proc)
    except OSError:
        return members
    for name in names:
        if not name.isdigit():
            continue
        try:
            stat = (proc / name / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        try:
            state, sid, begun = fields[0], int(fields[3]), int(fields[19])
        except (IndexError, ValueError):
            continue
        if sid != session or state in ("Z", "X"):
            continue
        if started is not None and begun < started:
            continue
        if marker is not None and not _carries(proc / name, marker):
            continue
        members[int(name)] = begun
    return dict(sorted(members.items()))


def _carries(directory: Path, marker: str) -> bool:
    """Whether the process's environment (as it started) holds `marker` (`NAME=VALUE`)."""
    try:
        environ = (directory / "environ").read_bytes()
    except OSError:
        return False
    return marker.encode() in environ.split(b"\0")


_CAUSE = re.compile(r"alert|error|fatal|fail|cannot|can't|refus|denied|already", re.IGNORECASE)


# The supervisor writes this before each instance's output: a reader that did not start
# the instance (a new agent, the CLI) finds where the last instance's own words begin.
START_MARK = "-- trueup: a new instance starts here --"


def log_tail(
    path: Path,
    offset: int = 0,
    lines: int = TAIL_LINES,
    *,
    causes_only: bool = False,
    last_instance: bool = False,
) -> str:
    """The daemon's own last words after `offset`, joined by ` | `: the last `lines` lines
    that name a problem (alert, error, cannot, …), else its last `lines` lines (with
    `causes_only`: nothing). `last_instance`: only what follows the last `START_MARK`."""
    try:
        # never through a link planted in the run directory (it would show another file's lines)
        with os.fdopen(open_file(path, os.O_RDONLY), "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            handle.seek(max(offset, size - 65536))
            text = handle.read().decode(errors="replace")
    except OSError:
        return ""
    if last_instance and START_MARK in text:
        text = text.rsplit(START_MARK, 1)[1]
    every = [line.strip() for line in text.splitlines() if line.strip()][-50:]
    causes = [line for line in every if _CAUSE.search(line)]
    if causes_only and not causes:
        return ""
    return " | ".join((causes or every)[-lines:])[-800:]


def _alive(pid: int, begun: int) -> bool:
    """Whether `pid` still is the process that started at `begun` (and not a zombie)."""
    fields = stat_fields(pid)
    if fields is None or len(fields) < 20 or fields[0] in ("Z", "X"):
        return False
    return fields[19] == str(begun)


def signal_all(members: dict[int, int], sig: int) -> None:
    """`sig` to each pid that still is the process of its start time."""
    for pid, begun in members.items():
        if _alive(pid, begun):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)


def wait_gone(members: dict[int, int], timeout: float) -> bool:
    """Until none of `members` (pid → start time) is alive; True when none is."""
    deadline = time.monotonic() + timeout
    while True:
        if not any(_alive(pid, begun) for pid, begun in members.items()):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


def _stale_reason(pid: int, argv: tuple[str, ...], what: str, proc: Path) -> str | None:
    """Why `pid` is not a live `what` running `argv`, or None when it is one."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return f"process {pid} is gone"
    # The command name may hold spaces and parentheses: the state follows the last ')'.
    fields = stat[stat.rfind(")") + 2 :].split()
    if not fields or fields[0] in ("Z", "X"):
        return f"process {pid} is a zombie (not reaped)"
    cmdline = tuple(part.decode(errors="replace") for part in raw.split(b"\0") if part)
    ours = (
        len(cmdline) == len(argv)
        and Path(cmdline[0]).name == Path(argv[0]).name
        and cmdline[1:] == argv[1:]
    )
    if not ours:
        return f"process {pid} is not this {what} ({' '.join(cmdline)[:80] or 'no command line'})"
    return None


def clear_stale_pidfile(
    pidfile: Path, argv: tuple[str, ...], what: str, proc: Path = Path("/proc")
) -> str | None:
    """Before a start: remove a daemon's own pid file when it names no live `what` of ours.

    Kea and Knot refuse to start while their pid file names a process that
    `kill(pid, 0)` finds — a zombie of a killed instance not yet reaped, or an
    unrelated process that reused the pid. The file is removed then (what was
    removed and why is returned); the pid file of a live daemon running `argv`
    is left alone, and nothing is ever killed.
    """
    try:
        text = read_file(pidfile, 64).decode(errors="replace").strip()
    except FileNotFoundError:
        return None
    try:
        pid = int(text)
        reason = _stale_reason(pid, argv, what, proc) if pid > 1 else f"pid {pid} is invalid"
    except ValueError:
        reason = f"{text[:20]!r} is not a pid"
    if reason is None:
        return None
    pidfile.unlink(missing_ok=True)
    return f"{pidfile}: removed, {reason}"
