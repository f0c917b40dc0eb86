"""What a subsystem asks of the daemon supervisor: the spec, the status, the `Daemons` seam.

Who uses this: subsystems (through `Sources.daemons`, a `Daemons`), the
supervisor that implements it (`trueup.system.daemon.DaemonSupervisor`) and
the fakes (`trueup.system.fake.FakeDaemons`).

```python
spec = DaemonSpec(
    name="kea-dhcp4",
    argv=("kea-dhcp4", "-c", "/var/lib/trueup/run/kea-dhcp4/kea-dhcp4.conf"),
    before_start=write_config_without_ha,   # every (re)start, before exec
    after_start=reassert_fence,             # every (re)start, once the pid exists
)
sources.daemons.ensure(spec)       # adopt a running instance, or start one
sources.daemons.running("kea-dhcp4")
sources.daemons.run_dir("kea-dhcp4")   # STATE_DIR/run/kea-dhcp4 (0700)
```
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypedDict

__all__ = ["DaemonError", "DaemonSpec", "DaemonStatus", "DaemonStatusJSON", "Daemons"]


class DaemonStatusJSON(TypedDict):
    """`DaemonStatus` as status and the agent API show it."""

    name: str
    running: bool
    pid: int | None
    since: float | None
    restarts: int
    adopted: bool
    last_exit: int | None
    last_error: str


class DaemonError(RuntimeError):
    """A daemon that could not be started or stopped; names the daemon and the cause."""


@dataclass(frozen=True)
class DaemonSpec:
    """What to run. `name` is also the run directory and pid record name."""

    name: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    # Called before every (re)start: write the configuration the daemon reads.
    before_start: Callable[[], None] | None = field(default=None, compare=False)
    # Called after every (re)start with the new pid (re-assert state over its socket).
    after_start: Callable[[int], None] | None = field(default=None, compare=False)
    # How long `stop` waits after SIGTERM before SIGKILL.
    stop_timeout: float = 10.0
    # Files and sockets the daemon creates are the agent's alone.
    umask: int = 0o077
    # The daemon re-executes itself on a reload with words of its own added to
    # its argv (HAProxy's master: `-sf PIDS -x SOCKET`), and its cmdline reads
    # empty while it does: it is verified by its program name and start time.
    reexec: bool = False
    # Whether the instance with this pid answers (its socket, its VRRP child): `ensure`
    # returns only once it does. None: running is enough.
    ready: Callable[[int], bool] | None = field(default=None, compare=False)
    # How long `ensure` waits for `ready` (generous: a loaded machine starts slowly).
    ready_timeout: float = 30.0
    # Where its sockets are when not in its run directory (`trueup.system.sockets`):
    # removed once it is stopped, and when the agent exits while it does not run.
    sockets: Path | None = field(default=None, compare=False)


@dataclass(frozen=True)
class DaemonStatus:
    """What the supervisor knows about one daemon."""

    name: str
    running: bool
    pid: int | None = None
    since: float | None = None
    restarts: int = 0
    adopted: bool = False
    last_exit: int | None = None
    last_error: str = ""

    def to_json(self) -> DaemonStatusJSON:
        return {
            "name": self.name,
            "running": self.running,
            "pid": self.pid,
            "since": self.since,
            "restarts": self.restarts,
            "adopted": self.adopted,
            "last_exit": self.last_exit,
            "last_error": self.last_error,
        }


class Daemons(Protocol):
    """The daemon supervisor as subsystems see it (`Sources.daemons`)."""

    def run_dir(self, name: str) -> Path:
        """The daemon's private directory (0700): sockets, config, pid record, log."""
        ...

    def ensure(self, spec: DaemonSpec) -> DaemonStatus:
        """Adopt a verified running instance with this argv, or start one; supervise it.

        A running instance with another argv is stopped and started anew.
        Raises DaemonError when it cannot be started (the supervisor keeps
        retrying with back-off).
        """
        ...

    def stop(self, name: str) -> None:
        """Stop it (SIGTERM, then SIGKILL after the spec's timeout) and stop supervising it."""
        ...

    def restart(self, name: str) -> DaemonStatus:
        """Stop and start it again (`before_start`/`after_start` run)."""
        ...

    def running(self, name: str) -> bool:
        """Whether a verified instance runs (adopting one from its pid record if needed)."""
        ...

    def signal(self, name: str, sig: int) -> bool:
        """Send `sig` to the verified running instance (a reload: HAProxy's SIGUSR2,
        keepalived's SIGHUP); False when none runs."""
        ...

    def status(self, name: str) -> DaemonStatus:
        """Pid, since, restarts, last exit and error."""
        ...
