"""Where unix sockets go: the run directory while the path fits the daemon's limit, else a
short directory that is reused, named by its owner, and removed when its daemon stops."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from trueup.system.daemon import DaemonSupervisor
from trueup.system.daemonspec import DaemonSpec
from trueup.system.haproxy import haproxy_paths
from trueup.system.kea import kea_paths
from trueup.system.knot import knot_paths
from trueup.system.sockets import (
    HAPROXY_MAX,
    SUN_PATH_MAX,
    remove_socket_dir,
    socket_dir,
    sweep,
    unix_address,
)


def _run_dir(base: Path, length: int) -> Path:
    """A path of exactly `length` characters under `base` (not created)."""
    pad = length - len(str(base)) - 1
    assert pad > 0
    return base / ("d" * pad)


@pytest.mark.parametrize("length", range(60, 111))
def test_every_socket_path_fits_its_daemon_whatever_the_run_directory_length(
    length: int,
) -> None:
    run = _run_dir(Path("/var/lib/trueup-test"), length)
    haproxy = haproxy_paths(run)
    assert len(str(haproxy.master)) <= HAPROXY_MAX and len(str(haproxy.stats)) <= HAPROXY_MAX
    # Kept beside their files while they fit: moved only when they must be.
    assert (haproxy.master.parent == run) == (len(str(run / "master.sock")) <= HAPROXY_MAX)
    assert len(str(kea_paths(run, 4).socket)) <= SUN_PATH_MAX
    assert len(str(kea_paths(run, 6).socket)) <= SUN_PATH_MAX
    assert len(str(knot_paths(run).socket)) <= SUN_PATH_MAX


def test_a_moved_directory_is_reused_named_by_its_owner_and_removed_only_for_it(
    tmp_path: Path,
) -> None:
    root = tmp_path / "rt"
    owner = tmp_path / ("o" * 40)
    owner.mkdir()
    first = socket_dir(owner, ("a.sock",), 20, prefix="x-", root=root)
    assert first.parent == root and first.name.startswith("x-")
    assert first.stat().st_mode & 0o777 == 0o700
    assert (first / "owner").read_text() == str(owner)
    assert socket_dir(owner, ("a.sock",), 20, prefix="x-", root=root) == first  # reused
    assert socket_dir(owner, ("a.sock",), 200, prefix="x-", root=root) == owner  # fits
    (first / "a.sock").write_text("")
    assert not remove_socket_dir(first, tmp_path / "someone-else")
    assert first.exists()
    assert remove_socket_dir(first, owner)
    assert not first.exists()


def test_a_symlink_in_place_of_the_directory_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "rt"
    owner = tmp_path / "owner-directory-with-a-long-name"
    victim = tmp_path / "victim"
    victim.mkdir()
    probe = socket_dir(owner, ("a.sock",), 10, prefix="x-", root=root, create=False)
    root.mkdir()
    probe.symlink_to(victim)
    with pytest.raises(OSError, match="not a directory of this user"):
        socket_dir(owner, ("a.sock",), 10, prefix="x-", root=root)
    assert list(victim.iterdir()) == []


def test_sweep_removes_the_directories_of_gone_owners_only(tmp_path: Path) -> None:
    root = tmp_path / "rt"
    alive, gone = tmp_path / "alive-owner", tmp_path / "gone-owner"
    alive.mkdir()
    gone.mkdir()
    kept = socket_dir(alive, ("a.sock",), 10, prefix="x-", root=root)
    dropped = socket_dir(gone, ("a.sock",), 10, prefix="x-", root=root)
    gone.rmdir()
    assert sweep(root) == [dropped.name]
    assert kept.exists() and not dropped.exists()


def test_sweep_removes_an_old_layout_directory_only_when_no_socket_lives_and_it_is_quiet(
    tmp_path: Path,
) -> None:
    root = tmp_path / "rt"
    root.mkdir()
    dead, live, empty = root / "haproxy-dead", root / "haproxy-live", root / "haproxy-empty"
    dead.mkdir()
    live.mkdir()
    empty.mkdir()
    (root / "40-1.pid").write_text("{}")  # not a directory: the agent lock's, never touched
    listening = socket.socket(socket.AF_UNIX)
    listening.bind(str(live / "stats.sock"))
    listening.listen(1)
    closed = socket.socket(socket.AF_UNIX)
    closed.bind(str(dead / "stats.sock"))
    closed.close()  # its file stays, nobody listens
    try:
        assert sweep(root) == []  # both changed just now
        later = os.lstat(dead).st_mtime + 3600
        assert sorted(sweep(root, now=later)) == ["haproxy-dead", "haproxy-empty"]
        assert live.exists() and not dead.exists() and not empty.exists()
        assert (root / "40-1.pid").exists()
    finally:
        listening.close()


def test_a_socket_path_longer_than_sun_path_is_bound_and_reached(tmp_path: Path) -> None:
    directory = tmp_path / ("s" * 120)
    directory.mkdir()
    path = directory / "agent.sock"
    assert len(str(path)) > SUN_PATH_MAX
    server = socket.socket(socket.AF_UNIX)
    try:
        with unix_address(path) as address:
            server.bind(address)
        server.listen(1)
        assert path.is_socket()
        with socket.socket(socket.AF_UNIX) as client, unix_address(path) as address:
            client.connect(address)
    finally:
        server.close()


def test_stopping_a_daemon_removes_its_moved_socket_directory(tmp_path: Path) -> None:
    supervisor = DaemonSupervisor(tmp_path / "run")
    run = supervisor.run_dir("sleeper")
    moved = socket_dir(run, ("x.sock",), 10, prefix="sleeper-", root=tmp_path / "rt")
    try:
        supervisor.ensure(DaemonSpec("sleeper", ("/bin/sleep", "3600"), sockets=moved))
        assert moved.exists()
        supervisor.stop("sleeper")
        assert not moved.exists()
    finally:
        supervisor.stop("sleeper")
        supervisor.close()


def test_closing_the_supervisor_keeps_a_running_daemons_directory_and_drops_a_stopped_ones(
    tmp_path: Path,
) -> None:
    supervisor = DaemonSupervisor(tmp_path / "run")
    runs = {name: supervisor.run_dir(name) for name in ("running", "exited")}
    moved = {
        name: socket_dir(run, ("x.sock",), 10, prefix=f"{name}-", root=tmp_path / "rt")
        for name, run in runs.items()
    }
    supervisor.ensure(DaemonSpec("running", ("/bin/sleep", "3600"), sockets=moved["running"]))
    starts: list[int] = []

    def once() -> None:
        # Only the first start: the supervisor's restarts of the exited daemon fail, so it
        # cannot be running again by chance when close() looks (a loaded machine).
        starts.append(1)
        if len(starts) > 1:
            raise OSError("not restarted in this test")

    supervisor.ensure(
        DaemonSpec("exited", ("/bin/true",), before_start=once, sockets=moved["exited"])
    )
    try:
        deadline = time.monotonic() + 60
        while supervisor.running("exited") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not supervisor.running("exited")
        supervisor.close()
        assert moved["running"].exists() and not moved["exited"].exists()
    finally:
        supervisor.stop("running")
