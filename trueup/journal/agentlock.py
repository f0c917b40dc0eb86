"""One agent per state directory: an exclusive `flock` held for the agent's whole life.

Who calls this: `trueup agent run`, first thing — the fast boot path and
`trueup.agent.process.Agent.run` — before the socket, the management port or
any state file is touched. A second agent on the same state directory gets
`AgentRunning` naming the first one's pid, and must exit without touching
anything: the first keeps its socket and its port.

What is locked, so that two agents always meet on the same object whatever
the directory's condition:

* the state directory itself (a read-only descriptor of the directory can be
  locked on any file system, read-only or full);
* `STATE_DIR/agent.pid`, which also records the holder's pid and start time
  for the next agent's message and for `status`.

When `agent.pid` cannot be written (a read-only or full state directory) the
record goes to `/run/trueup/DEV-INODE.pid`, keyed by the state directory's
device and inode; when the state directory does not exist and cannot be
created, the lock itself is `/run/trueup/` keyed by its path. Recording is
best effort; the lock is not.

`agent.pid` is opened without following links and only when it is a regular
file of ours (`trueup.system.safefile`): a symbolic link or a directory in its
place is left as it is (nothing is written through it), the pid goes to
`/run/trueup/` and `notes` says why.

Standard library only: it runs before anything heavy is imported.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from trueup.model.jsontypes import JSONObject
from trueup.system.atomicfile import write_atomic
from trueup.system.safefile import UnsafeFile, ensure_dir, open_file, read_file

__all__ = [
    "PID_FILE",
    "RUN_DIR",
    "AgentHolder",
    "AgentLock",
    "AgentLockJSON",
    "AgentRunning",
    "agent_holder",
    "take_agent_lock",
]

PID_FILE = "agent.pid"
RUN_DIR = Path("/run/trueup")

# Locks this process holds, by state directory: taking one again (the fast path
# took it, then the full agent asks) returns the same lock instead of refusing.
_HELD: dict[str, AgentLock] = {}


@dataclass(frozen=True)
class AgentHolder:
    """What the agent holding a state directory recorded about itself (`agent.pid`)."""

    pid: int
    started_at: str | None = None
    state_dir: str | None = None
    extra: dict[str, object] = field(default_factory=dict)  # a newer agent's fields, kept

    @classmethod
    def from_json(cls, body: JSONObject) -> AgentHolder:
        """The holder a pid record holds, as read (`pid` an int, checked by the caller)."""
        started_at, state_dir = body.get("started_at"), body.get("state_dir")
        return cls(
            pid=int(body["pid"]),
            started_at=None if started_at is None else str(started_at),
            state_dir=None if state_dir is None else str(state_dir),
            extra={k: v for k, v in body.items() if k not in ("pid", "started_at", "state_dir")},
        )

    def to_json(self) -> dict[str, object]:
        """The record as the pid file holds it."""
        body: dict[str, object] = {"pid": self.pid}
        if self.started_at is not None:
            body["started_at"] = self.started_at
        if self.state_dir is not None:
            body["state_dir"] = self.state_dir
        return {**body, **self.extra}


class AgentRunning(RuntimeError):
    """Another agent holds the state directory; this one must exit and touch nothing."""

    def __init__(self, state_dir: Path, holder: AgentHolder | None) -> None:
        self.state_dir = state_dir
        self.holder = holder
        self.pid = holder.pid if holder is not None else None
        super().__init__(
            f"another agent (pid {self.pid if self.pid is not None else '?'}) runs on "
            f"{state_dir}; it keeps its socket and port"
        )


class AgentLockJSON(TypedDict):
    """The held lock as the agent reports it: its pid, where the pid is recorded, notes."""

    pid: int
    state_dir: str
    record: str | None
    notes: list[str]


class AgentLock:
    """The held lock. `release()` (or process exit) lets the next agent start."""

    def __init__(
        self, state_dir: Path, fds: list[int], record: Path | None, notes: list[str]
    ) -> None:
        self.state_dir = state_dir
        self.pid = os.getpid()
        self._fds = fds
        self.record = record  # where the pid is recorded, None when nowhere
        self.notes = notes  # why the lock or its record is not the usual one

    @property
    def held(self) -> bool:
        return bool(self._fds)

    def to_json(self) -> AgentLockJSON:
        return {
            "pid": self.pid,
            "state_dir": str(self.state_dir),
            "record": str(self.record) if self.record else None,
            "notes": list(self.notes),
        }

    def release(self) -> None:
        _HELD.pop(_held_key(self.state_dir), None)
        fds, self._fds = self._fds, []
        if self.record is not None and self.record.parent == RUN_DIR:
            with contextlib.suppress(OSError):
                self.record.unlink()
        for fd in fds:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            with contextlib.suppress(OSError):
                os.close(fd)


def _held_key(root: Path) -> str:
    return os.path.realpath(root)


def _run_key(root: Path) -> str:
    try:
        st = os.stat(root)
        return f"{st.st_dev}-{st.st_ino}"
    except OSError:
        return "path-" + str(root.resolve()).strip("/").replace("/", "_")


def _read_record(path: Path) -> AgentHolder | None:
    try:
        value = json.loads(read_file(path, 1 << 16).decode("utf-8") or "null")
    except (OSError, ValueError):
        return None
    if not isinstance(value, dict) or not isinstance(value.get("pid"), int):
        return None
    return AgentHolder.from_json(value)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def agent_holder(root: Path, *, run_dir: Path = RUN_DIR) -> AgentHolder | None:
    """What the agent holding `root` recorded about itself (pid, started_at), if anything."""
    root = Path(root)
    for path in (run_dir / f"{_run_key(root)}.pid", root / PID_FILE):
        record = _read_record(path)
        if record is not None and _alive(record.pid):
            return record
    return None


def _lock(fd: int, root: Path, run_dir: Path) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise AgentRunning(root, agent_holder(root, run_dir=run_dir)) from None


def _open_dir(path: Path) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def take_agent_lock(root: str | Path, *, run_dir: Path = RUN_DIR) -> AgentLock:
    """Lock `root` for this agent; raise `AgentRunning` when another agent holds it.

    Never fails because the directory is read-only or full: the lock then
    falls back as the module docstring says, and `notes` tells why.
    """
    root = Path(root)
    held = _HELD.get(_held_key(root))
    if held is not None and held.held:
        return held
    fds: list[int] = []
    notes: list[str] = []
    try:
        with contextlib.suppress(OSError):
            root.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            fds.append(_open_dir(root))
        except OSError as exc:
            # No directory to lock: meet other agents in /run/trueup, keyed by the path.
            notes.append(f"{root}: {exc.strerror}; locked {run_dir} instead")
            ensure_dir(run_dir, 0o755)
            fds.append(open_file(run_dir / f"{_run_key(root)}.lock", os.O_RDWR | os.O_CREAT))
        _lock(fds[-1], root, run_dir)
        record = _pid_file(root, fds, notes, run_dir)
    except BaseException:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        raise
    lock = AgentLock(root, fds, record, notes)
    _HELD[_held_key(root)] = lock
    return lock


def _pid_file(root: Path, fds: list[int], notes: list[str], run_dir: Path) -> Path | None:
    """Lock and fill `agent.pid`; fall back to a record in `run_dir`. Returns where it is."""
    body = json.dumps(
        {
            "pid": os.getpid(),
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "state_dir": str(root),
        }
    ).encode()
    path = root / PID_FILE
    fd: int | None = None
    problem = "cannot open"
    # Held read-only: a descriptor open for writing would keep the state
    # directory's file system from being remounted read-only while we run.
    for flags in (os.O_RDONLY | os.O_CREAT, os.O_RDONLY):
        try:
            fd = open_file(path, flags, 0o644)
            break
        except UnsafeFile as exc:
            problem = exc.problem + "; left as it is"
            break
        except OSError as exc:
            problem = exc.strerror or str(exc)
    if fd is not None:
        fds.append(fd)
        _lock(fd, root, run_dir)
        try:
            writer = open_file(path, os.O_WRONLY | os.O_TRUNC, 0o644)
            try:
                if os.write(writer, body) != len(body):
                    raise OSError(28, "short write")
            finally:
                os.close(writer)
            with contextlib.suppress(OSError):
                (run_dir / f"{_run_key(root)}.pid").unlink()  # a stale record of a former run
            return path
        except OSError as exc:
            problem = exc.strerror or str(exc)
    notes.append(f"{path}: {problem}; the pid is recorded in {run_dir}")
    record = run_dir / f"{_run_key(root)}.pid"
    try:
        ensure_dir(run_dir, 0o755)
        write_atomic(record, body, 0o644, durable=False)
    except OSError as exc:
        notes.append(f"{record}: {exc.strerror}; the pid is not recorded")
        return None
    return record
