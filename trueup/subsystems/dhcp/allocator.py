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
disagree, and `follow_fence` — the subsystem's fence hook
(`DhcpSubsystem.follow_fence`), which the CLI and the restore call right
after holding or lifting the fence — for every Kea trueup runs from a state
directory, with or without an agent. Holding disables first and then sets the fence class; lifting removes
the class and then enables, so a client is answered again at once.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import TypedDict

from trueup.model.jsontypes import JSONObject
from trueup.subsystems.base import FenceFollowed
from trueup.subsystems.daemonkit import RunRecord, read_json, write_file
from trueup.subsystems.dhcp.keaconfig import has_fence, with_fence
from trueup.system.fence import read_fence
from trueup.system.kea import KeaError, KeaPaths, daemon_name, kea_call, kea_paths
from trueup.system.pidrecord import proc_start_time, verified_pid
from trueup.system.processes import signal_all, stat_fields, wait_gone
from trueup.system.sources import Files, HostFiles

__all__ = [
    "CONSISTENT",
    "allocation_state",
    "enforce",
    "fence_config_file",
    "follow_fence",
    "wait_for_socket",
]

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


class Asserted(TypedDict, total=False):
    """The run record `allocator.json`: what trueup asserted for which Kea process."""

    pid: int
    # The process's kernel start time (a new Kea with a reused pid asserted nothing yet).
    start_time: int | None
    state: str  # "disabled" | "enabled"


def _asserted(paths: KeaPaths) -> RunRecord[Asserted]:
    return RunRecord(paths.allocator, sort_keys=False)


def allocation_state(
    paths: KeaPaths,
    state_dir: Path,
    pid: int | None,
    running: JSONObject | None = None,
    *,
    files: Files | None = None,
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
    record = _asserted(paths).read(files or HostFiles())
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


def fence_config_file(paths: KeaPaths, held: bool, *, files: Files | None = None) -> bool:
    """The configuration file Kea starts from, with the fence class exactly when `held`.

    A Kea started from it by anyone (the supervisor, an operator, a crash
    restart while the agent is down) drops every packet while the fence is
    held. Nothing else in the file changes; no file, nothing to do. True when
    the file was rewritten.
    """
    files = files or HostFiles()
    # {}: none, or unreadable: no Kea starts from it (the supervisor writes it).
    config = read_json(files, paths.config)
    if not config or has_fence(config) == held:
        return False
    text = json.dumps(with_fence(config, held), indent=2, sort_keys=True) + "\n"
    write_file(files, paths.config, text)
    return True


def enforce(
    paths: KeaPaths,
    state_dir: Path,
    pid: int,
    *,
    wait: float = 15.0,
    fenced: bool | None = None,
    files: Files | None = None,
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
    record: Asserted = {"pid": pid, "start_time": proc_start_time(pid), "state": state}
    _asserted(paths).write(files or HostFiles(), record)
    return state


def follow_fence(
    state_dir: Path,
    *,
    fenced: bool | None = None,
    wait: float = 5.0,
    end_hung: bool = False,
) -> list[FenceFollowed]:
    """Every Kea trueup runs from `state_dir` follows the fence now (the record, or `fenced`).

    For each family with a run directory: the file it starts from gets the fence
    class exactly while fenced (a Kea started from it by anyone drops), and a
    running Kea (its verified pid) is made to follow (`enforce`). With `fenced`
    given (the restore, enforcing before it records) a file that cannot be
    written raises, and a Kea that does not take the fence raises `KeaError`
    naming it — unless it did not answer at all and `end_hung` ended it (it could
    serve the moment it went on; its next start is from the fenced file).
    Otherwise what went wrong is reported (the subsystem asserts it again).
    """
    held = read_fence(state_dir, "dhcp") is not None if fenced is None else fenced
    files = HostFiles()  # the CLI's and the restore's: no agent's Sources
    out: list[FenceFollowed] = []
    for family in (4, 6):
        name = daemon_name(family)
        run = state_dir / "run" / name
        if not run.is_dir():
            continue
        paths = kea_paths(run, family)
        try:
            fence_config_file(paths, held, files=files)
        except OSError:
            if fenced is not None:
                raise
            # The supervisor writes it, fenced as the record says, before Kea's next start.
        pid = _kea_pid(files, paths)
        if pid is None:
            continue
        try:
            state = enforce(paths, state_dir, pid, wait=wait, fenced=fenced, files=files)
        except (KeaError, OSError) as exc:
            if end_hung and _timed_out(exc) and _ended(pid):
                out.append(FenceFollowed(name, problem=str(exc), ended=True))
                continue
            if fenced is not None:
                raise KeaError(f"{name} (pid {pid}) did not take the fence: {exc}") from exc
            out.append(FenceFollowed(name, problem=str(exc)))
            continue
        out.append(FenceFollowed(name, state=state))
    return out


def _kea_pid(files: Files, paths: KeaPaths) -> int | None:
    """The running Kea's pid from the supervisor's record, when it still is that Kea."""
    record = read_json(files, paths.run_dir / f"{daemon_name(paths.family)}.pid")
    return verified_pid(record) if record else None


def _timed_out(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, TimeoutError) or "timed out" in str(seen):
            return True
        seen = seen.__cause__
    return False


def _ended(pid: int) -> bool:
    """SIGKILL to `pid` (still the process it was); True once it is gone."""
    begun = proc_start_time(pid)
    if begun is None:
        return True
    members = {pid: begun}
    signal_all(members, signal.SIGKILL)
    return wait_gone(members, 10.0)
