"""Knot DNS as trueup runs it: where its files live, and `knotc` over its control socket.

Who uses this: the DNS subsystem (`trueup.subsystems.dns`). Every call goes
through the `Runner` seam (`knotc` is a program), so unit tests hand the
subsystem `trueup.system.fakeknot.FakeKnotc` instead of a real server.

```python
paths = knot_paths(sources.daemons.run_dir("knot"))
knot = KnotControl(sources.runner, paths.socket)
knot.read_zone("lan.test.")                 # ["router.lan.test. 300 A 203.0.113.1", …]
knot.change_zone("lan.test.", remove=[…], add=[…])   # one zone transaction
```

Layout, in the daemon's run directory `STATE_DIR/run/knot` (0700; files 0600):

```
knot.conf            the configuration trueup compiled (rewritten before every start)
knot.sock            the control socket (under /run/trueup/… when the path is too long)
zones/ZONE.zone      SOA + the static records trueup set (Knot never writes it back)
db/                  Knot's own databases (timers; the journal is not used)
state.json           what trueup last put in the zones: static records, lease settings, lease records
knot.pid, knot.log   the supervisor's pid record and the daemon's output (knotd.pid: Knot's own)
```

Records are exchanged as canonical text, exactly as `knotc zone-read`
prints them without the `[zone]` prefix: `OWNER TTL TYPE RDATA`, owner
absolute and lower-case.
"""

from __future__ import annotations

import contextlib
import shlex
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from trueup.system.processes import clear_stale_pidfile as clear_pidfile
from trueup.system.requirements import Requirement, binary
from trueup.system.runner import Runner
from trueup.system.sockets import SUN_PATH_MAX, socket_dir

__all__ = [
    "DAEMON",
    "REQUIREMENTS",
    "KnotControl",
    "KnotError",
    "KnotPaths",
    "clear_stale_pidfile",
    "knot_paths",
    "render_config",
]

DAEMON = "knot"
# What `trueup preflight` checks before an agent that serves DNS starts: the daemon and
# the control program every step goes through.
REQUIREMENTS: tuple[Requirement, ...] = (
    binary("knotd", "knot", ("-V",)),
    binary("knotc", "knot", ("-V",)),
)
_TIMEOUT = 10.0


class KnotError(RuntimeError):
    """`knotc` failed or Knot refused a change; names the command and Knot's words."""


@dataclass(frozen=True)
class KnotPaths:
    run_dir: Path
    config: Path
    socket: Path
    zones: Path
    db: Path
    state: Path

    @property
    def argv(self) -> tuple[str, ...]:
        return ("knotd", "-c", str(self.config))

    @property
    def pidfile(self) -> Path:
        """Knot's own pid file (`knot.pid` is the supervisor's record)."""
        return self.run_dir / "knotd.pid"

    def zone_file(self, zone: str) -> Path:
        return self.zones / f"{zone}zone"


def clear_stale_pidfile(paths: KnotPaths, proc: Path = Path("/proc")) -> str | None:
    """Before a start: remove Knot's own pid file when it names no live Knot of ours.

    Knot refuses to start ("server PID found, already running") while the pid
    in it answers `kill(pid, 0)` — a killed Knot's zombie not yet reaped does.
    """
    return clear_pidfile(paths.pidfile, paths.argv, "Knot", proc)


def knot_paths(run_dir: Path, *, create: bool = False) -> KnotPaths:
    """Where Knot's files are, given the daemon's run directory.

    The control socket stays in it while the path fits the kernel's 107
    bytes (Knot takes that much); otherwise it is in `/run/trueup/knot-DIGEST`,
    made by a start (`create`, or `make_socket_dir`) and removed when Knot is stopped.
    """
    socket = socket_dir(run_dir, ("knot.sock",), SUN_PATH_MAX, prefix="knot-", create=create)
    socket = socket / "knot.sock"
    return KnotPaths(
        run_dir=run_dir,
        config=run_dir / "knot.conf",
        socket=socket,
        zones=run_dir / "zones",
        db=run_dir / "db",
        state=run_dir / "state.json",
    )


def _line(*words: str) -> str:
    # knotc's interactive tokenizer follows shell quoting: TXT rdata keeps its quotes.
    return " ".join(shlex.quote(w) for w in words)


class KnotControl:
    """`knotc -s SOCKET …`, one command or one batch per call."""

    def __init__(self, runner: Runner, socket: Path, *, timeout: float = _TIMEOUT) -> None:
        self.runner = runner
        self.socket = socket
        self.timeout = timeout

    def _knotc(self, *args: str, input: str | None = None) -> str:
        argv = ["knotc", "-s", str(self.socket), "-t", f"{self.timeout:g}", *args]
        done = self.runner.run(argv, input=input, timeout=self.timeout + 5)
        errors = [line for line in done.stdout.splitlines() if line.startswith("error:")]
        if not done.ok or errors:
            detail = (errors[0] if errors else (done.stderr or done.stdout).strip()) or "failed"
            raise KnotError(f"knotc {args[0] if args else ''}: {detail}")
        return done.stdout

    def ready(self) -> bool:
        """Whether Knot answers on its control socket."""
        try:
            self._knotc("status")
        except KnotError:
            return False
        return True

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready():
            if time.monotonic() > deadline:
                raise KnotError(f"knotd does not answer on {self.socket} after {timeout:g}s")
            time.sleep(0.05)

    def conf_read(self, item: str) -> list[str]:
        """The values of one configuration item of the running server (`server.listen`)."""
        out = self._knotc("conf-read", item)
        return [line.split(" = ", 1)[1] for line in out.splitlines() if " = " in line]

    def read_zone(self, zone: str) -> list[str]:
        """Every record of `zone` as Knot serves it, canonical text, SOA included."""
        out = self._knotc("zone-read", zone)
        prefix = f"[{zone}] "
        return [line[len(prefix) :] for line in out.splitlines() if line.startswith(prefix)]

    def change_zone(self, zone: str, *, remove: Iterable[str], add: Iterable[str]) -> None:
        """Remove and add records in one zone transaction; nothing changes when one is refused.

        A transaction left open on the zone (an agent killed in the middle of
        one, or an edit in progress by hand) is aborted first: trueup owns the
        zone, and an open transaction would block every change.
        """
        lines = []
        for record in remove:
            owner, _ttl, rtype, rdata = record.split(" ", 3)
            lines.append(_line("zone-unset", zone, owner, rtype, rdata))
        for record in add:
            owner, ttl, rtype, rdata = record.split(" ", 3)
            lines.append(_line("zone-set", zone, owner, ttl, rtype, rdata))
        if not lines:
            return
        try:
            self._knotc("zone-begin", zone)
        except KnotError as exc:
            if "too many transactions" not in str(exc):
                raise
            self._knotc("zone-abort", zone)
            self._knotc("zone-begin", zone)
        try:
            self._knotc(input="\n".join(lines) + "\n")
            self._knotc("zone-commit", zone)
        except KnotError:
            # The commit may have closed it already; the first error is the news.
            with contextlib.suppress(KnotError):
                self._knotc("zone-abort", zone)
            raise


def render_config(paths: KnotPaths, listen: Iterable[str], zones: Iterable[str]) -> str:
    """Knot's configuration: trueup's run directory for everything, zone files never written back.

    `zonefile-sync: -1` and `journal-content: none`: Knot keeps changes made
    through `knotc` in memory only. The zone file holds what trueup set
    (SOA and static records) and lease-derived records are seeded again
    after every start, so nothing Knot persisted can outlive trueup's view.
    """
    addresses = ", ".join(f'"{a}"' for a in listen)
    lines = [
        "# written by trueup before every start: edits are replaced",
        "server:",
        f'    rundir: "{paths.run_dir}"',
        # Not knot.pid: that name is the supervisor's pid record.
        f'    pidfile: "{paths.pidfile}"',
        f"    listen: [ {addresses} ]",
        "control:",
        f'    listen: "{paths.socket}"',
        "log:",
        "  - target: stdout",
        "    any: info",
        "database:",
        f'    storage: "{paths.db}"',
        "template:",
        "  - id: default",
        f'    storage: "{paths.zones}"',
        '    file: "%s.zone"',
        "    zonefile-sync: -1",
        "    zonefile-load: whole",
        "    journal-content: none",
        "zone:",
    ]
    lines += [f'  - domain: "{zone}"' for zone in zones]
    return "\n".join(lines) + "\n"
