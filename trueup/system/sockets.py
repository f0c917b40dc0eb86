"""Where unix sockets go: beside their owner when the path fits, else a short directory.

Who uses this: the daemons' path modules (`trueup.system.haproxy`, `kea`,
`knot`) choose their sockets' directory with `socket_dir`; the supervisor
removes a moved directory when its daemon stops (`remove_socket_dir`), and the
agent removes the ones whose state directory is gone when it starts
(`sweep`). The agent's own API socket, whose path is the contract
(`STATE_DIR/agent.sock`), is bound and reached through `unix_address` instead.

```python
directory = socket_dir(run_dir, ("master.sock", "stats.sock"), HAPROXY_MAX, prefix="haproxy-")
with unix_address(state_dir / "agent.sock") as address:   # bind or connect to `address`
    sock.connect(address)
```

Limits: a unix socket's path holds at most 107 bytes (`sun_path` is 108 with
its NUL) — Kea, Knot and the kernel refuse longer ones. HAProxy 2.6 refuses
more than 97 for its stats and master sockets (it binds `PATH.PID.tmp` and
renames it). A directory that does not fit every socket name goes to
`/run/trueup/PREFIX<digest of the owner's path>` (0700, root's): the same
owner always gets the same directory (reused across restarts, never one
per start), and its `owner` file names the directory it serves, so a
directory whose owner is gone is known for what it is.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import socket
import stat
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from trueup.system.atomicfile import write_atomic

__all__ = [
    "HAPROXY_MAX",
    "RUNTIME_ROOT",
    "SUN_PATH_MAX",
    "fits",
    "make_socket_dir",
    "remove_socket_dir",
    "socket_dir",
    "sweep",
    "unix_address",
]

RUNTIME_ROOT = Path("/run/trueup")
# sun_path is 108 bytes with its terminating NUL.
SUN_PATH_MAX = 107
# HAProxy 2.6: "stats socket … too long (max 97)", and the master CLI alike.
HAPROXY_MAX = 97
OWNER = "owner"
# A directory of an older layout (no owner file) is removed only when it holds
# nothing but dead sockets (or nothing) and nothing changed in it for this long.
LEGACY_QUIET = 600.0


def fits(path: Path, limit: int = SUN_PATH_MAX) -> bool:
    return len(os.fsencode(path)) <= limit


def _moved(owner: Path, prefix: str, root: Path) -> Path:
    digest = hashlib.sha256(str(owner).encode()).hexdigest()[:12]
    return root / f"{prefix}{digest}"


def socket_dir(
    owner: Path,
    names: Iterable[str],
    limit: int = SUN_PATH_MAX,
    *,
    prefix: str,
    create: bool = True,
    root: Path = RUNTIME_ROOT,
) -> Path:
    """`owner` when every `owner/NAME` fits `limit`, else its short directory (made when `create`)."""
    if all(fits(owner / name, limit) for name in names):
        return owner
    directory = _moved(owner, prefix, root)
    if create:
        _make(directory, owner)
    return directory


def make_socket_dir(directory: Path, owner: Path) -> None:
    """Make `owner`'s moved socket directory (before its daemon starts); nothing when not moved."""
    if directory != owner:
        _make(directory, owner)


def _make(directory: Path, owner: Path) -> None:
    directory.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        directory.mkdir(mode=0o700)
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise OSError(
            errno.ENOTDIR,
            f"{directory} is not a directory of this user (a symlink or another owner's); "
            "refusing to put sockets there",
        )
    os.chmod(directory, 0o700)
    record = directory / OWNER
    try:
        current = record.read_text() if not record.is_symlink() else None
    except OSError:
        current = None
    if current != str(owner):
        write_atomic(record, str(owner).encode(), 0o600)


def _empty(directory: Path) -> None:
    """Remove `directory` and what is in it (files and sockets; nothing is followed)."""
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            continue  # trueup makes none: left, and so is the directory
        with contextlib.suppress(FileNotFoundError):
            os.unlink(entry.path)
    with contextlib.suppress(FileNotFoundError, OSError):
        os.rmdir(directory)


def remove_socket_dir(directory: Path, owner: Path) -> bool:
    """Remove a moved socket directory of `owner` (its daemon stopped); True when removed.

    A directory that is `owner` itself (nothing was moved), or whose owner file
    names another owner, is left alone.
    """
    if directory == owner:
        return False
    try:
        info = os.lstat(directory)
        named = (directory / OWNER).read_text()
    except OSError:
        return False
    if not stat.S_ISDIR(info.st_mode) or named != str(owner):
        return False
    _empty(directory)
    return not directory.exists()


def _dead(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.5)
        try:
            probe.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            return True
        except OSError:
            return False
    return False


def sweep(root: Path = RUNTIME_ROOT, now: float | None = None) -> list[str]:
    """Remove the socket directories whose owner is gone; the names removed.

    An owner that still exists keeps its directory (its daemon may run while
    no agent does). A directory without an owner file (an older layout) is
    removed only when it is empty or holds sockets nobody listens on and
    nothing else, and was left alone for `LEGACY_QUIET` seconds.
    """
    removed: list[str] = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    moment = time.time() if now is None else now
    for entry in entries:
        if not entry.is_dir(follow_symlinks=False):
            continue
        directory = Path(entry.path)
        try:
            owner = (directory / OWNER).read_text()
        except FileNotFoundError:
            owner = None
        except OSError:
            continue
        if owner is not None:
            if owner and not os.path.lexists(owner):
                _empty(directory)
                removed.append(entry.name)
            continue
        if _legacy_stale(directory, moment):
            _empty(directory)
            removed.append(entry.name)
    return removed


def _legacy_stale(directory: Path, now: float) -> bool:
    try:
        if now - os.lstat(directory).st_mtime < LEGACY_QUIET:
            return False
        inside = list(os.scandir(directory))
    except OSError:
        return False
    sockets = [e.path for e in inside if stat.S_ISSOCK(e.stat(follow_symlinks=False).st_mode)]
    others = [e for e in inside if e.path not in sockets and not e.name.endswith(".lock")]
    return not others and all(_dead(path) for path in sockets)


@contextlib.contextmanager
def unix_address(path: Path) -> Iterator[str]:
    """An address for bind/connect that reaches `path` whatever its length.

    A path that fits is itself; a longer one is reached through the
    directory's descriptor (`/proc/self/fd/N/NAME`), which the kernel
    resolves like the directory, valid while the `with` block runs.
    """
    if fits(path):
        yield str(path)
        return
    fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)
