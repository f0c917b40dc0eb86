"""Atomic, durable files: temp file, fsync, rename, fsync the directory.

Every failure leaves nothing behind (no temp file, no open descriptor, no
half-written line) and is raised as an `OSError` that names the path.

Every state file is opened without following links and only when it is a
regular file of ours (`trueup.system.safefile`): `read_json` reports anything
else as a damaged file (`StateFileError`), writes refuse it (`UnsafeFile`).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from trueup.system.atomicfile import fsync_dir, path_error, write_all, write_atomic
from trueup.system.safefile import UnsafeFile, open_file, read_file

__all__ = [
    "StateFileError",
    "UnsafeFile",
    "append_line",
    "file_identity",
    "fsync_dir",
    "path_error",
    "read_json",
    "read_state_bytes",
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


def write_json(path: Path, value: Any, *, durable: bool = True) -> None:
    write_atomic(
        path, (json.dumps(value, indent=2, sort_keys=True) + "\n").encode(), durable=durable
    )


def read_json(path: Path, default: Any = None) -> Any:
    """The file's JSON value; `default` when it does not exist.

    Raises `StateFileError` (naming the path) when it is not valid UTF-8,
    not valid JSON, or not a regular file of ours (a symbolic link, a
    directory, a FIFO: never followed).
    """
    data = read_state_bytes(path)
    if data is None:
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


def read_state_bytes(path: Path) -> bytes | None:
    """A state file's bytes; None when it does not exist.

    Raises `StateFileError` when it is not a regular file of ours, and the
    `OSError` of the read otherwise (unreadable).
    """
    try:
        return read_file(path)
    except FileNotFoundError:
        return None
    except UnsafeFile as exc:
        raise StateFileError(path, f"{exc.problem} (refused: never followed)") from None


def append_line(path: Path, line: str) -> None:
    """Append one line and fsync it before returning (write-ahead).

    A torn last line left by a crash is closed with a newline first, so the
    new line stays whole. A failed write is cut off again: no partial line.
    """
    data = (line.rstrip("\n") + "\n").encode()
    new = not os.path.lexists(path)
    try:
        fd = open_file(path, os.O_RDWR | os.O_CREAT | os.O_APPEND)
    except UnsafeFile:
        raise
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


def file_identity(path: Path) -> tuple[int, int, int, int] | None:
    """What tells a file's content apart without reading it; None when it cannot be seen."""
    try:
        st = path.lstat()
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
