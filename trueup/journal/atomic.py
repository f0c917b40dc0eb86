"""Atomic, durable files: temp file, fsync, rename, fsync the directory.

Every failure leaves nothing behind (no temp file, no open descriptor, no
half-written line) and is raised as an `OSError` that names the path.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from pathlib import Path
from typing import Any

__all__ = [
    "StateFileError",
    "append_line",
    "fsync_dir",
    "path_error",
    "read_json",
    "write_all",
    "write_atomic",
    "write_json",
]


class StateFileError(json.JSONDecodeError):
    """A state file that exists but cannot be read as JSON (edited by hand, or torn).

    A `ValueError` (and, for the callers that already expect one, a
    `json.JSONDecodeError`) whose message names the path and the problem.
    """

    def __init__(self, path: Path | str, problem: str, lineno: int = 1, colno: int = 1) -> None:
        super().__init__(problem, "", 0)
        self.path = str(path)
        self.problem = problem
        self.lineno, self.colno = lineno, colno
        self.args = (f"{self.path}: {problem}",)

    def __str__(self) -> str:
        return f"{self.path}: {self.problem}"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.path, self.problem, self.lineno, self.colno))


def path_error(path: Path | str, exc: OSError) -> OSError:
    """`exc` again, as an OSError (same errno, same subclass) whose message names `path`."""
    if exc.errno is None:
        return OSError(f"{path}: {exc}")
    return OSError(exc.errno, f"{path}: {exc.strerror or os.strerror(exc.errno)}")


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of `data`, however many short writes that takes."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(errno.EIO, "write made no progress")
        view = view[written:]


def fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise path_error(directory, exc) from exc
    try:
        os.fsync(fd)
    except OSError as exc:
        raise path_error(directory, exc) from exc
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, mode: int = 0o600, *, durable: bool = True) -> None:
    """Replace `path` with `data`: readers see the old or the new content, never a mix.

    `durable=False` skips the fsyncs: still atomic, but after a crash the file
    may hold its old content or be empty. Only for files that may lag (caches,
    the audit anchor), never for state that must survive.
    """
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    except OSError as exc:
        raise path_error(path, exc) from exc
    try:
        try:
            write_all(fd, data)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise path_error(path, exc) from exc
        raise
    if durable:
        fsync_dir(path.parent)


def write_json(path: Path, value: Any, *, durable: bool = True) -> None:
    write_atomic(
        path, (json.dumps(value, indent=2, sort_keys=True) + "\n").encode(), durable=durable
    )


def read_json(path: Path, default: Any = None) -> Any:
    """The file's JSON value; `default` when it does not exist.

    Raises `StateFileError` (naming the path) when it is not valid UTF-8 or
    not valid JSON.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return default
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StateFileError(
            path, f"not valid UTF-8 at byte {exc.start} (edited or torn?)"
        ) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        if not text.strip():
            raise StateFileError(path, "empty, not valid JSON (edited or torn?)") from None
        raise StateFileError(
            path,
            f"not valid JSON at line {exc.lineno} column {exc.colno} (edited or torn?)",
            exc.lineno,
            exc.colno,
        ) from None


def append_line(path: Path, line: str) -> None:
    """Append one line and fsync it before returning (write-ahead).

    A torn last line left by a crash is closed with a newline first, so the
    new line stays whole. A failed write is cut off again: no partial line.
    """
    data = (line.rstrip("\n") + "\n").encode()
    new = not path.exists()
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
    except OSError as exc:
        raise path_error(path, exc) from exc
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data
        try:
            write_all(fd, data)
            os.fsync(fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            raise
    except OSError as exc:
        raise path_error(path, exc) from exc
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
    if new:
        fsync_dir(path.parent)
