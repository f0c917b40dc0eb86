"""What evidence and doctor read about the host: kernel, daemon versions, the agent's log.

Who calls this: `trueup.backup.evidence` (the bundle) and the doctor
checks. Every probe is bounded (a short timeout per program) and never
raises: a missing program is reported as absent.

The agent's log: under systemd (the agent's cgroup names a `.service`) the
last lines come from `journalctl -u UNIT`; otherwise from `STATE_DIR/agent.log`,
which the agent writes itself (`trueup.agent.launch`).
"""

from __future__ import annotations

import os
import platform
import re
from collections import deque
from pathlib import Path
from typing import TypedDict

from trueup.system.runner import Runner, SubprocessRunner
from trueup.system.safefile import UnsafeFile, open_file

__all__ = [
    "AGENT_LOG",
    "LogSource",
    "agent_log_lines",
    "daemon_versions",
    "kernel",
    "network_namespace",
    "systemd_unit",
    "unit_of_cgroup",
]

AGENT_LOG = "agent.log"
_PROBE_TIMEOUT = 3.0
_VERSION_PROBES: dict[str, list[str]] = {
    "kea-dhcp4": ["kea-dhcp4", "-V"],
    "nft": ["nft", "--version"],
    "haproxy": ["haproxy", "-v"],
    "keepalived": ["keepalived", "--version"],
    "knotd": ["knotd", "--version"],
    "wg": ["wg", "--version"],
    "ip": ["ip", "-V"],
}


def kernel() -> dict[str, str]:
    uname = platform.uname()
    return {"system": uname.system, "release": uname.release, "version": uname.version}


def network_namespace() -> str | None:
    """The network namespace this process observes (`net:[INODE]`), None when unreadable."""
    try:
        return os.readlink("/proc/self/ns/net")
    except OSError:
        return None


def daemon_versions(runner: Runner | None = None) -> dict[str, str | None]:
    """The first line each daemon prints for its version; None when it is not installed."""
    runner = runner or SubprocessRunner()
    out: dict[str, str | None] = {}
    for name, argv in _VERSION_PROBES.items():
        done = runner.run(argv, timeout=_PROBE_TIMEOUT)
        text = (done.stdout or done.stderr).strip()
        out[name] = text.splitlines()[0][:200] if done.returncode != 127 and text else None
    return out


def unit_of_cgroup(cgroup: str) -> str | None:
    """The `.service` a `/proc/PID/cgroup` text names (the innermost), or None."""
    found = re.findall(r"/([^/\s]+\.service)(?:/|$)", cgroup, re.MULTILINE)
    return found[-1] if found else None


def systemd_unit(pid: int | None) -> str | None:
    """The systemd service the process runs under, from its cgroup; None when not one."""
    if not pid:
        return None
    try:
        return unit_of_cgroup(Path(f"/proc/{pid}/cgroup").read_text())
    except OSError:
        return None


def _tail(path: Path, lines: int) -> list[str]:
    # Never through a link, never a FIFO (that would block): trueup.system.safefile.
    with os.fdopen(open_file(path, os.O_RDONLY), encoding="utf-8", errors="replace") as handle:
        return [line.rstrip("\n") for line in deque(handle, maxlen=lines)]


class LogSource(TypedDict, total=False):
    """Where the agent's log lines came from (`source`: None when none was found) and, when
    none was found, what was tried (`missing`)."""

    source: str | None
    missing: str


def agent_log_lines(
    state_dir: Path,
    pid: int | None,
    lines: int = 200,
    runner: Runner | None = None,
    unit: str | None = None,
) -> tuple[list[str], LogSource]:
    """The last `lines` lines of the agent's log and where they came from (`source`, `missing`).

    `unit`: the agent's systemd service; found from `pid`'s cgroup when not given.
    """
    unit = unit or systemd_unit(pid)
    tried: list[str] = []
    if unit is not None:
        done = (runner or SubprocessRunner()).run(
            ["journalctl", "-u", unit, "-n", str(lines), "--no-pager", "-o", "short-iso"],
            timeout=10.0,
        )
        if done.ok and done.stdout.strip():
            return done.stdout.splitlines()[-lines:], {"source": f"journald unit {unit}"}
        tried.append(f"journalctl -u {unit}: {(done.stderr or 'no lines').strip()[:200]}")
    path = Path(state_dir) / AGENT_LOG
    if path.exists():
        try:
            found = _tail(path, lines)
            # the rotated file holds what came before, when the current one is short
            older = path.with_name(AGENT_LOG + ".1")
            if len(found) < lines and older.exists():
                found = _tail(older, lines - len(found)) + found
            return found, {"source": str(path)}
        except UnsafeFile as exc:
            tried.append(str(exc))
        except OSError as exc:
            tried.append(f"{path}: {os.strerror(exc.errno or 0)}")
    else:
        tried.append(f"{path}: does not exist (no agent has run here since logging to it)")
    return [], {"source": None, "missing": "; ".join(tried)}
