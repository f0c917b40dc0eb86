"""The writer lock after I/O errors: every failure releases everything it took."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from trueup.journal.lock import LockBusy, LockError, WriterLock, lock_holder


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _failing(real: Callable[..., Any], code: int, when: Callable[..., bool]) -> Callable[..., Any]:
    def fake(*args: Any, **kwargs: Any) -> Any:
        if when(*args):
            raise OSError(code, os.strerror(code))
        return real(*args, **kwargs)

    return fake


def _assert_lock_works(path: Path) -> None:
    assert lock_holder(path) is None
    with WriterLock(path, "after"):
        assert lock_holder(path) == {"pid": os.getpid(), "purpose": "after"}
        with pytest.raises(LockBusy), WriterLock(path, "second"):
            pass
    assert lock_holder(path) is None


def test_open_failure_is_a_clear_error_and_holds_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "lock"
    fds = _open_fds()
    monkeypatch.setattr(os, "open", _failing(os.open, errno.EROFS, lambda p, *a: Path(p) == path))
    with pytest.raises(LockError) as caught, WriterLock(path, "apply"):
        pass
    assert str(caught.value) == f"cannot open the writer lock {path}: Read-only file system"
    assert caught.value.errno == errno.EROFS
    assert isinstance(caught.value, OSError)
    monkeypatch.undo()
    assert _open_fds() == fds
    _assert_lock_works(path)


@pytest.mark.parametrize("failing", ["ftruncate", "pwrite"])
def test_holder_record_failing_still_locks_and_releases(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    path = tmp_path / "lock"
    fds = _open_fds()
    monkeypatch.setattr(os, failing, _failing(getattr(os, failing), errno.ENOSPC, lambda *a: True))
    with WriterLock(path, "apply"):  # a full disk does not stop a writer: the flock is the lock
        with pytest.raises(LockBusy), WriterLock(path, "other"):
            pass
        assert lock_holder(path) is not None
    monkeypatch.undo()
    assert _open_fds() == fds
    _assert_lock_works(path)


def test_exit_with_ftruncate_failing_releases_everything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "lock"
    fds = _open_fds()
    with WriterLock(path, "apply"):
        monkeypatch.setattr(os, "ftruncate", _failing(os.ftruncate, errno.EIO, lambda *a: True))
    monkeypatch.undo()
    assert _open_fds() == fds
    _assert_lock_works(path)


def test_flock_failure_is_a_lock_error_and_holds_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fcntl

    path = tmp_path / "lock"
    fds = _open_fds()
    monkeypatch.setattr(fcntl, "flock", _failing(fcntl.flock, errno.ENOLCK, lambda *a: True))
    with (
        pytest.raises(LockError, match=f"cannot lock the writer lock {path}"),
        WriterLock(path, "apply"),
    ):
        pass
    monkeypatch.undo()
    assert _open_fds() == fds
    _assert_lock_works(path)


def test_busy_refusal_releases_the_thread_lock(tmp_path: Path) -> None:
    path = tmp_path / "lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)  # another process's open file description
    import fcntl

    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with pytest.raises(LockBusy), WriterLock(path, "apply", wait=0.05):
            pass
    finally:
        os.close(fd)
    _assert_lock_works(path)


def test_lock_holder_tolerates_garbage(tmp_path: Path) -> None:
    path = tmp_path / "lock"
    assert lock_holder(path) is None
    with WriterLock(path, "apply"):
        path.write_bytes(b"\xff\xfe not json")
        assert lock_holder(path) == {}
