"""One writer at a time: an advisory lock on `STATE_DIR/lock`.

Held for the duration of an apply, rollback, confirm or reconcile pass. A
second writer does not wait: it is refused at once, so the caller can report
`STATE_CONCURRENT_MODIFICATION` and change nothing. The holder's PID and
purpose are written into the file for `status`.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from pathlib import Path
from types import TracebackType

__all__ = ["LockBusy", "WriterLock", "lock_holder"]


class LockBusy(RuntimeError):
    def __init__(self, holder: dict[str, object] | None) -> None:
        self.holder = holder or {}
        who = f"pid {self.holder.get('pid')} ({self.holder.get('purpose')})" if holder else "?"
        super().__init__(f"another writer holds the device: {who}")


def lock_holder(path: Path) -> dict[str, object] | None:
    """Who holds the lock now, or None when nobody does."""
    if not path.exists():
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                data = json.loads(path.read_text() or "{}")
                return dict(data) if isinstance(data, dict) else {}
            except (json.JSONDecodeError, OSError):
                return {}
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


class WriterLock:
    # Within one process, writers queue briefly on a thread lock (the agent's
    # own reconcile pass and an API apply); across processes they are refused.
    _thread_locks: dict[Path, threading.Lock] = {}

    def __init__(self, path: Path, purpose: str, wait: float = 0.0) -> None:
        self.path = path
        self.purpose = purpose
        self.wait = wait
        self._fd: int | None = None
        self._thread_lock = self._thread_locks.setdefault(path.resolve(), threading.Lock())

    def __enter__(self) -> WriterLock:
        acquired = (
            self._thread_lock.acquire(timeout=self.wait)
            if self.wait > 0
            else self._thread_lock.acquire(blocking=False)
        )
        if not acquired:
            raise LockBusy({"pid": os.getpid(), "purpose": "another request in this agent"})
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + self.wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = lock_holder(self.path)
                    os.close(fd)
                    self._thread_lock.release()
                    raise LockBusy(holder) from None
                time.sleep(0.01)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "purpose": self.purpose}).encode(), 0)
        self._fd = fd
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
        self._thread_lock.release()
