"""The kernel's view of processes: a session's members, and a pid never taken for another."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from trueup.system.pidrecord import proc_start_time
from trueup.system.processes import log_tail, session_members, signal_all, wait_gone


def test_a_session_is_found_by_its_id_and_a_pid_with_another_start_time_is_left_alone() -> None:
    leader = subprocess.Popen(["/bin/sh", "-c", "/bin/sleep 3600 & wait"], start_new_session=True)
    try:
        started = proc_start_time(leader.pid)
        assert started is not None
        members: dict[int, int] = {}
        deadline = time.monotonic() + 60
        while len(members) < 2:  # the shell and the sleep it forked
            assert time.monotonic() < deadline, members
            members = session_members(leader.pid, started)
        assert leader.pid in members and os.getpid() not in members
        # The same pids with another start time are not these processes: never signalled.
        others = {pid: begun + 1 for pid, begun in members.items()}
        signal_all(others, signal.SIGKILL)
        assert wait_gone(others, 0.1)
        assert leader.poll() is None
        signal_all(members, signal.SIGKILL)
        leader.wait(timeout=60)
        assert wait_gone(members, 60.0)
    finally:
        if leader.poll() is None:
            leader.kill()
            leader.wait()


def test_the_last_lines_prefer_those_naming_a_problem(tmp_path: Path) -> None:
    log = tmp_path / "d.log"
    log.write_text("old: cannot start\n")
    offset = log.stat().st_size
    with open(log, "a") as out:
        out.write("[NOTICE] version 2.6\n[ALERT] cannot bind socket\n[NOTICE] exiting\n")
    assert log_tail(log, offset) == "[ALERT] cannot bind socket"  # not the older run's
    log.write_text("starting\nlistening nowhere\n")
    assert log_tail(log) == "starting | listening nowhere"
