"""FRR as trueup runs it: its daemons' argv, where their files live, and `vtysh` over their sockets.

Who uses this: the routing subsystem (`trueup.subsystems.routing`). Every
program (`vtysh`, `frr-reload.py`, a daemon's `-C` check) runs through the
`Runner` seam, so unit tests hand the subsystem a fake runner.

```python
paths = frr_paths(sources.daemons.run_dir("frr"))
frr = FrrControl(sources.runner, paths)
frr.check(paths.candidate)        # vtysh -C, then bgpd -C: FRR's own words, or []
frr.reload(paths.config)          # frr-reload.py --reload: only the differences
frr.running()                     # `show running-config`, normalised
frr.json("show bgp summary json")
```

Layout. The configuration and the sockets are shared by the daemons, in
`STATE_DIR/run/frr` (0700; files 0600); each daemon has its own run
directory for the supervisor's record and its log:

```
run/frr/frr.conf          the configuration trueup applied, secrets in place (FRR's integrated form)
run/frr/frr.conf.new      a candidate being checked (removed unless accepted)
run/frr/vtysh.conf        `service integrated-vtysh-config`, for vtysh and frr-reload.py
run/frr/empty.conf        what every daemon starts from (the configuration is pushed after)
run/frr/state.json        what trueup last applied (the subsystem's record)
run/frr/NAME.vty, zserv.api   the sockets (under /run/trueup/frr-… when the path is too long)
run/frr-NAME/NAME.pid     FRR's own pid file; frr-NAME.pid, frr-NAME.log: the supervisor's
```

Every daemon runs in the agent's network namespace, as root with the
`frrvty` group (FRR refuses to start when its user is not in its vty group),
with its own sockets and pid file: several routers on one machine never
share a path, and the packaged `/etc/frr` and `/var/run/frr` are never used.
zebra runs without `-r`, so the routes it installed leave with it; it never
removes a kernel route it did not install.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from trueup.model.jsontypes import JSONObject
from trueup.system.requirements import Requirement, binary, regular_file
from trueup.system.runner import Runner
from trueup.system.sockets import SUN_PATH_MAX, socket_dir

__all__ = [
    "ALL_DAEMONS",
    "REQUIREMENTS",
    "FrrControl",
    "FrrError",
    "FrrPaths",
    "Refusal",
    "answers",
    "daemon_name",
    "frr_paths",
    "normalise",
    "wait_answering",
]

ALL_DAEMONS = ("zebra", "bgpd", "ospfd", "ospf6d", "bfdd")
SBIN = Path("/usr/lib/frr")
RELOAD = SBIN / "frr-reload.py"
VTY_GROUP = "frrvty"
REQUIREMENTS: tuple[Requirement, ...] = (
    *(binary(str(SBIN / name), "frr", ("--version",)) for name in ALL_DAEMONS),
    binary("vtysh", "frr", ("--help",)),
    regular_file(RELOAD, "frr-pythontools", "applying a change without resetting sessions"),
)
_TIMEOUT = 60.0
# What `show running-config` says that is not configuration, or is the system's
# rather than the document's (the forwarding switches are sysctls; the host name is
# the machine's, shared by every namespace).
_NOT_CONFIG = re.compile(
    r"^(Building configuration\.\.\.|Current configuration:|frr version .*|end|!|exit|"
    r"hostname .*|service integrated-vtysh-config|(no )?ip(v6)? forwarding)$"
)
# What zebra reads to print `no ip forwarding` / `no ipv6 forwarding` (zebra/ipforward_proc.c).
_FORWARDING = (
    ("ip", "/proc/sys/net/ipv4/ip_forward"),
    ("ipv6", "/proc/sys/net/ipv6/conf/all/forwarding"),
)
_PASSWORD = re.compile(r"^( neighbor \S+ password )(.*)$")


@dataclass(frozen=True)
class Refusal:
    """One line FRR refused: its number (1-based; 0 unknown) in the file checked, FRR's words."""

    line: int
    words: str
    # Numbered in the bgpd part (`check`'s `bgp_part`), not the whole candidate.
    in_bgp_part: bool = False


class FrrError(RuntimeError):
    """vtysh, frr-reload.py or a daemon refused; names the command and FRR's own words."""


def daemon_name(daemon: str) -> str:
    """The supervisor's name for an FRR daemon (its run directory, its pid record)."""
    return f"frr-{daemon}"


@dataclass(frozen=True)
class FrrPaths:
    run_dir: Path
    sockets: Path

    @property
    def config(self) -> Path:
        return self.run_dir / "frr.conf"

    @property
    def candidate(self) -> Path:
        return self.run_dir / "frr.conf.new"

    @property
    def vtysh_conf(self) -> Path:
        return self.run_dir / "vtysh.conf"

    @property
    def empty(self) -> Path:
        return self.run_dir / "empty.conf"

    @property
    def state(self) -> Path:
        return self.run_dir / "state.json"

    def vty(self, daemon: str) -> Path:
        return self.sockets / f"{daemon}.vty"

    def argv(self, daemon: str, run_dir: Path) -> tuple[str, ...]:
        """How `daemon` is run: its sockets, its pid file, no vty port, no packaged file."""
        argv = [
            str(SBIN / daemon),
            "-u",
            "root",
            "-g",
            VTY_GROUP,
            "-f",
            str(self.empty),
            "-i",
            str(run_dir / f"{daemon}.pid"),
            "--vty_socket",
            str(self.sockets),
            "-z",
            str(self.sockets / "zserv.api"),
            "-P",
            "0",
        ]
        if daemon == "bfdd":
            argv += ["--bfdctl", str(self.sockets / "bfdd.sock")]
        return tuple(argv)

    def vtysh(self) -> list[str]:
        return ["vtysh", "--config_dir", str(self.run_dir), "--vty_socket", str(self.sockets)]


def frr_paths(run_dir: Path, *, create: bool = False) -> FrrPaths:
    """Where FRR's files are, given the shared run directory (`run/frr`)."""
    names = [f"{d}.vty" for d in ALL_DAEMONS] + ["zserv.api", "bfdd.sock"]
    sockets = socket_dir(run_dir, names, SUN_PATH_MAX, prefix="frr-", create=create)
    return FrrPaths(run_dir=run_dir, sockets=sockets)


def normalise(text: str, password_ref: Callable[[str, str], str] | None = None) -> list[str]:
    """The configuration lines of `show running-config`, without what is not configuration.

    A neighbour's password is never kept: `password_ref(address, value)` names
    it (`secret:NAME` when it is that secret's value), else its digest stands in.
    """
    out = []
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line.strip() or _NOT_CONFIG.match(line.strip()):
            continue
        match = _PASSWORD.match(line)
        if match is not None:
            address = line.split()[1]
            value = match.group(2)
            named = password_ref(address, value) if password_ref is not None else ""
            line = match.group(1) + (named or f"<sha256:{_digest(value)}>")
        out.append(line)
    return out


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:16]


def _refusals(output: str) -> list[str]:
    """FRR's own words from a check or a load: `% …` lines and `line N: …` errors."""
    out = []
    for raw in output.splitlines():
        line = raw.strip()
        if line.startswith("% Can't open configuration file"):
            continue
        if line.startswith("%") or line.startswith("line ") or "Config Failed" in line:
            out.append(line)
    return out


class FrrControl:
    """`vtysh` and `frr-reload.py` for one router's FRR, through the runner."""

    def __init__(self, runner: Runner, paths: FrrPaths, *, timeout: float = _TIMEOUT) -> None:
        self.runner = runner
        self.paths = paths
        self.timeout = timeout

    def vtysh(self, *commands: str) -> str:
        argv = self.paths.vtysh()
        for command in commands:
            argv += ["-c", command]
        done = self.runner.run(argv, timeout=self.timeout)
        if not done.ok:
            words = (done.stdout + done.stderr).strip() or f"exit status {done.returncode}"
            raise FrrError(f"vtysh -c {commands[0]!r}: {words}")
        return done.stdout

    def running(self, password_ref: Callable[[str, str], str] | None = None) -> list[str]:
        """The running configuration of every daemon that runs, normalised."""
        return normalise(self.vtysh("show running-config"), password_ref)

    def json(self, command: str) -> JSONObject:
        """A `show … json` answer; {} when it is not a JSON object."""
        try:
            data = json.loads(self.vtysh(command) or "{}")
        except ValueError:
            return {}
        return data if isinstance(data, dict) else {}

    def check(self, candidate: Path, bgp_part: Path | None = None) -> list[Refusal]:
        """FRR's own judgement of `candidate`: each refusal, with its line and FRR's words.

        `vtysh -C` parses the whole file with every daemon's grammar (line
        numbers of `candidate`); bgpd's `-C` (no listening, no zebra) then runs
        its part's commands, which catches values only bgpd can judge
        (communities), numbered in `bgp_part`'s lines.
        """
        done = self.runner.run(
            [*self.paths.vtysh()[:3], "-C", "-f", str(candidate)], timeout=self.timeout
        )
        refusals = [
            Refusal(_line_number(w), w.split(": ", 1)[-1] if w.startswith("line ") else w)
            for w in _refusals(done.stdout + done.stderr)
        ]
        if not done.ok and not refusals:
            words = (done.stdout + done.stderr).strip() or f"exit status {done.returncode}"
            refusals = [Refusal(0, words)]
        if refusals or bgp_part is None:
            return refusals
        done = self.runner.run(
            [str(SBIN / "bgpd"), "-C", "-S", "-p", "0", "-Z", "-f", str(bgp_part)],
            timeout=self.timeout,
        )
        said_by_bgpd = _refusals(done.stdout + done.stderr)
        said = [w for w in said_by_bgpd if w.startswith("%")]
        failed = [w for w in said_by_bgpd if "Config Failed on config line" in w]
        out: list[Refusal] = []
        for index, line in enumerate(failed):
            number = int(line.rsplit("config line ", 1)[1].split(":", 1)[0])
            words = said[index] if index < len(said) else line.split("] ", 1)[-1]
            out.append(Refusal(number, words, in_bgp_part=True))
        return out

    def reload(self, config: Path) -> None:
        """Apply `config` incrementally (frr-reload.py: only the lines that differ)."""
        argv = [
            "python3",
            str(RELOAD),
            "--reload",
            "--stdout",
            "--bindir",
            "/usr/bin",
            "--confdir",
            str(self.paths.run_dir),
            "--rundir",
            str(self.paths.run_dir),
            "--vty_socket",
            str(self.paths.sockets),
            str(config),
        ]
        done = self.runner.run(argv, timeout=self.timeout * 2)
        if not done.ok:
            said = [
                line.split(": ", 1)[-1]
                for line in (done.stdout + done.stderr).splitlines()
                if "ERROR" in line or "WARNING" in line or line.startswith("%")
            ]
            detail = "; ".join(said[-3:]) or f"exit status {done.returncode}"
            raise FrrError(f"frr-reload.py refused {config.name}: {detail}")

    def load(self, config: Path) -> None:
        """`vtysh -f`: every line of `config`, as a whole (the bench's baseline)."""
        done = self.runner.run([*self.paths.vtysh(), "-f", str(config)], timeout=self.timeout * 2)
        if not done.ok:
            raise FrrError(f"vtysh -f {config.name}: {(done.stdout + done.stderr).strip()}")

    @staticmethod
    def system_lines(read: Callable[[str], str | None]) -> list[str]:
        """The running lines zebra derives from the system, kept as they are by every
        reload (the document does not own them): `no ip forwarding` when the namespace's
        sysctl is 0, as zebra prints it, read from /proc (no `show running-config` for it)."""
        out = []
        for word, path in _FORWARDING:
            value = read(path)
            if value is not None and value.strip() == "0":
                out.append(f"no {word} forwarding")
        return out


def _line_number(words: str) -> int:
    match = re.match(r"^line (\d+):", words)
    return int(match.group(1)) if match else 0


def answers(path: Path) -> bool:
    """Whether a daemon accepts connections on its vty socket."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def wait_answering(paths: FrrPaths, daemons: Iterable[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for daemon in daemons:
        while not answers(paths.vty(daemon)):
            if time.monotonic() > deadline:
                raise FrrError(
                    f"{daemon} does not answer on {paths.vty(daemon)} after {timeout:g}s"
                )
            time.sleep(0.05)
