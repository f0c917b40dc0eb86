"""The daemon supervisor on real (harmless) processes: start, adopt, verify, restart, stop."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from trueup.system.daemon import DaemonSupervisor
from trueup.system.daemonspec import DaemonError, DaemonSpec
from trueup.system.pidrecord import proc_start_time, verified_pid

SLEEP = ("/bin/sleep", "3600")


def wait_until(predicate: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError("condition not met within the bound")


@pytest.fixture
def supervisors(tmp_path: Path) -> Iterator[list[DaemonSupervisor]]:
    made: list[DaemonSupervisor] = []
    yield made
    for supervisor in made:
        supervisor.close()
    # Kill what the test started, by the pid its record names (verified), nothing broader.
    for record_path in (tmp_path / "run").glob("*/*.pid"):
        pid = verified_pid(json.loads(record_path.read_text()))
        if pid is not None:
            os.kill(pid, signal.SIGKILL)


def supervisor(tmp_path: Path, made: list[DaemonSupervisor]) -> DaemonSupervisor:
    made.append(DaemonSupervisor(tmp_path / "run"))
    return made[-1]


def test_start_records_a_verified_pid_in_a_private_directory(
    tmp_path: Path, supervisors: list[DaemonSupervisor]
) -> None:
    calls: list[str] = []
    spec = DaemonSpec(
        "sleeper",
        SLEEP,
        before_start=lambda: calls.append("before"),
        after_start=lambda pid: calls.append(f"after {pid}"),
    )
    status = supervisor(tmp_path, supervisors).ensure(spec)
    assert status.running and status.pid is not None
    assert calls == ["before", f"after {status.pid}"]
    directory = tmp_path / "run" / "sleeper"
    assert directory.stat().st_mode & 0o777 == 0o700
    record = json.loads((directory / "sleeper.pid").read_text())
    assert verified_pid(record) == status.pid


def test_a_new_supervisor_adopts_the_running_instance(
    tmp_path: Path, supervisors: list[DaemonSupervisor]
) -> None:
    first = supervisor(tmp_path, supervisors).ensure(DaemonSpec("sleeper", SLEEP))
    supervisors[0].close()
    again = supervisor(tmp_path, supervisors)
    assert again.running("sleeper")
    status = again.ensure(DaemonSpec("sleeper", SLEEP))
    assert status.pid == first.pid and status.adopted


def test_a_recycled_pid_is_not_trusted(tmp_path: Path, supervisors: list[DaemonSupervisor]) -> None:
    status = supervisor(tmp_path, supervisors).ensure(DaemonSpec("sleeper", SLEEP))
    record_path = tmp_path / "run" / "sleeper" / "sleeper.pid"
    record = json.loads(record_path.read_text())
    # The same pid with another start time (a recycled pid) or another argv is not ours.
    assert verified_pid({**record, "start_time": record["start_time"] + 1}) is None
    assert verified_pid({**record, "argv": ["/bin/sleep", "1"]}) is None
    assert verified_pid({**record, "pid": os.getpid()}) is None
    assert verified_pid(record) == status.pid


def test_an_exited_daemon_is_restarted_and_hooks_run_again(
    tmp_path: Path, supervisors: list[DaemonSupervisor]
) -> None:
    started: list[int] = []
    spec = DaemonSpec("sleeper", SLEEP, after_start=started.append)
    daemons = supervisor(tmp_path, supervisors)
    first = daemons.ensure(spec)
    assert first.pid is not None
    os.kill(first.pid, signal.SIGKILL)
    wait_until(lambda: daemons.status("sleeper").restarts >= 1 and daemons.running("sleeper"))
    assert len(started) == 2 and started[1] != first.pid
    assert daemons.status("sleeper").last_error.startswith("exited")


def test_stop_ends_it_and_supervision(tmp_path: Path, supervisors: list[DaemonSupervisor]) -> None:
    daemons = supervisor(tmp_path, supervisors)
    pid = daemons.ensure(DaemonSpec("sleeper", SLEEP)).pid
    assert pid is not None
    daemons.stop("sleeper")
    assert not daemons.running("sleeper")
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()
    assert not (tmp_path / "run" / "sleeper" / "sleeper.pid").exists()


def test_another_argv_replaces_the_instance(
    tmp_path: Path, supervisors: list[DaemonSupervisor]
) -> None:
    daemons = supervisor(tmp_path, supervisors)
    first = daemons.ensure(DaemonSpec("sleeper", SLEEP))
    second = daemons.ensure(DaemonSpec("sleeper", ("/bin/sleep", "3599")))
    assert second.pid != first.pid and second.running


def test_a_self_re_executing_daemon_is_verified_by_program_and_start_time() -> None:
    pid = os.getpid()
    cmdline = tuple(
        part.decode() for part in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if part
    )
    # As HAProxy's master looks after a reload: its own words inserted after argv[0].
    recorded = {
        "pid": pid,
        "argv": [cmdline[0], "-W", "-f", "x.cfg"],
        "start_time": proc_start_time(pid),
    }
    assert verified_pid(recorded) is None
    assert verified_pid({**recorded, "reexec": True}) == pid
    assert verified_pid({**recorded, "reexec": True, "start_time": 1}) is None
    assert verified_pid({**recorded, "reexec": True, "argv": ["other", "-W"]}) is None


# A parent that leaves a child in its session, as keepalived leaves its VRRP child.
FORKING = ("/bin/sh", "-c", "/bin/sleep 3600 & wait")


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(word) for word in text.split()]


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :].split()[0] != "Z"


def test_a_restart_ends_what_the_killed_instance_left_in_its_session(
    tmp_path: Path, supervisors: list[DaemonSupervisor]
) -> None:
    daemons = supervisor(tmp_path, supervisors)
    first = daemons.ensure(DaemonSpec("forker", FORKING))
    assert first.pid is not None
    wait_until(lambda: bool(_children(first.pid)))  # type: ignore[arg-type]
    (orphan,) = _children(first.pid)
    try:
        os.kill(first.pid, signal.SIGKILL)  # the child survives its parent
        wait_until(lambda: daemons.status("forker").restarts >= 1 and daemons.running("forker"))
        assert not _alive(orphan), "the new instance started beside the old one's child"
        now = daemons.status("forker").pid
        assert now is not None and now != first.pid
        wait_until(lambda: bool(_children(now)))
        daemons.stop("forker")
        # A stop takes the instance's whole session with it.
        assert not _alive(now)
        assert not any(_alive(c) for c in _children(now))
    finally:
        if _alive(orphan):
            os.kill(orphan, signal.SIGKILL)


def test_a_session_the_record_names_is_not_ended_when_its_members_are_not_the_instances(
    tmp_path: Path, supervisors: list[DaemonSupervisor]
) -> None:
    """The recorded pid was reused by a process that made a session and double-forked:
    what is left in that session is someone else's daemon, never signalled."""
    foreign = subprocess.Popen(
        ["/bin/sh", "-c", "/bin/sleep 3600 & exit 0"], start_new_session=True
    )
    started = proc_start_time(foreign.pid)
    foreign.wait(timeout=60)
    stranger = 0
    deadline = time.monotonic() + 60
    while not stranger:  # the sleep the leader left in its session
        assert time.monotonic() < deadline
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    stat = (entry / "stat").read_text()
                except OSError:
                    continue
                if int(stat[stat.rfind(")") + 2 :].split()[3]) == foreign.pid:
                    stranger = int(entry.name)
    try:
        directory = tmp_path / "run" / "sleeper"
        directory.mkdir(parents=True, mode=0o700)
        record = {"pid": foreign.pid, "argv": list(SLEEP), "start_time": started}
        (directory / "sleeper.pid").write_text(json.dumps(record))
        status = supervisor(tmp_path, supervisors).ensure(DaemonSpec("sleeper", SLEEP))
        assert status.running
        assert _alive(stranger), "a process that is not the instance's was ended"
    finally:
        if _alive(stranger):
            os.kill(stranger, signal.SIGKILL)


def test_a_daemon_that_exits_at_once_fails_with_its_own_last_lines(
    tmp_path: Path, supervisors: list[DaemonSupervisor]
) -> None:
    daemons = supervisor(tmp_path, supervisors)
    failing = DaemonSpec(
        "quitter",
        ("/bin/sh", "-c", "echo starting; echo 'cannot bind socket 203.0.113.1:80' >&2; exit 3"),
        ready=lambda pid: False,
    )
    with pytest.raises(DaemonError) as caught:
        daemons.ensure(failing)
    assert "exited at once with status 3" in str(caught.value)
    assert "cannot bind socket 203.0.113.1:80" in str(caught.value)
    assert "cannot bind socket 203.0.113.1:80" in daemons.status("quitter").last_error
    daemons.stop("quitter")


def test_ensure_returns_once_the_instance_answers(
    tmp_path: Path, supervisors: list[DaemonSupervisor]
) -> None:
    marker = tmp_path / "answering"
    spec = DaemonSpec(
        "slow",
        ("/bin/sh", "-c", f"sleep 0.3; : > {marker}; exec /bin/sleep 3600"),
        ready=lambda pid: marker.exists(),
    )
    daemons = supervisor(tmp_path, supervisors)
    status = daemons.ensure(spec)
    try:
        assert marker.exists() and status.running
    finally:
        daemons.stop("slow")  # sh exec'd sleep: the fixture's record check no longer matches


def test_an_instance_that_never_answers_is_a_failure_naming_the_bound(
    tmp_path: Path, supervisors: list[DaemonSupervisor]
) -> None:
    daemons = supervisor(tmp_path, supervisors)
    spec = DaemonSpec(
        "mute", ("/bin/sh", "-c", "echo listening nowhere; exec /bin/sleep 3600"),
        ready=lambda pid: False, ready_timeout=0.5,
    )  # fmt: skip
    with pytest.raises(DaemonError, match=r"did not answer within 0.5s: listening nowhere"):
        daemons.ensure(spec)
    daemons.stop("mute")
