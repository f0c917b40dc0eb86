"""Kea's own pid file before a start: removed when it names no live Kea of ours."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.unit.test_dhcp import sources
from trueup.subsystems.dhcp import DhcpSubsystem
from trueup.system.kea import KeaPaths, clear_stale_pidfile, kea_paths


def _proc(root: Path, pid: int, state: str, argv: tuple[str, ...]) -> None:
    entry = root / str(pid)
    entry.mkdir(parents=True)
    entry.joinpath("stat").write_text(f"{pid} (kea dhcp4) {state} 1 {pid} {pid} 0 -1\n")
    entry.joinpath("cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")


def _paths(tmp_path: Path) -> KeaPaths:
    run = tmp_path / "run" / "kea-dhcp4"
    run.mkdir(parents=True)
    return kea_paths(run, 4)


def test_the_pid_file_is_kea_s_own_name_in_the_run_directory(tmp_path: Path) -> None:
    paths = _paths(tmp_path)
    assert paths.pidfile == paths.run_dir / "kea-dhcp4.kea-dhcp4.pid"
    assert ("KEA_PIDFILE_DIR", str(paths.run_dir)) in paths.env


def test_stale_pid_files_are_removed_and_a_live_kea_s_is_kept(tmp_path: Path) -> None:
    paths = _paths(tmp_path)
    proc = tmp_path / "proc"
    _proc(proc, 4001, "Z", paths.argv)  # a killed Kea nobody reaped
    _proc(proc, 4002, "S", ("/usr/bin/sleep", "600"))  # the pid reused by another process
    _proc(proc, 4003, "S", ("/usr/sbin/kea-dhcp4", "-c", "/elsewhere/kea-dhcp4.conf"))
    _proc(proc, 4004, "S", ("/usr/sbin/kea-dhcp4", *paths.argv[1:]))  # ours, alive
    cases = {
        "4001": "process 4001 is a zombie",
        "4002": "process 4002 is not this Kea (/usr/bin/sleep 600)",
        "4003": "process 4003 is not this Kea",
        "4999": "process 4999 is gone",
        "garbage": "'garbage' is not a pid",
        "1": "pid 1 is invalid",
    }
    for text, why in cases.items():
        paths.pidfile.write_text(text + "\n")
        removed = clear_stale_pidfile(paths, proc)
        assert removed is not None and why in removed and str(paths.pidfile) in removed
        assert not paths.pidfile.exists()
    paths.pidfile.write_text("4004\n")
    assert clear_stale_pidfile(paths, proc) is None
    assert paths.pidfile.read_text() == "4004\n"
    paths.pidfile.unlink()
    assert clear_stale_pidfile(paths, proc) is None  # no file: nothing to do


def test_before_start_removes_a_real_zombie_s_pid_file_and_kills_nothing(tmp_path: Path) -> None:
    subsystem = DhcpSubsystem()
    src = sources(tmp_path)
    paths = kea_paths(src.daemons.run_dir("kea-dhcp4"), 4)
    paths.run_dir.mkdir(parents=True, exist_ok=True)
    child = subprocess.Popen(["true"])
    try:
        # Exited but not reaped: a zombie, which kill(pid, 0) still finds.
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
        assert Path(f"/proc/{child.pid}/stat").read_text().split(") ")[1][0] == "Z"
        paths.pidfile.write_text(f"{child.pid}\n")
        spec = subsystem._spec(src, paths, {"Dhcp4": {}})
        assert spec.before_start is not None
        spec.before_start()
        assert not paths.pidfile.exists()
        assert paths.config.exists()
    finally:
        child.wait()


def test_knot_s_pid_file_naming_a_zombie_is_removed_and_a_live_knot_s_kept(
    tmp_path: Path,
) -> None:
    """Knot refuses to start ("server PID found, already running") while its pid file names
    a killed Knot's zombie: the start removes it, and never a live Knot's."""
    from trueup.system.knot import clear_stale_pidfile as clear_knot
    from trueup.system.knot import knot_paths

    run = tmp_path / "run" / "knot"
    run.mkdir(parents=True)
    paths = knot_paths(run)
    assert paths.pidfile == run / "knotd.pid"
    proc = tmp_path / "proc"
    _proc(proc, 5001, "Z", paths.argv)
    _proc(proc, 5002, "S", ("/usr/sbin/knotd", *paths.argv[1:]))
    paths.pidfile.write_text("5001\n")
    removed = clear_knot(paths, proc)
    assert removed is not None and "zombie" in removed and not paths.pidfile.exists()
    paths.pidfile.write_text("5002\n")
    assert clear_knot(paths, proc) is None
    assert paths.pidfile.read_text() == "5002\n"
