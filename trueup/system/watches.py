"""What wakes the reconcile loop: watches that subsystems declare, and their event sources.

A subsystem declares next to its code what can change its part of the system
(as controller-runtime's `For`/`Watches` do):

* `rtnetlink("address", "link")` — kernel notifications of those kinds;
* `files("/etc/kea/kea-dhcp4.conf")` — inotify on files (their directories
  are watched, so an atomic rename is seen too); a path may start with
  `STATE_DIR` (`files(f"{STATE_DIR}/run/haproxy/haproxy.cfg")`), which
  stands for the agent's state directory;
* `every(10.0)` — a periodic look, for what sends no notification
  (`/proc/sys` does not support inotify);
* `command("nft", "monitor")` — a long-running program whose every output
  line is a change.

Who calls this: the reconcile loop builds one `CompositeEventSource` from the
watches of its subsystems (`event_source_for`). Events only wake the loop —
every pass re-reads everything — and carry what attribution needs.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import select
import signal
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from trueup.system.events import EventCallback, EventSource, KernelEventSource, NetlinkEvent
from trueup.system.safefile import ensure_dir

__all__ = [
    "STATE_DIR",
    "CommandEventSource",
    "CompositeEventSource",
    "FileEventSource",
    "PeriodicEventSource",
    "Watch",
    "command",
    "event_source_for",
    "every",
    "files",
    "rtnetlink",
]

log = logging.getLogger("trueup.watches")

RTNETLINK_KINDS = frozenset({"link", "address", "route"})
# Stands for the agent's state directory at the start of a watched path.
STATE_DIR = "{STATE_DIR}"


@dataclass(frozen=True)
class Watch:
    """One thing that can change a subsystem's part of the system."""

    kind: str  # rtnetlink | file | periodic | command
    events: frozenset[str] = frozenset()  # rtnetlink kinds
    paths: tuple[str, ...] = ()  # files
    seconds: float = 0.0  # periodic
    argv: tuple[str, ...] = ()  # command


def rtnetlink(*kinds: str) -> Watch:
    unknown = set(kinds) - RTNETLINK_KINDS
    if unknown:
        raise ValueError(f"rtnetlink watch: unknown kinds {sorted(unknown)}")
    return Watch("rtnetlink", events=frozenset(kinds))


def files(*paths: str) -> Watch:
    return Watch("file", paths=tuple(paths))


def every(seconds: float) -> Watch:
    if seconds <= 0:
        raise ValueError("periodic watch: seconds must be positive")
    return Watch("periodic", seconds=seconds)


def command(*argv: str) -> Watch:
    return Watch("command", argv=tuple(argv))


class PeriodicEventSource:
    """A `tick` event every `seconds`."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.name = f"every {seconds:g}s"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, callback: EventCallback) -> None:
        def run() -> None:
            while not self._stop.wait(self.seconds):
                callback(NetlinkEvent("tick", "tick", time.time(), detail={"every": self.seconds}))

        self._thread = threading.Thread(target=run, name="trueup-tick", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()


# inotify(7), through libc: no dependency for one system call family.
_IN_MODIFY = 0x002
_IN_ATTRIB = 0x004
_IN_CLOSE_WRITE = 0x008
_IN_MOVED_TO = 0x080
_IN_CREATE = 0x100
_IN_DELETE = 0x200
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_MASK = _IN_MODIFY | _IN_ATTRIB | _IN_CLOSE_WRITE | _IN_MOVED_TO | _IN_CREATE | _IN_DELETE
_NAMES = {
    _IN_MODIFY: "IN_MODIFY",
    _IN_ATTRIB: "IN_ATTRIB",
    _IN_CLOSE_WRITE: "IN_CLOSE_WRITE",
    _IN_MOVED_TO: "IN_MOVED_TO",
    _IN_CREATE: "IN_CREATE",
    _IN_DELETE: "IN_DELETE",
}


class FileEventSource:
    """inotify on the directories of `paths`; an event for each change to one of the files."""

    def __init__(self, paths: Iterable[str]) -> None:
        self.paths = sorted(set(paths))
        self.name = "inotify"
        self._stop = threading.Event()
        self._fd = -1

    def start(self, callback: EventCallback) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            log.warning("inotify unavailable: %s", os.strerror(ctypes.get_errno()))
            return
        self._fd = fd
        directories: dict[int, Path] = {}
        wanted: dict[Path, set[str]] = {Path(p).parent: set() for p in self.paths}
        for path in self.paths:
            wanted[Path(path).parent].add(Path(path).name)
        for directory in wanted:
            wd = libc.inotify_add_watch(fd, str(directory).encode(), _MASK)
            if wd < 0:
                log.warning("cannot watch %s: %s", directory, os.strerror(ctypes.get_errno()))
                continue
            directories[wd] = directory

        def run() -> None:
            while not self._stop.is_set():
                ready, _, _ = select.select([fd], [], [], 0.5)
                if not ready:
                    continue
                try:
                    data = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                except OSError:
                    return
                offset = 0
                while offset + 16 <= len(data):
                    wd, mask, _cookie, length = struct.unpack_from("iIII", data, offset)
                    raw = data[offset + 16 : offset + 16 + length]
                    offset += 16 + length
                    name = raw.rstrip(b"\0").decode(errors="replace")
                    directory = directories.get(wd)
                    if directory is None or name not in wanted.get(directory, set()):
                        continue
                    message = next((n for bit, n in _NAMES.items() if mask & bit), "IN_CHANGE")
                    callback(
                        NetlinkEvent(
                            "file", message, time.time(), detail={"path": str(directory / name)}
                        )
                    )

        threading.Thread(target=run, name="trueup-inotify", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)


_PR_SET_PDEATHSIG = 1


def _death_signal() -> Callable[[], None]:
    """For the child: SIGTERM when the agent dies, even by SIGKILL (no orphaned watchers).

    libc is loaded here, in the parent: the child only makes the call.
    """
    prctl = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True).prctl

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)

    return arm


class CommandEventSource:
    """A long-running program (`nft monitor`); each line it prints is a change."""

    def __init__(self, argv: tuple[str, ...]) -> None:
        self.argv = argv
        self.name = " ".join(argv)
        self._stop = threading.Event()
        self._proc: subprocess.Popen[str] | None = None

    def start(self, callback: EventCallback) -> None:
        arm = _death_signal()

        def run() -> None:
            delay = 1.0
            while not self._stop.is_set():
                try:
                    self._proc = subprocess.Popen(
                        list(self.argv),
                        stdout=subprocess.PIPE,
                        stderr=subprocess.DEVNULL,
                        text=True,
                        preexec_fn=arm,
                    )
                except OSError as exc:
                    log.warning("watch %s: %s", self.name, exc)
                    self._stop.wait(delay)
                    delay = min(60.0, delay * 2)
                    continue
                assert self._proc.stdout is not None
                for line in self._proc.stdout:
                    callback(
                        NetlinkEvent(
                            "command", self.argv[0], time.time(), detail={"line": line.rstrip()}
                        )
                    )
                self._proc.wait()
                if not self._stop.is_set():
                    # It ended: changes may have been missed. A tick makes the loop look.
                    callback(NetlinkEvent("overflow", "overflow", time.time()))
                    self._stop.wait(delay)

        threading.Thread(target=run, name="trueup-command-watch", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()


class CompositeEventSource:
    """Several event sources behind one `EventSource`."""

    def __init__(self, sources: list[EventSource]) -> None:
        self.sources = sources
        self.name = "+".join(s.name for s in sources) or "none"

    def start(self, callback: EventCallback) -> None:
        for source in self.sources:
            source.start(callback)

    def stop(self) -> None:
        for source in self.sources:
            source.stop()


def event_source_for(
    watches: Iterable[Watch], state_dir: Path | None = None
) -> CompositeEventSource:
    """One source for everything the subsystems watch: rtnetlink first.

    Watched paths under `STATE_DIR` are resolved against `state_dir` (their
    directory is made, 0700, so that it can be watched before the file
    exists); without a state directory they are not watched.
    """
    watches = list(watches)
    sources: list[EventSource] = []
    if any(w.kind == "rtnetlink" for w in watches):
        sources.append(KernelEventSource())
    paths = []
    for path in (p for w in watches if w.kind == "file" for p in w.paths):
        if path.startswith(STATE_DIR):
            if state_dir is None:
                continue
            path = str(state_dir) + path[len(STATE_DIR) :]
            try:
                ensure_dir(Path(path).parent)  # never a link out of the state directory
            except OSError as exc:  # a damaged state directory: the periodic look remains
                log.warning("cannot watch %s: %s", path, exc)
                continue
        paths.append(path)
    if paths:
        sources.append(FileEventSource(paths))
    periods = sorted({w.seconds for w in watches if w.kind == "periodic"})
    if periods:
        sources.append(PeriodicEventSource(periods[0]))
    for argv in sorted({w.argv for w in watches if w.kind == "command"}):
        sources.append(CommandEventSource(argv))
    return CompositeEventSource(sources)
