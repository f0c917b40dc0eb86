"""The files source: reads, atomic replacement that keeps the mode, errors that name the path."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from trueup.system.sources import HostFiles


def test_files_are_read_and_replaced_atomically_keeping_their_mode(tmp_path: Path) -> None:
    files = HostFiles(root=tmp_path)
    assert files.read("/etc/kea/kea-dhcp4.conf") is None
    (tmp_path / "etc").mkdir()
    target = tmp_path / "etc" / "knot.conf"
    target.write_text("old\n")
    os.chmod(target, 0o640)
    inode = target.stat().st_ino
    files.write("/etc/knot.conf", "new\n")
    assert files.read("/etc/knot.conf") == "new\n"
    assert target.stat().st_mode & 0o777 == 0o640
    assert target.stat().st_ino != inode  # replaced by rename, never rewritten in place
    assert [p.name for p in (tmp_path / "etc").iterdir()] == ["knot.conf"]


def test_a_write_that_fails_names_the_path_and_leaves_nothing(tmp_path: Path) -> None:
    files = HostFiles(root=tmp_path)
    with pytest.raises(OSError) as failed:
        files.write("/missing-dir/file.conf", "x")
    assert failed.value.errno == errno.ENOENT
    assert "missing-dir/file.conf" in str(failed.value)
    assert list(tmp_path.iterdir()) == []


def test_remove_counts_an_absent_file_as_removed(tmp_path: Path) -> None:
    files = HostFiles(root=tmp_path)
    (tmp_path / "motd").write_text("hello\n")
    files.remove("/motd")
    files.remove("/motd")
    assert files.read("/motd") is None


def test_the_fake_runner_answers_from_its_table() -> None:
    from trueup.system.fake import FakeRunner
    from trueup.system.runner import Completed

    ok = Completed(("nft", "-j", "list", "ruleset"), 0, '{"nftables": []}', "")
    runner = FakeRunner({ok.argv: ok})
    assert runner.run(["nft", "-j", "list", "ruleset"]).stdout == '{"nftables": []}'
    missing = runner.run(["kea-shell"])
    assert missing.returncode == 127 and not missing.ok
    assert runner.calls == [ok.argv, ("kea-shell",)]
