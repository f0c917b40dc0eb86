"""Opening files in directories the agent owns without ever being led outside them.

Who calls this: every open of a file in the state directory and in the
daemons' run directories (`trueup.system.atomicfile`, `trueup.journal.*`, the
agent's log and pid files, the daemons' configs, logs and pid records).

A state or run file is used only when it is what the agent left there: a
regular file (or, for `open_dir`, a directory) owned by the agent's user, with
one name. Anything else — a symbolic link (never followed: `O_NOFOLLOW`), a
directory where a file belongs, a FIFO, a device, a socket, a file owned by
another user, a second hard link of a file being written — is refused with
`UnsafeFile`, an `OSError` whose message names the path and what is there
instead. Nothing is created, truncated or written through it: the host file a
link points to stays as it is, and the damage is reported
(`trueup.journal.damage`) instead of repaired.

A FIFO is opened with `O_NONBLOCK` so that refusing it never blocks.

Standard library only: the fast boot path imports it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

__all__ = [
    "UnsafeFile",
    "ensure_dir",
    "open_dir",
    "open_file",
    "read_file",
    "refusal",
    "unsafe_entries",
    "unsafe_entry",
]

_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafeFile(OSError):
    """A path in an agent-owned directory that is not what the agent keeps there.

    `problem` says what is there instead ("a symbolic link to /etc/shadow").
    """

    def __init__(self, path: Path | str, problem: str, code: int = errno.ELOOP) -> None:
        super().__init__(code, f"{path}: {problem}; refused (never followed or overwritten)")
        self.path = str(path)
        self.problem = problem

    def __str__(self) -> str:
        return str(self.strerror)


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "a regular file"


def refusal(path: Path | str, st: os.stat_result, *, directory: bool = False) -> str | None:
    """Why `st` (an lstat or fstat of `path`) is not to be used; None when it is fine."""
    want = stat.S_ISDIR if directory else stat.S_ISREG
    if stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        return f"a symbolic link to {target}, not a {'directory' if directory else 'file'}"
    if not want(st.st_mode):
        return f"{_kind(st.st_mode)}, not a {'directory' if directory else 'regular file'}"
    return _foreign(st)


def _foreign(st: os.stat_result) -> str | None:
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not by the agent (uid {os.geteuid()})"
    return None


def unsafe_entry(path: Path | str, *, directory: bool = False) -> str | None:
    """Why `path` must not be used (see `refusal`); None when it is fine or missing."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return refusal(path, st, directory=directory)


def open_file(path: Path | str, flags: int, mode: int = 0o600) -> int:
    """`os.open` that refuses anything but a regular file of ours (see the module docstring).

    Opened for writing, a file with a second hard link is refused too: writing
    it would change the other name's content. Raises `UnsafeFile`, or the
    `OSError` of the open itself (`FileNotFoundError` when it is missing).
    """
    truncate = bool(flags & os.O_TRUNC)  # only once the file is known to be ours
    flags &= ~os.O_TRUNC
    try:
        fd = os.open(path, flags | _NOFOLLOW | os.O_NONBLOCK, mode)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
            problem = unsafe_entry(path)
            if problem is not None:
                raise UnsafeFile(path, problem) from None
        raise
    try:
        st = os.fstat(fd)
        problem = refusal(path, st)
        writing = flags & (os.O_WRONLY | os.O_RDWR)
        if problem is None and writing and st.st_nlink > 1:
            problem = f"a file with {st.st_nlink} hard links, not a file of its own"
        if problem is not None:
            raise UnsafeFile(path, problem)
        if not flags & os.O_NONBLOCK:
            os.set_blocking(fd, True)
        if truncate:
            os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_file(path: Path | str, limit: int | None = None) -> bytes:
    """The content of a regular file of ours (at most `limit` + 1 bytes when given)."""
    fd = open_file(path, os.O_RDONLY)
    try:
        chunks: list[bytes] = []
        size = 0
        while limit is None or size <= limit:
            chunk = os.read(fd, 1 << 20 if limit is None else min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def open_dir(path: Path | str) -> int:
    """A read-only descriptor of a directory of ours; `UnsafeFile` for anything else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            problem = unsafe_entry(path, directory=True)
            if problem is not None:
                raise UnsafeFile(path, problem, errno.ENOTDIR) from None
        raise
    try:
        problem = refusal(path, os.fstat(fd), directory=True)
        if problem is not None:
            raise UnsafeFile(path, problem, errno.ENOTDIR)
    except BaseException:
        os.close(fd)
        raise
    return fd


def ensure_dir(path: Path | str, mode: int = 0o700, *, levels: int = 1) -> Path:
    """Create `path` (and its parents) if needed; refuse it unless it is a directory of ours.

    `levels` is how many components from the end are checked: 2 for
    `run/NAME`, so that neither `run` nor `run/NAME` can be a link out of the
    state directory. The components above are the operator's choice (a state
    directory may well live behind a symbolic link).
    """
    path = Path(path)
    checked = [path, *list(path.parents)[: max(levels - 1, 0)]]
    for directory in reversed(checked):
        problem = unsafe_entry(directory, directory=True)
        if problem is not None:
            raise UnsafeFile(directory, problem, errno.ENOTDIR)
    path.mkdir(mode=mode, parents=True, exist_ok=True)
    for directory in reversed(checked):
        fd = open_dir(directory)
        with contextlib.suppress(OSError):
            os.close(fd)
    return path


def unsafe_entries(
    directory: Path | str, depth: int = 3, limit: int = 10_000
) -> list[tuple[str, str]]:
    """(path, problem) of every entry below `directory` that is not a file, directory or
    socket of ours: symbolic links, FIFOs, devices, another user's files. Never follows
    a link; looks `depth` levels down and at `limit` entries at most.
    """
    found: list[tuple[str, str]] = []
    pending = [(Path(directory), 0)]
    seen = 0
    while pending and seen < limit:
        folder, level = pending.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            seen += 1
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISSOCK(st.st_mode):  # a daemon's control socket: only the owner counts
                problem = _foreign(st)
            elif stat.S_ISDIR(st.st_mode):
                problem = refusal(entry.path, st, directory=True)
                if problem is None and level + 1 < depth:
                    pending.append((Path(entry.path), level + 1))
            else:
                problem = refusal(entry.path, st)
            if problem is not None:
                found.append((entry.path, problem))
    return sorted(found)
