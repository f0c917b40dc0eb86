"""keepalived (VRRP) as the agent runs it: its files, its argv, its configuration.

Who uses this: the HA subsystem (`trueup.subsystems.ha`), which compiles
`spec.ha` into the configuration rendered here and runs keepalived under the
daemon supervisor (`trueup.system.daemon`) in the agent's network namespace.

Everything lives in the daemon's run directory (`STATE_DIR/run/keepalived`,
0700): the configuration and keepalived's own pid files (parent and VRRP
child — named apart from the supervisor's `keepalived.pid` record). The VRRP
state is read from the kernel (whether this node holds the addresses), not
from a notify script: keepalived refuses to run scripts from a directory a
non-root user could write to unless script security is off, and a state file
written by a script would go stale when keepalived is killed anyway. Two agents in two namespaces on
one machine have two state directories, so nothing is shared: no file under
`/run/keepalived`, no syslog (`-G`; the log is the supervisor's log file).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

from trueup.system.atomicfile import write_atomic
from trueup.system.requirements import Requirement, binary
from trueup.system.safefile import UnsafeFile, ensure_dir, read_file

__all__ = [
    "DAEMON",
    "REQUIREMENTS",
    "Instance",
    "KeepalivedPaths",
    "configured_priority",
    "instances_for",
    "keepalived_paths",
    "read_config",
    "render_config",
    "vrrp_running",
    "write_config",
]

DAEMON = "keepalived"
BINARY = "keepalived"
# What `trueup preflight` checks before an agent that holds virtual addresses starts.
REQUIREMENTS: tuple[Requirement, ...] = (binary(BINARY, "keepalived", ("-v",)),)

# Gratuitous ARP / unsolicited NA on becoming master: a burst at once, and a second
# burst one second later (switches that dropped the first, a peer whose ARP cache
# raced the transition).
GARP_MASTER_DELAY = 1
GARP_MASTER_REPEAT = 3


@dataclass(frozen=True)
class KeepalivedPaths:
    run_dir: Path

    @property
    def config(self) -> Path:
        return self.run_dir / "keepalived.conf"

    @property
    def record(self) -> Path:
        """trueup's own record: the released virtual addresses, the applied settings."""
        return self.run_dir / "trueup-ha.json"

    @property
    def log(self) -> Path:
        return self.run_dir / f"{DAEMON}.log"

    def pid_file(self, which: str) -> Path:
        return self.run_dir / f"keepalived-{which}.pid"

    @property
    def argv(self) -> tuple[str, ...]:
        """Foreground, VRRP only, console log (the supervisor's log file), own pid files."""
        return (
            BINARY,
            "--dont-fork",
            "--log-console",
            "--log-detail",
            "--no-syslog",
            "--vrrp",
            f"--use-file={self.config}",
            f"--pid={self.pid_file('main')}",
            f"--vrrp_pid={self.pid_file('vrrp')}",
            f"--checkers_pid={self.pid_file('checkers')}",
            f"--bfd_pid={self.pid_file('bfd')}",
        )

    def clear_stale_pid_files(self) -> list[str]:
        """Remove pid files that name no keepalived running this configuration.

        They outlive a crash or a reboot (the run directory persists), and
        keepalived refuses to start ("daemon is already running") while one
        names a live pid — after a reboot often some other process's. Returns
        the files removed.
        """
        removed = []
        mine = f"--use-file={self.config}".encode()
        for which in ("main", "vrrp", "checkers", "bfd"):
            path = self.pid_file(which)
            try:
                pid = int(path.read_text().strip() or "0")
            except (OSError, ValueError):
                pid = 0
                if not path.exists():
                    continue
            try:
                ours = mine in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                ours = False
            if pid <= 1 or not ours:
                path.unlink(missing_ok=True)
                removed.append(path.name)
        return removed

    def test_argv(self, config: Path | None = None) -> list[str]:
        return [BINARY, "--config-test", f"--use-file={config or self.config}"]


def keepalived_paths(run_dir: Path) -> KeepalivedPaths:
    return KeepalivedPaths(Path(run_dir))


@dataclass(frozen=True)
class Instance:
    """One VRRP instance: one interface, one VRID, one address family."""

    name: str
    interface: str
    vrid: int
    family: int
    addresses: tuple[str, ...]
    peers: tuple[str, ...]


def instance_name(interface: str, vrid: int, family: int) -> str:
    return f"trueup_{interface}_{vrid}_v{family}"


def _advert(seconds: float) -> str:
    text = f"{seconds:.2f}".rstrip("0").rstrip(".")
    return text or "1"


def render_config(
    *,
    router_id: str,
    instances: list[Instance],
    priority: int,
    advert_interval: float,
    preempt: bool,
    initial_master: bool,
) -> str:
    """keepalived.conf for `instances` (deterministic: the same input, the same text)."""
    lines = [
        "# Written by trueup from spec.ha; edits are drift and are replaced.",
        "global_defs {",
        f"  router_id {router_id}",
        f"  vrrp_garp_master_delay {GARP_MASTER_DELAY}",
        f"  vrrp_garp_master_repeat {GARP_MASTER_REPEAT}",
        "  vrrp_version 3",
        "}",
    ]
    state = "MASTER" if initial_master and preempt else "BACKUP"
    for inst in instances:
        lines += [
            f"vrrp_instance {inst.name} {{",
            f"  state {state}",
            f"  interface {inst.interface}",
            f"  virtual_router_id {inst.vrid}",
            f"  priority {priority}",
            f"  advert_int {_advert(advert_interval)}",
        ]
        if not preempt:
            lines.append("  nopreempt")
        if inst.peers:
            lines.append("  unicast_peer {")
            lines += [f"    {p}" for p in inst.peers]
            lines.append("  }")
        lines.append("  virtual_ipaddress {")
        lines += [f"    {a} dev {inst.interface}" for a in inst.addresses]
        lines.append("  }")
        lines.append("}")
    return "\n".join(lines) + "\n"


def instances_for(vips: list[tuple[str, int, list[str]]], peers: list[str]) -> list[Instance]:
    """`(interface, vrid, addresses)` entries split by address family (one VRRP instance each)."""
    out: list[Instance] = []
    for interface, vrid, addresses in vips:
        for family in (4, 6):
            mine = tuple(a for a in addresses if ipaddress.ip_interface(a).version == family)
            if not mine:
                continue
            fam_peers = tuple(p for p in peers if ipaddress.ip_address(p).version == family)
            out.append(
                Instance(
                    instance_name(interface, vrid, family),
                    interface,
                    vrid,
                    family,
                    mine,
                    fam_peers,
                )
            )
    return out


def write_config(paths: KeepalivedPaths, config: str) -> None:
    """The configuration (0600 in the 0700 run directory)."""
    ensure_dir(paths.run_dir)
    write_atomic(paths.config, config.encode(), 0o600)


def vrrp_running(paths: KeepalivedPaths, parent: int) -> bool:
    """Whether keepalived `parent` runs its VRRP child: the pid file names a live child of it.

    The supervisor's readiness probe: a keepalived that exits at once (a
    configuration it accepts in `--config-test` but not at start, another
    instance's pid files) never gets there.
    """
    try:
        child = int(paths.pid_file("vrrp").read_text().split()[0])
        stat = Path(f"/proc/{child}/stat").read_text()
    except (OSError, ValueError, IndexError):
        return False
    fields = stat[stat.rfind(")") + 2 :].split()
    return len(fields) > 1 and fields[0] not in ("Z", "X") and fields[1] == str(parent)


def read_config(paths: KeepalivedPaths) -> str | None:
    try:
        return read_file(paths.config).decode("utf-8", errors="replace")
    except (FileNotFoundError, UnsafeFile):  # the write names what is there
        return None


def configured_priority(config: str | None) -> int | None:
    """The priority a configuration gives its instances (trueup gives them all one)."""
    for line in (config or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "priority" and parts[1].isdigit():
            return int(parts[1])
    return None
