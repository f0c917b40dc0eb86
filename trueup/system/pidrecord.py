"""A daemon's pid record (`RUN_DIR/NAME/NAME.pid`) and whether it still names its process.

Who uses this: the supervisor (`trueup.system.daemon`), which writes the record
at every start and adopts the instance it names after an agent restart, and
whoever must reach a running daemon without the supervisor (the DHCP fence
hook, from the CLI or a restore). A record names its process only while
`/proc/PID/cmdline` equals the recorded argv and `/proc/PID/stat`'s start time
equals the recorded one: a recycled pid is never trusted. A daemon that
re-executes itself on a reload with words added to its argv (HAProxy's
master: `-sf PIDS -x SOCKET`; `DaemonSpec.reexec`, kept in the record as
`reexec`) is verified by its program name and start time instead of its
whole cmdline.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import TypedDict

__all__ = [
    "INSTANCE_ENV",
    "PidRecord",
    "cmdline_of",
    "proc_start_time",
    "record_argv",
    "same_program",
    "verified_pid",
]

# The environment variable marking an instance and everything it forks (its value is in
# the pid record): a leftover is signalled only when it carries its instance's mark.
INSTANCE_ENV = "TRUEUP_DAEMON_INSTANCE"


class PidRecord(TypedDict, total=False):
    """The pid record as the supervisor writes it (JSON)."""

    pid: int
    argv: list[str]
    # The kernel's start time of `pid` (clock ticks since boot).
    start_time: int | None
    # When the supervisor started it (epoch seconds).
    since: float | None
    # It re-executes itself on a reload (HAProxy's master): verified by program name.
    reexec: bool
    # The mark in its environment (`INSTANCE_ENV`).
    instance: str
    # Its socket directory when moved out of the run directory.
    sockets: str


def proc_start_time(pid: int) -> int | None:
    """The kernel's start time of `pid` (clock ticks since boot), or None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may contain spaces and parentheses: fields start after the last ')'.
    fields = stat[stat.rfind(")") + 2 :].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def cmdline_of(pid: int) -> tuple[str, ...] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return tuple(part.decode(errors="replace") for part in raw.split(b"\0") if part)


def record_argv(record: Mapping[str, object]) -> tuple[str, ...]:
    argv = record.get("argv")
    return tuple(str(a) for a in argv) if isinstance(argv, list) else ()


def same_program(cmdline: tuple[str, ...], argv: tuple[str, ...], reexec: bool) -> bool:
    if cmdline == argv:
        return True
    # A self-re-executing daemon (the record says so): its program name, or an
    # empty cmdline while the exec is in progress; the start time is checked too.
    return reexec and (not cmdline or cmdline[0] == argv[0])


def verified_pid(record: Mapping[str, object]) -> int | None:
    """The record's pid when that process still is the one recorded (argv and start time)."""
    try:
        pid = int(str(record["pid"]))
        argv = record_argv(record)
        started = int(str(record["start_time"]))
    except (KeyError, TypeError, ValueError):
        return None
    if pid <= 1 or not argv or proc_start_time(pid) != started:
        return None
    cmdline = cmdline_of(pid)
    for _ in range(200):
        # Empty while the kernel is still laying out a fresh exec's arguments (just
        # after `Popen` returns): look again for up to about 0.2 s.
        if cmdline != ():
            break
        time.sleep(0.001)
        cmdline = cmdline_of(pid)
    if cmdline is None or not same_program(cmdline, argv, bool(record.get("reexec"))):
        return None
    return pid
