"""Kea as trueup runs it: where its files live, and its control socket.

Who uses this: the DHCP subsystem (which runs Kea), `trueup dhcp leases`,
and any subsystem that reads leases (DNS) — without importing the DHCP
subsystem:

```python
paths = kea_paths(sources.daemons.run_dir("kea-dhcp4"), 4)
source, leases = read_leases(4, socket_path=paths.socket, lease_file=paths.leases)
```

Layout, per family, in the daemon's run directory `STATE_DIR/run/kea-dhcpN`
(0700, so the control socket is root-only whatever mode Kea gives it):

```
kea-dhcp4.conf         the configuration trueup compiled (and Kea's config-write rewrites)
kea4.sock              the control socket
kea-leases4.csv        the memfile lease file (Kea's: trueup only ever reads it)
kea-dhcp4.pid          the supervisor's pid record
kea-dhcp4.kea-dhcp4.pid  Kea's own pid file (removed before a start when it names no live Kea of ours)
allocator.json         whether trueup disabled allocation for this Kea process (the fence)
kea-dhcp6-serverid     DHCPv6 only: the server's DUID (Kea's data-directory is the run directory)
```
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trueup.model.jsontypes import JSONObject
from trueup.system.kealeases import KeaSocketError, kea_command
from trueup.system.processes import clear_stale_pidfile as clear_pidfile
from trueup.system.requirements import Requirement, binary, library
from trueup.system.sockets import SUN_PATH_MAX, socket_dir

__all__ = [
    "HA_HOOK",
    "HOOKS_DIR",
    "LEASE_CMDS_HOOK",
    "KeaError",
    "KeaPaths",
    "answers",
    "clear_stale_pidfile",
    "daemon_name",
    "kea_call",
    "kea_paths",
    "make_socket_dir",
    "requirements",
]

HOOKS_DIR = Path("/usr/lib/x86_64-linux-gnu/kea/hooks")
# Loaded by every configuration trueup compiles (lease inspection over the socket) …
LEASE_CMDS_HOOK = HOOKS_DIR / "libdhcp_lease_cmds.so"
# … and by one whose document has `ha:`.
HA_HOOK = HOOKS_DIR / "libdhcp_ha.so"


class KeaError(RuntimeError):
    """Kea refused a command (result ≠ 0) or did not answer; names the command."""


def daemon_name(family: int) -> str:
    return f"kea-dhcp{family}"


@dataclass(frozen=True)
class KeaPaths:
    family: int
    run_dir: Path
    config: Path
    socket: Path
    leases: Path
    allocator: Path

    @property
    def binary(self) -> str:
        return f"kea-dhcp{self.family}"

    @property
    def argv(self) -> tuple[str, ...]:
        return (self.binary, "-c", str(self.config))

    @property
    def pidfile(self) -> Path:
        """Kea's own pid file: CONFIG-STEM.PROCESS.pid in KEA_PIDFILE_DIR."""
        return self.run_dir / f"{self.config.stem}.{self.binary}.pid"

    @property
    def env(self) -> tuple[tuple[str, str], ...]:
        # Kea's own pid file and lock files go beside ours, not in /run/kea.
        return (("KEA_PIDFILE_DIR", str(self.run_dir)), ("KEA_LOCKFILE_DIR", str(self.run_dir)))


def requirements(family: int, *, ha: bool) -> list[Requirement]:
    """What Kea for `family` needs on the machine: its binary (run with `-v`) and the hook
    libraries the compiled configuration loads (a missing one is HOOKS_OPEN_ERROR at start)."""
    needs = [
        binary(daemon_name(family), f"kea-dhcp{family}-server", ("-v",)),
        library(LEASE_CMDS_HOOK, "kea-common", why="lease inspection (lease_cmds hook)"),
    ]
    if ha:
        needs.append(library(HA_HOOK, "kea-common", why=f"spec.dhcp.ha (DHCPv{family} HA hook)"))
    return needs


def kea_paths(run_dir: Path, family: int) -> KeaPaths:
    """Where Kea's files are for `family`, given the daemon's run directory."""
    # Kea takes a socket path up to the kernel's 107 bytes; a longer one moves to
    # /run/trueup/DIGEST (made before a start: `make_socket_dir`).
    name = f"kea{family}.sock"
    socket = socket_dir(run_dir, (name,), SUN_PATH_MAX, prefix="", create=False) / name
    return KeaPaths(
        family=family,
        run_dir=run_dir,
        config=run_dir / f"kea-dhcp{family}.conf",
        socket=socket,
        leases=run_dir / f"kea-leases{family}.csv",
        allocator=run_dir / "allocator.json",
    )


def make_socket_dir(paths: KeaPaths) -> None:
    """Create the socket's directory, root only, when it is not the run directory (before a start)."""
    socket_dir(paths.run_dir, (paths.socket.name,), SUN_PATH_MAX, prefix="")


def clear_stale_pidfile(paths: KeaPaths, proc: Path = Path("/proc")) -> str | None:
    """Before a start: remove Kea's own pid file when it names no live Kea of ours
    (`processes.clear_stale_pidfile`: a zombie, a reused pid or garbage)."""
    return clear_pidfile(paths.pidfile, paths.argv, "Kea", proc)


def answers(paths: KeaPaths) -> bool:
    """Whether Kea answers `status-get` on its control socket (the supervisor's readiness probe)."""
    try:
        kea_call(paths, "status-get", timeout=2.0)
    except KeaError:
        return False
    return True


def kea_call(
    paths: KeaPaths, command: str, arguments: JSONObject | None = None, timeout: float = 10.0
) -> JSONObject:
    """Run one command; its `arguments` on success. Raises KeaError naming the command."""
    try:
        answer = kea_command(paths.socket, command, arguments, timeout=timeout)
    except KeaSocketError as exc:
        raise KeaError(f"kea-dhcp{paths.family}: {command}: no answer ({exc})") from exc
    if answer.get("result") != 0:
        raise KeaError(f"kea-dhcp{paths.family}: {command}: {answer.get('text', answer)}")
    arguments_out = answer.get("arguments")
    return arguments_out if isinstance(arguments_out, dict) else {}
