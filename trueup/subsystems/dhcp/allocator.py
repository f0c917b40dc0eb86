"""The allocator fence as Kea sees it: `dhcp-disable` while the `dhcp` fence is held.

Kea 2.2 does not report whether allocation is disabled, and a restarted Kea
starts enabled. So trueup records what it asserted for *which* Kea process
(`allocator.json`: pid, kernel start time, state) and compares that with the
fence record: a new pid means nothing was asserted yet. The supervisor calls
`enforce` after every (re)start, the subsystem whenever the record and the
fence disagree, and the CLI right after holding or lifting the fence.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from trueup.system.atomicfile import write_atomic
from trueup.system.daemon import proc_start_time
from trueup.system.fence import read_fence
from trueup.system.kea import KeaError, KeaPaths, kea_call
from trueup.system.safefile import read_file

__all__ = ["CONSISTENT", "allocation_state", "enforce", "wait_for_socket"]

CONSISTENT = "follows-fence"


def wait_for_socket(paths: KeaPaths, timeout: float = 15.0) -> None:
    """Wait until Kea answers `status-get`; raises KeaError with the last answer."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            kea_call(paths, "status-get", timeout=2.0)
            return
        except KeaError as exc:
            last = exc
        time.sleep(0.05)
    raise KeaError(f"kea-dhcp{paths.family} did not answer within {timeout:g}s: {last}")


def _record(paths: KeaPaths) -> dict[str, object]:
    try:
        data = json.loads(read_file(paths.allocator))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def allocation_state(paths: KeaPaths, state_dir: Path, pid: int | None) -> str:
    """`follows-fence`, or what is wrong: `serving while fenced` / `disabled without a fence`."""
    fenced = read_fence(state_dir, "dhcp") is not None
    record = _record(paths)
    disabled = (
        pid is not None
        and record.get("pid") == pid
        and record.get("start_time") == proc_start_time(pid)
        and record.get("state") == "disabled"
    )
    if fenced and not disabled:
        return "serving while fenced"
    if not fenced and disabled:
        return "disabled without a fence"
    return CONSISTENT


def enforce(paths: KeaPaths, state_dir: Path, pid: int, *, wait: float = 15.0) -> str:
    """Make Kea's allocation follow the fence: `dhcp-disable` while held, else `dhcp-enable`."""
    wait_for_socket(paths, wait)
    fenced = read_fence(state_dir, "dhcp") is not None
    state = "disabled" if fenced else "enabled"
    kea_call(paths, "dhcp-disable" if fenced else "dhcp-enable")
    record = {"pid": pid, "start_time": proc_start_time(pid), "state": state}
    write_atomic(paths.allocator, json.dumps(record).encode(), 0o600)
    return state
