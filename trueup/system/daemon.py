"""Long-running daemons the agent starts and supervises (Kea, Knot, …).

Who uses this: subsystems, through `Sources.daemons` (a `Daemons`), to make
sure their daemon runs with the argv they compiled; the agent keeps one
`DaemonSupervisor` for its lifetime, so supervision outlives any one
transaction. Unit tests hand subsystems `trueup.system.fake.FakeDaemons`.

The interface (`DaemonSpec`, `DaemonStatus`, the `Daemons` protocol,
`DaemonError`) is `trueup.system.daemonspec`; the pid record and its
verification are `trueup.system.pidrecord`. Import those names from there:
this module is the supervisor alone.

Rules:

* A daemon runs in the agent's own network namespace (the agent runs inside
  the router's namespace; children inherit it), in a new session, with its
  output appended to `RUN_DIR/NAME/NAME.log`.
* Each daemon has a pid record `RUN_DIR/NAME/NAME.pid`; a new supervisor
  (after an agent restart, even after SIGKILL) *adopts* the instance it
  names only when it verifiably still is that process (`pidrecord`).
* Signals go to that one verified pid — never a name pattern. The one
  exception is what an instance leaves behind: a daemon runs in a session of
  its own (its pid is the session id), and the processes still in that
  session once the recorded pid is gone (keepalived's VRRP child survives a
  SIGKILL of its parent; HAProxy workers outlive their master for a moment)
  are that instance's. Before every (re)start and after every stop they are
  ended (SIGTERM, SIGKILL after the spec's timeout) and waited for, so a new
  instance never meets the old one ("daemon is already running"). A member
  counts only when its environment carries the instance's mark
  (`INSTANCE_ENV`, a random value in the pid record, inherited by all it
  forks): the recorded pid may have been reused by a process that made a
  session of its own and double-forked, and what it left is not ours.
* A start is finished only when the new instance answers (`DaemonSpec.ready`,
  polled until `ready_timeout`): `ensure` raises `DaemonError` when it exits
  first or does not answer in time, with the daemon's own last log lines as
  the cause — a heal that restarted it is then a failure, never `healed`.
* A daemon that exits without being asked to is restarted with exponential
  back-off (1 s doubling to 30 s, reset after 60 s of good running);
  `before_start` and `after_start` run on every restart too, so an invariant
  (no HA configuration, the allocator fence) is re-asserted each time.
* The supervisor never stops daemons when the agent exits: DHCP keeps
  serving while the agent restarts, and the next agent adopts it.

Why this module is over 400 lines: one daemon's process handling (its
session's leftovers, its readiness, its socket directory) and the
supervisor's restart loop share one lock discipline; apart, each would have
to re-state it. What reads the kernel's view of processes alone is
`trueup.system.processes`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import select
import signal
import subprocess
import threading
import time
from pathlib import Path

from trueup.system.atomicfile import write_atomic
from trueup.system.daemonspec import DaemonError, DaemonSpec, DaemonStatus
from trueup.system.pidrecord import (
    INSTANCE_ENV,
    PidRecord,
    proc_start_time,
    record_argv,
    verified_pid,
)
from trueup.system.processes import (
    START_MARK,
    log_tail,
    session_members,
    signal_all,
    stat_fields,
    wait_gone,
)
from trueup.system.safefile import UnsafeFile, ensure_dir, open_file, read_file, unsafe_entries
from trueup.system.sockets import remove_socket_dir

__all__ = ["DaemonSupervisor"]

log = logging.getLogger("trueup.daemon")

BACKOFF_FIRST = 1.0
# How long leftovers get after SIGKILL before the start goes ahead regardless.
KILL_WAIT = 5.0
BACKOFF_MAX = 30.0
# A daemon that ran this long before exiting is restarted after the first back-off again.
STABLE_AFTER = 60.0


class _Daemon:
    """One supervised daemon: its process, its pid record and its monitor thread."""

    def __init__(self, spec: DaemonSpec, directory: Path) -> None:
        self.spec = spec
        self.directory = directory
        self.pid: int | None = None
        self.child: subprocess.Popen[bytes] | None = None
        self.since: float | None = None
        self.restarts = 0
        self.adopted = False
        self.last_exit: int | None = None
        self.last_error = ""
        self.wanted = False
        self.lock = threading.RLock()
        self.wake = threading.Event()
        self.monitor: threading.Thread | None = None
        # The pid that answered `spec.ready` (None: not yet, or no instance).
        self.ready_pid: int | None = None
        # Where this instance's output starts in the log (its own last lines name a failure).
        self.log_offset = 0

    @property
    def record_path(self) -> Path:
        return self.directory / f"{self.spec.name}.pid"

    @property
    def log_path(self) -> Path:
        return self.directory / f"{self.spec.name}.log"

    def tail(self) -> str:
        return log_tail(self.log_path, self.log_offset)

    def socket_dir(self) -> Path | None:
        """Its moved socket directory: the spec's, else the one its pid record names."""
        if self.spec.sockets is not None:
            return self.spec.sockets
        named = (self.read_record() or {}).get("sockets")
        return Path(named) if isinstance(named, str) and named else None

    def remove_sockets(self, directory: Path | None) -> None:
        if directory is not None and remove_socket_dir(directory, self.directory):
            log.info("%s: removed its socket directory %s", self.spec.name, directory)

    def previous(self) -> tuple[int, int | None, str] | None:
        """The last instance's pid, start time and instance mark: the pid record's, else
        this process's own."""
        record = self.read_record() or {}
        try:
            return (
                int(str(record["pid"])),
                int(str(record["start_time"])),
                str(record.get("instance") or ""),
            )
        except (KeyError, TypeError, ValueError):
            pass
        return (self.pid, self._started, self.instance) if self.pid is not None else None

    def leftovers(self) -> dict[int, int]:
        """Processes still in the last instance's session (its recorded pid is its session id):
        pid → start time."""
        previous = self.previous()
        if previous is None:
            return {}
        pid, started, instance = previous
        if not instance:
            return {}  # nothing proves a member is that instance's: none is signalled
        fields = stat_fields(pid)
        if (
            fields is not None
            and len(fields) > 19
            and fields[0] not in ("Z", "X")
            and fields[19] != str(started)
        ):
            return {}  # a recycled pid: while it lives, no old session of that id can
        # Called when the instance is not running (before a start) or has been
        # stopped: whatever is still in its session is what it left.
        # Only members carrying the instance's mark in their environment: the session
        # id may be a reused pid's whose own leftovers (a double-forked daemon) are not ours.
        members = session_members(pid, started, marker=f"{INSTANCE_ENV}={instance}")
        members.pop(os.getpid(), None)
        return members

    def reap_leftovers(self) -> list[int]:
        """End what the last instance left in its session (SIGTERM, then SIGKILL); wait for it."""
        found = self.leftovers()
        if not found:
            return []
        log.warning(
            "%s: the last instance left processes %s in its session; ending them before a start",
            self.spec.name,
            ", ".join(map(str, found)),
        )
        signal_all(found, signal.SIGTERM)
        if not wait_gone(found, self.spec.stop_timeout):
            signal_all(found, signal.SIGKILL)
            if not wait_gone(found, KILL_WAIT):
                raise DaemonError(
                    f"{self.spec.name}: processes {sorted(found)} of the last instance do not exit"
                )
        return sorted(found)

    def read_record(self) -> dict[str, object] | None:
        """The pid record as found (read field by field: it may be damaged)."""
        try:
            data = json.loads(read_file(self.record_path, 1 << 16))
        except (OSError, ValueError):  # missing, unreadable, or not a regular file of ours
            return None
        return data if isinstance(data, dict) else None

    def status(self) -> DaemonStatus:
        with self.lock:
            alive = self.pid is not None and self.alive()
            error = self.last_error
            if not alive and not error:
                # Not started by this supervisor (a new agent, the CLI): why the last
                # instance ended, in its own words, if its log names a problem.
                error = log_tail(self.log_path, causes_only=True, last_instance=True)
            return DaemonStatus(
                self.spec.name,
                alive,
                self.pid if alive else None,
                self.since if alive else None,
                self.restarts,
                self.adopted,
                self.last_exit,
                error,
            )

    def alive(self) -> bool:
        if self.pid is None:
            return False
        if self.child is not None:
            return self.child.poll() is None
        record: PidRecord = {
            "pid": self.pid,
            "argv": list(self.spec.argv),
            "start_time": self._started,
            "reexec": self.spec.reexec,
        }
        return verified_pid(record) == self.pid

    _started: int | None = None
    instance = ""  # the mark in the environment of this instance and all it forks

    def adopt(self) -> bool:
        """Take over the instance the pid record names, when it verifiably is ours."""
        record = self.read_record()
        if record is None:
            return False
        pid = verified_pid(record)
        if pid is None:
            return False
        self.pid, self.child, self.adopted = pid, None, True
        self._started = int(str(record["start_time"]))
        self.instance = str(record.get("instance") or "")
        self.since = float(str(record.get("since", time.time())))
        log.info("adopted %s (pid %d)", self.spec.name, pid)
        return True

    def spawn(self) -> None:
        spec = self.spec
        try:
            ensure_dir(self.directory, levels=2)  # neither run/ nor run/NAME a link out
            os.chmod(self.directory.parent, 0o700)
            os.chmod(self.directory, 0o700)
        except UnsafeFile as exc:
            raise DaemonError(f"{spec.name}: cannot start: {exc}") from exc
        # The daemon opens its own files (pid, lease, lock files) and follows links:
        # it is not started while anything in its directory is not a file of ours.
        unsafe = unsafe_entries(self.directory)
        if unsafe:
            path, problem = unsafe[0]
            more = f" (and {len(unsafe) - 1} more)" if len(unsafe) > 1 else ""
            raise DaemonError(f"{spec.name}: cannot start: {UnsafeFile(path, problem)}{more}")
        # The old instance (and what it left in its session) is gone before a new one starts.
        self.reap_leftovers()
        if spec.before_start is not None:
            spec.before_start()
        env = dict(os.environ)
        env.update(dict(spec.env))
        # Inherited by whatever the instance forks: what it leaves is known by it.
        self.instance = secrets.token_hex(8)
        env[INSTANCE_ENV] = self.instance
        self.ready_pid = None
        try:
            log_fd = open_file(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        except OSError as exc:
            raise DaemonError(f"{spec.name}: cannot start: its log {exc}") from exc
        with os.fdopen(log_fd, "ab") as out:
            out.write(f"{START_MARK}\n".encode())
            out.flush()
            self.log_offset = out.tell()
            try:
                child = subprocess.Popen(
                    list(spec.argv),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=self.directory,
                    start_new_session=True,
                    close_fds=True,
                    umask=spec.umask,
                )
            except OSError as exc:
                raise DaemonError(f"{spec.name}: cannot start {spec.argv[0]}: {exc}") from exc
        started = None
        for _ in range(100):  # /proc/PID/stat exists as soon as fork returns
            started = proc_start_time(child.pid)
            if started is not None:
                break
            time.sleep(0.001)
        self.pid, self.child, self.adopted, self._started = child.pid, child, False, started
        self.since = time.time()
        record: PidRecord = {
            "pid": child.pid,
            "argv": list(spec.argv),
            "start_time": started,
            "since": self.since,
            "reexec": spec.reexec,
            "instance": self.instance,
        }
        if spec.sockets is not None and spec.sockets != self.directory:
            record["sockets"] = str(spec.sockets)
        write_atomic(self.record_path, json.dumps(record).encode(), 0o600)
        log.info("started %s (pid %d)", spec.name, child.pid)
        if spec.after_start is not None:
            try:
                spec.after_start(child.pid)
            except Exception as exc:  # the monitor re-runs it on the next restart
                self.last_error = f"after start: {exc}"
                exited = child.poll()
                if exited is not None:
                    # Its own words say why, not only that its socket never answered.
                    self.last_exit = exited
                    self.last_error = (
                        f"{spec.name} (pid {child.pid}) exited with status {exited}: "
                        f"{self.tail() or 'no output'} (after start: {exc})"
                    )
                log.warning("%s: after start: %s", spec.name, self.last_error)

    def wait_exit(self, timeout: float | None) -> bool:
        """Wait until the process exits; True when it did."""
        child, pid = self.child, self.pid
        if pid is None:
            return True
        if child is not None:
            try:
                child.wait(timeout)
            except subprocess.TimeoutExpired:
                return False
            self.last_exit = child.returncode
            return True
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return True
        try:
            ready, _, _ = select.select([fd], [], [], timeout)
            return bool(ready) or not self.alive()
        finally:
            os.close(fd)

    def signal(self, sig: int) -> None:
        if self.pid is not None and self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.signal(signal.SIGTERM)
        if not self.wait_exit(self.spec.stop_timeout):
            self.signal(signal.SIGKILL)
            self.wait_exit(5.0)
        # What it left in its session goes with it (the record still names the session).
        with contextlib.suppress(DaemonError):
            self.reap_leftovers()
        self.pid = None
        self.child = None
        self.ready_pid = None
        with contextlib.suppress(FileNotFoundError):
            self.record_path.unlink()

    def await_ready(self) -> None:
        """Until `spec.ready` holds for the current instance; DaemonError when it exits first."""
        spec, pid, child = self.spec, self.pid, self.child
        if spec.ready is None or pid is None or self.ready_pid == pid:
            return
        deadline = time.monotonic() + spec.ready_timeout
        while True:
            exited = child.poll() if child is not None else None
            if exited is None and child is None and not self.alive():
                exited = -1
            if exited is not None:
                cause = self.tail() or "no output"
                status = "" if exited == -1 else f" with status {exited}"
                raise DaemonError(f"{spec.name} (pid {pid}) exited at once{status}: {cause}")
            try:
                answered = spec.ready(pid)
            except Exception as exc:  # a probe that fails is an instance not answering yet
                log.debug("%s: ready probe: %s", spec.name, exc)
                answered = False
            if answered:
                self.ready_pid = pid
                return
            if time.monotonic() > deadline:
                cause = self.tail() or "no output"
                raise DaemonError(
                    f"{spec.name} (pid {pid}) did not answer within {spec.ready_timeout:g}s: "
                    f"{cause}"
                )
            time.sleep(0.02)


class DaemonSupervisor:
    """The agent's daemons, under `STATE_DIR/run/`. Thread-safe."""

    def __init__(self, run_root: Path) -> None:
        self.run_root = Path(run_root)
        self._daemons: dict[str, _Daemon] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()

    def run_dir(self, name: str) -> Path:
        directory = ensure_dir(self.run_root / name, levels=2)
        os.chmod(self.run_root, 0o700)
        os.chmod(directory, 0o700)
        return directory

    def _daemon(self, spec: DaemonSpec | None, name: str) -> _Daemon:
        with self._lock:
            daemon = self._daemons.get(name)
            if daemon is None:
                if spec is None:
                    spec = DaemonSpec(name, ())
                daemon = _Daemon(spec, self.run_root / name)  # made on first start
                self._daemons[name] = daemon
            elif spec is not None and spec != daemon.spec:
                daemon.spec = spec
            elif spec is not None:
                daemon.spec = spec  # refresh the callbacks, which do not compare
            return daemon

    def _recorded(self, daemon: _Daemon) -> None:
        """Adopt from the pid record when nothing runs under this supervisor yet."""
        if daemon.pid is None and not daemon.spec.argv:
            record = daemon.read_record()
            if record is not None and record_argv(record):
                daemon.spec = DaemonSpec(
                    daemon.spec.name, record_argv(record), reexec=bool(record.get("reexec"))
                )
        if daemon.pid is None:
            daemon.adopt()

    def ensure(self, spec: DaemonSpec) -> DaemonStatus:
        if not spec.argv:
            raise ValueError(f"daemon {spec.name}: empty argv")
        daemon = self._daemon(spec, spec.name)
        with daemon.lock:
            self._recorded(daemon)
            stale = record_argv(daemon.read_record() or {}) != spec.argv
            if daemon.pid is not None and daemon.alive() and stale:
                daemon.terminate()
            if daemon.pid is None or not daemon.alive():
                daemon.pid = None
                try:
                    daemon.spawn()
                except (DaemonError, OSError) as exc:
                    daemon.last_error = str(exc)
                    daemon.wanted = True
                    self._monitor(daemon)
                    raise DaemonError(str(exc)) from exc
                daemon.last_error = ""
            daemon.wanted = True
            self._monitor(daemon)
        # Outside the lock: status and the monitor are not held up by a slow start.
        try:
            daemon.await_ready()
        except DaemonError as exc:
            with daemon.lock:
                daemon.last_error = str(exc)
            log.warning("%s", exc)
            raise
        return daemon.status()

    def stop(self, name: str) -> None:
        daemon = self._daemon(None, name)
        with daemon.lock:
            daemon.wanted = False
            self._recorded(daemon)
            daemon.wake.set()
            sockets = daemon.socket_dir()
            daemon.terminate()
            daemon.remove_sockets(sockets)

    def restart(self, name: str) -> DaemonStatus:
        daemon = self._daemon(None, name)
        spec = daemon.spec
        self.stop(name)
        return self.ensure(spec)

    def running(self, name: str) -> bool:
        daemon = self._daemon(None, name)
        with daemon.lock:
            self._recorded(daemon)
            return daemon.alive()

    def status(self, name: str) -> DaemonStatus:
        daemon = self._daemon(None, name)
        with daemon.lock:
            self._recorded(daemon)
            return daemon.status()

    def signal(self, name: str, sig: int) -> bool:
        daemon = self._daemon(None, name)
        with daemon.lock:
            self._recorded(daemon)
            if daemon.pid is None or not daemon.alive():
                return False
            daemon.signal(sig)
            return True

    def close(self) -> None:
        """Stop supervising (the daemons keep running, for the next agent to adopt).

        The moved socket directory of a daemon that does not run is removed; a
        running daemon keeps its own (the next agent reaches it there).
        """
        self._closed.set()
        with self._lock:
            daemons = list(self._daemons.values())
        for daemon in daemons:
            daemon.wake.set()
            with daemon.lock:
                self._recorded(daemon)
                if not daemon.alive():
                    daemon.remove_sockets(daemon.socket_dir())

    # -- supervision --------------------------------------------------------
    def _monitor(self, daemon: _Daemon) -> None:
        if daemon.monitor is not None and daemon.monitor.is_alive():
            return
        thread = threading.Thread(
            target=self._watch, args=(daemon,), name=f"trueup-daemon-{daemon.spec.name}"
        )
        thread.daemon = True
        daemon.monitor = thread
        thread.start()

    def _watch(self, daemon: _Daemon) -> None:
        backoff = BACKOFF_FIRST
        while not self._closed.is_set():
            with daemon.lock:
                wanted, pid = daemon.wanted, daemon.pid
            if not wanted:
                return
            if pid is not None and not daemon.wait_exit(1.0):
                continue
            with daemon.lock:
                if not daemon.wanted or self._closed.is_set():
                    return
                if daemon.pid is not None and daemon.alive():
                    continue
                ran = time.time() - (daemon.since or time.time())
                if daemon.pid is not None:
                    log.warning(
                        "%s (pid %s) exited (%s); restarting in %.0fs",
                        daemon.spec.name,
                        daemon.pid,
                        daemon.last_exit,
                        backoff,
                    )
                    tail = daemon.tail()
                    daemon.last_error = f"exited with status {daemon.last_exit}" + (
                        f": {tail}" if tail else ""
                    )
                daemon.pid = None
                if ran >= STABLE_AFTER:
                    backoff = BACKOFF_FIRST
            daemon.wake.clear()
            if daemon.wake.wait(backoff) and not daemon.wanted:
                return
            if self._closed.is_set():
                return
            with daemon.lock:
                if not daemon.wanted or (daemon.pid is not None and daemon.alive()):
                    continue
                daemon.restarts += 1
                try:
                    daemon.spawn()
                except (DaemonError, OSError) as exc:
                    daemon.last_error = str(exc)
                    log.warning("%s: %s", daemon.spec.name, exc)
            backoff = min(backoff * 2, BACKOFF_MAX)
