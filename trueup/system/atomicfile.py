"""Atomic, durable file replacement: temp file, fsync, rename, fsync the directory.

The one implementation of an atomic write: the state directory
(`trueup.journal.atomic`) and the files subsystems manage
(`trueup.system.sources.HostFiles`) both use it. Every failure leaves nothing
behind (no temp file, no open descriptor) and is raised as an `OSError` that
names the path.

Nothing is written through a link: the temp file is created with
`O_CREAT|O_EXCL|O_NOFOLLOW`, and a target that is not a regular file of ours
(a symbolic link, a directory, a FIFO: `trueup.system.safefile`) is refused
with `UnsafeFile` and left as it is, as evidence.
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

from trueup.system.safefile import UnsafeFile, open_dir, unsafe_entry

__all__ = ["UnsafeFile", "fsync_dir", "path_error", "write_all", "write_atomic"]


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
        fd = open_dir(directory)
    except UnsafeFile:
        raise
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
    problem = unsafe_entry(path)
    if problem is not None:
        raise UnsafeFile(path, problem)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with contextlib.suppress(FileNotFoundError, IsADirectoryError, PermissionError):
        os.unlink(tmp)  # left by a crash of a process with our pid; unlink never follows
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
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
