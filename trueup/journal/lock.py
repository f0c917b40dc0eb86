"""One writer at a time: an advisory lock on `STATE_DIR/lock`.

Held for the duration of an apply, rollback, confirm or reconcile pass. A
second writer does not wait: it is refused at once, so the caller can report
`STATE_CONCURRENT_MODIFICATION` and change nothing. The holder's PID and
purpose are written into the file for `status`. The file is opened without
following links and only when it is a regular file of ours
(`trueup.system.safefile`): a symbolic link or a directory in its place is
refused with `LockError` naming it, and nothing is truncated through it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import threading
import time
from pathlib import Path
from types import TracebackType

from trueup.system.safefile import UnsafeFile, open_file

__all__ = ["LockBusy", "LockError", "WriterLock", "lock_holder"]

log = logging.getLogger("trueup.journal")


class LockBusy(RuntimeError):
    def __init__(self, holder: dict[str, object] | None) -> None:
        self.holder = holder or {}
        who = f"pid {self.holder.get('pid')} ({self.holder.get('purpose')})" if holder else "?"
        super().__init__(f"another writer holds the device: {who}")


class LockError(OSError):
    """The writer lock cannot be taken for a reason other than another writer.

    For example a read-only or missing state directory. Nothing is held when
    it is raised. The message names the path and the system's reason.
    """

    def __str__(self) -> str:
        return str(self.strerror)


def lock_holder(path: Path) -> dict[str, object] | None:
    """Who holds the lock now, or None when nobody does."""
    try:
        fd = open_file(path, os.O_RDONLY)
    except (FileNotFoundError, UnsafeFile):
        return None  # an unsafe lock file is reported by trueup.journal.damage
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                data = json.loads(os.pread(fd, 1 << 16, 0) or b"{}")
                return dict(data) if isinstance(data, dict) else {}
            except (ValueError, OSError):
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
        try:
            self._fd = self._take()
        except BaseException:
            self._thread_lock.release()
            raise
        return self

    def _take(self) -> int:
        """Open and flock the lock file; on any failure nothing stays open or held."""
        try:
            fd = open_file(self.path, os.O_RDWR | os.O_CREAT)
        except UnsafeFile as exc:
            raise LockError(exc.errno, f"cannot take the writer lock: {exc.strerror}") from exc
        except OSError as exc:
            raise LockError(
                exc.errno, f"cannot open the writer lock {self.path}: {exc.strerror}"
            ) from exc
        try:
            deadline = time.monotonic() + self.wait
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        try:
                            holder = lock_holder(self.path)
                        except OSError:
                            holder = None
                        raise LockBusy(holder) from None
                    time.sleep(0.01)
                except OSError as exc:
                    raise LockError(
                        exc.errno, f"cannot lock the writer lock {self.path}: {exc.strerror}"
                    ) from exc
        except BaseException:
            os.close(fd)
            raise
        self._record_holder(fd)
        return fd

    def _record_holder(self, fd: int) -> None:
        """Write who holds the lock, for `status`. Best effort: the flock is the lock."""
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps({"pid": os.getpid(), "purpose": self.purpose}).encode(), 0)
        except OSError as exc:
            log.warning(
                "writer lock %s taken, but its holder could not be recorded: %s",
                self.path,
                exc.strerror,
            )

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        fd, self._fd = self._fd, None
        try:
            if fd is not None:
                try:
                    os.ftruncate(fd, 0)
                except OSError as error:
                    # A stale holder record is harmless: lock_holder asks flock first.
                    log.warning(
                        "writer lock %s: clearing its holder failed: %s", self.path, error.strerror
                    )
                with contextlib.suppress(OSError):
                    fcntl.flock(fd, fcntl.LOCK_UN)
                with contextlib.suppress(OSError):
                    os.close(fd)
        finally:
            self._thread_lock.release()
