"""The allocator fence as Kea sees it: a configuration that drops every packet, and `dhcp-disable`.

Two layers, so that a fenced Kea never answers a client at any moment:

* the configuration. While the `dhcp` fence is held, every configuration
  trueup gives Kea carries the fence class (`keaconfig.FENCE_CLASS`, Kea's
  special class `DROP` matching every packet): the file Kea *starts* from
  (the supervisor's before-start hook compiles it with the fence as the
  record says at that moment), every `config-set`, and its rollback. A Kea
  started, restarted after a crash, reconfigured, or switched to another HA
  state by its own HA hook (which enables its service itself on some state
  changes) drops the first packet it receives.
* `dhcp-disable`, sent as soon as the socket answers. Kea 2.2 does not report
  whether allocation is disabled, and a restarted Kea starts enabled, so
  trueup records what it asserted for *which* Kea process (`allocator.json`:
  pid, kernel start time, state).

`allocation_state` compares both with the fence record (a new pid means
nothing was asserted yet); `enforce` makes Kea follow the record: the
supervisor calls it after every (re)start, the subsystem whenever they
disagree, and the CLI and the restore right after holding or lifting the
fence. Holding disables first and then sets the fence class; lifting removes
the class and then enables, so a client is answered again at once.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from trueup.subsystems.dhcp.keaconfig import has_fence, with_fence
from trueup.system.atomicfile import write_atomic
from trueup.system.daemon import proc_start_time
from trueup.system.fence import read_fence
from trueup.system.kea import KeaError, KeaPaths, kea_call
from trueup.system.processes import stat_fields
from trueup.system.safefile import read_file

__all__ = ["CONSISTENT", "allocation_state", "enforce", "fence_config_file", "wait_for_socket"]

CONSISTENT = "follows-fence"


def wait_for_socket(paths: KeaPaths, timeout: float = 15.0, pid: int | None = None) -> None:
    """Wait until Kea answers `status-get`; raises KeaError with the last answer, at once
    when the process `pid` has exited (its own log says why: the supervisor shows it)."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    watched = pid is not None and _exists(pid)  # a pid seen running, then gone: exited
    while time.monotonic() < deadline:
        if watched and pid is not None and not _exists(pid):
            raise KeaError(f"kea-dhcp{paths.family} (pid {pid}) exited before it answered")
        try:
            kea_call(paths, "status-get", timeout=2.0)
            return
        except KeaError as exc:
            last = exc
        time.sleep(0.05)
    raise KeaError(f"kea-dhcp{paths.family} did not answer within {timeout:g}s: {last}")


def _exists(pid: int) -> bool:
    fields = stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def _record(paths: KeaPaths) -> dict[str, object]:
    try:
        data = json.loads(read_file(paths.allocator))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def allocation_state(
    paths: KeaPaths, state_dir: Path, pid: int | None, running: dict[str, Any] | None = None
) -> str:
    """`follows-fence`, or what is wrong: `serving while fenced`, `dropping without a
    fence` (the fence class), `disabled without a fence` (`dhcp-disable`).

    `running` is Kea's configuration (`config-get`) when it answered: its fence
    class must be there exactly while the fence is held.
    """
    fenced = read_fence(state_dir, "dhcp") is not None
    if running is not None:
        dropping = has_fence(running)
        if fenced and not dropping:
            return "serving while fenced"
        if dropping and not fenced:
            return "dropping without a fence"
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


def fence_config_file(paths: KeaPaths, held: bool) -> bool:
    """The configuration file Kea starts from, with the fence class exactly when `held`.

    A Kea started from it by anyone (the supervisor, an operator, a crash
    restart while the agent is down) drops every packet while the fence is
    held. Nothing else in the file changes; no file, nothing to do. True when
    the file was rewritten.
    """
    try:
        config = json.loads(read_file(paths.config))
    except (OSError, ValueError):
        return False  # none, or unreadable: no Kea starts from it (the supervisor writes it)
    if not isinstance(config, dict) or has_fence(config) == held:
        return False
    text = json.dumps(with_fence(config, held), indent=2, sort_keys=True) + "\n"
    write_atomic(paths.config, text.encode(), 0o600)
    return True


def enforce(
    paths: KeaPaths,
    state_dir: Path,
    pid: int,
    *,
    wait: float = 15.0,
    fenced: bool | None = None,
) -> str:
    """Make Kea follow the fence: the fence class and `dhcp-disable` while held, else neither.

    A configuration that disagrees is set (`config-set`, `config-write`) from
    what Kea runs, with the fence class added or removed and nothing else changed.
    `fenced` overrides the fence record: the restore enforces the fence on Kea
    *before* it writes the record, so the record never says held while Kea serves.
    """
    wait_for_socket(paths, wait, pid)
    if fenced is None:
        fenced = read_fence(state_dir, "dhcp") is not None
    state = "disabled" if fenced else "enabled"
    if fenced:
        kea_call(paths, "dhcp-disable")  # at once: the configuration follows
    running = kea_call(paths, "config-get", timeout=5.0)
    if has_fence(running) != fenced:
        # Only the server's own body: newer Keas answer with keys that are not configuration.
        body = {key: value for key, value in running.items() if key in ("Dhcp4", "Dhcp6")}
        changed = with_fence(body, fenced)
        kea_call(paths, "config-set", changed)
        kea_call(paths, "config-write", {"filename": str(paths.config)})
    # After a config-set too: a reconfiguration must not leave a fenced Kea enabled.
    kea_call(paths, "dhcp-disable" if fenced else "dhcp-enable")
    record = {"pid": pid, "start_time": proc_start_time(pid), "state": state}
    write_atomic(paths.allocator, json.dumps(record).encode(), 0o600)
    return state
