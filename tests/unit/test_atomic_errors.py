"""Atomic files under I/O errors, and state files that are not JSON."""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from trueup.journal.atomic import StateFileError, append_line, read_json, write_atomic, write_json
from trueup.journal.journal import Journal
from trueup.journal.state import StateDir


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _fail(code: int) -> Callable[..., Any]:
    def fake(*args: Any, **kwargs: Any) -> Any:
        raise OSError(code, os.strerror(code))

    return fake


@pytest.mark.parametrize("failing", ["write", "fsync", "replace"])
def test_write_atomic_failure_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    path = tmp_path / "applied.json"
    write_json(path, {"version": 1})
    fds = _open_fds()
    monkeypatch.setattr(os, failing, _fail(errno.ENOSPC))
    with pytest.raises(OSError) as caught:
        write_json(path, {"version": 2})
    monkeypatch.undo()
    assert caught.value.errno == errno.ENOSPC
    assert str(path) in str(caught.value) and "No space left on device" in str(caught.value)
    assert _open_fds() == fds
    assert os.listdir(tmp_path) == ["applied.json"]
    assert read_json(path) == {"version": 1}


def test_write_atomic_keeps_the_errno_subclass(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "missing" / "x")):
        write_atomic(tmp_path / "missing" / "x", b"{}")


def test_append_line_loops_over_short_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "journal.jsonl"
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, bytes(data[:3])))
    append_line(path, json.dumps({"a": "x" * 100}))
    append_line(path, json.dumps({"b": 2}))
    monkeypatch.undo()
    assert [json.loads(x) for x in path.read_text().splitlines()] == [{"a": "x" * 100}, {"b": 2}]


def test_append_line_failure_leaves_no_partial_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "journal.jsonl"
    append_line(path, '{"n":1}')
    fds = _open_fds()
    real_write = os.write
    calls = 0

    def half_then_full(fd: int, data: Any) -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            return real_write(fd, bytes(data[:4]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(OSError, match=f"{path}: No space left on device"):
        append_line(path, '{"n":2}')
    monkeypatch.undo()
    assert _open_fds() == fds
    assert path.read_text() == '{"n":1}\n'
    append_line(path, '{"n":3}')
    assert path.read_text() == '{"n":1}\n{"n":3}\n'


def test_append_line_after_a_torn_tail_keeps_the_new_line_whole(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    first = journal.begin(kind="apply", version=1)
    with (tmp_path / "journal.jsonl").open("ab") as handle:
        handle.write(b'{"txn": "' + first.encode() + b'", "type": "appl')  # torn by a crash
    journal.record(first, "commit")
    transaction = journal.last()
    assert transaction is not None and transaction.terminal is not None


def test_journal_skips_a_line_that_is_not_utf8(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    first = journal.begin(kind="apply", version=1)
    with (tmp_path / "journal.jsonl").open("ab") as handle:
        handle.write(b'{"txn": "\xff", "type": "applied"}\n[1, 2]\n')
    journal.record(first, "commit")
    assert [t.txn for t in journal.transactions()] == [first]
    assert journal.open_transaction() is None


def test_read_json_names_the_file_and_the_problem(tmp_path: Path) -> None:
    path = tmp_path / "applied.json"
    assert read_json(path, {"version": 0}) == {"version": 0}
    path.write_text('{"v":\n  1,, }')
    with pytest.raises(StateFileError) as caught:
        read_json(path)
    assert str(caught.value) == f"{path}: not valid JSON at line 2 column 5 (edited or torn?)"
    assert isinstance(caught.value, ValueError)
    assert isinstance(caught.value, json.JSONDecodeError)  # what existing callers catch
    path.write_bytes(b'{"v": "\xff"}')
    with pytest.raises(StateFileError, match=f"^{path}: not valid UTF-8 at byte 7"):
        read_json(path)
    path.write_bytes(b"")
    with pytest.raises(StateFileError, match="empty"):
        read_json(path)


def test_state_dir_reports_a_torn_revision_as_tampered(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "s")
    state.ensure()
    state.save_revision(1, {"spec": {}})
    state.save_revision(2, {"spec": {}})
    (tmp_path / "s" / "revisions" / "00000002.json").write_bytes(b'{"version": 2, "docu')
    assert state.tampered_revisions() == [str(tmp_path / "s" / "revisions" / "00000002.json")]
