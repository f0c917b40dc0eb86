"""keepalived's pid files left by a crash or a reboot never stop the next start."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from trueup.system.keepalived import KeepalivedPaths


def test_pid_files_naming_another_process_or_nothing_are_removed(tmp_path: Path) -> None:
    paths = KeepalivedPaths(tmp_path)
    paths.pid_file("main").write_text(f"{os.getpid()}\n")  # a live pid, not keepalived
    paths.pid_file("vrrp").write_text("999999999\n")  # no such process
    paths.pid_file("checkers").write_text("garbage\n")
    assert sorted(paths.clear_stale_pid_files()) == [
        "keepalived-checkers.pid",
        "keepalived-main.pid",
        "keepalived-vrrp.pid",
    ]
    assert not any(tmp_path.glob("*.pid"))


def test_the_pid_file_of_a_keepalived_running_this_configuration_is_kept(tmp_path: Path) -> None:
    paths = KeepalivedPaths(tmp_path)
    # A process whose command line names this configuration, as keepalived's does.
    ours = subprocess.Popen(["/bin/sh", "-c", "sleep 60; :", "sh", f"--use-file={paths.config}"])
    try:
        cmdline = Path(f"/proc/{ours.pid}/cmdline")
        for _ in range(1000):  # until the exec has laid out its arguments
            if b"--use-file" in cmdline.read_bytes():
                break
        paths.pid_file("main").write_text(f"{ours.pid}\n")
        assert paths.clear_stale_pid_files() == []
        assert paths.pid_file("main").exists()
    finally:
        ours.kill()
        ours.wait()
