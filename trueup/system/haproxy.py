"""HAProxy as trueup runs it: its files, its configuration, its sockets.

Who uses this: the proxy subsystem (`trueup.subsystems.proxy`). `haproxy -c`
goes through the `Runner` seam; the stats and master sockets are read here
(`query`), and unit tests replace `query` and hand a `FakeRunner`.

```python
paths = haproxy_paths(sources.daemons.run_dir("haproxy"))
text, omitted = render_config(paths, proxies, present={"203.0.113.1"})
problem = check_config(sources.runner, candidate_path)   # None: valid
stats = parse_stat(query(paths.stats, "show stat"))      # frontends, servers
```

Layout, in the daemon's run directory `STATE_DIR/run/haproxy` (0700; files 0600):

```
haproxy.cfg          the configuration trueup checked and wrote (every reload reads it)
haproxy.cfg.new      a candidate being checked (`haproxy -c`); removed after
master.sock          the master CLI (`-S`): `show proc` tells reloads and workers
stats.sock           the workers' stats socket, `expose-fd listeners`: a new worker
                     takes the listening sockets from the old one on a reload
state.json           the section trueup last wrote, and the digest of that file
haproxy.pid/.log     the supervisor's pid record and the daemon's output
```

HAProxy runs in master-worker mode in the foreground (`-W -db`): the
supervisor's pid is the master's, which stays the same across reloads
(SIGUSR2 re-executes the master with the same argv; the new worker receives
the listeners from the old one through the stats socket, so no connection is
refused while it starts).
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from trueup.system.requirements import Requirement, binary
from trueup.system.runner import Completed, Runner
from trueup.system.sockets import HAPROXY_MAX, socket_dir

__all__ = [
    "DAEMON",
    "REQUIREMENTS",
    "HaproxyError",
    "HaproxyPaths",
    "MasterState",
    "ProxyConfig",
    "Stats",
    "check_argv",
    "check_config",
    "check_problem",
    "digest_text",
    "haproxy_paths",
    "parse_proc",
    "parse_stat",
    "query",
    "render_config",
]

DAEMON = "haproxy"
# What `trueup preflight` checks before an agent that runs proxies starts.
REQUIREMENTS: tuple[Requirement, ...] = (binary("haproxy", "haproxy", ("-v",)),)
SOCKETS = ("master.sock", "stats.sock")
_TIMEOUT = 5.0


class HaproxyError(RuntimeError):
    """HAProxy refused a configuration or did not answer; carries its words."""


@dataclass(frozen=True)
class HaproxyPaths:
    run_dir: Path
    config: Path
    candidate: Path
    master: Path
    stats: Path
    state: Path

    @property
    def argv(self) -> tuple[str, ...]:
        return ("haproxy", "-W", "-db", "-f", str(self.config), "-S", str(self.master))


def haproxy_paths(run_dir: Path, *, create: bool = False) -> HaproxyPaths:
    """Where HAProxy's files are, given the daemon's run directory.

    Its sockets stay in the run directory while their paths are within
    HAProxy's own limit (97 characters, below the kernel's 107); otherwise they
    are in `/run/trueup/haproxy-DIGEST` (`trueup.system.sockets`), made by a
    start (`create`, or `make_socket_dir`) and removed when HAProxy is stopped.
    """
    sockets = socket_dir(run_dir, SOCKETS, HAPROXY_MAX, prefix="haproxy-", create=create)
    return HaproxyPaths(
        run_dir=run_dir,
        config=run_dir / "haproxy.cfg",
        candidate=run_dir / "haproxy.cfg.new",
        master=sockets / "master.sock",
        stats=sockets / "stats.sock",
        state=run_dir / "state.json",
    )


class TlsConfig(TypedDict):
    certificate: str


class ServerConfig(TypedDict):
    name: str
    address: str
    check: bool
    weight: int


class HealthCheckConfig(TypedDict):
    path: str | None
    interval: str


class BackendConfig(TypedDict):
    balance: str
    servers: list[ServerConfig]
    health_check: HealthCheckConfig | None


class TimeoutsConfig(TypedDict):
    connect: str
    client: str
    server: str


class ProxyConfig(TypedDict):
    """One frontend and its backend as the configuration is rendered from it: a
    `spec.proxies` entry as canonical JSON (`ProxySection.canonical()`, defaults filled in)."""

    name: str
    bind: str
    mode: str
    tls: TlsConfig | None
    backend: BackendConfig
    timeouts: TimeoutsConfig


def digest_text(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _bind_line(proxy: ProxyConfig) -> str:
    line = f"    bind {proxy['bind']}"
    tls = proxy.get("tls")
    if tls:
        line += f" ssl crt {tls['certificate']}"
    return line


def render_config(
    paths: HaproxyPaths, proxies: Iterable[ProxyConfig], present: set[str] | None
) -> tuple[str, list[str]]:
    """HAProxy's configuration for `proxies` (canonical section entries).

    A frontend whose bind address is not in `present` (None: all present) is
    left out, so that the others can be served; its name is returned in the
    second value. Each frontend has a backend of the same name.
    """
    lines = [
        "# written by trueup: edits are detected and replaced",
        "global",
        f"    stats socket {paths.stats} mode 600 level admin expose-fd listeners",
        "    stats timeout 30s",
        "    hard-stop-after 30s",
        "defaults",
        "    log global",
        "    option dontlognull",
        "",
    ]
    omitted: list[str] = []
    for proxy in proxies:
        name, mode = proxy["name"], proxy["mode"]
        host = proxy["bind"].rsplit(":", 1)[0].strip("[]")
        if present is not None and host != "*" and host not in present:
            omitted.append(name)
            continue
        timeouts = proxy["timeouts"]
        backend = proxy["backend"]
        check: HealthCheckConfig | dict[str, str] = backend.get("health_check") or {}
        lines += [
            f"frontend {name}",
            f"    mode {mode}",
            _bind_line(proxy),
            f"    timeout client {timeouts['client']}",
            f"    default_backend {name}",
            "",
            f"backend {name}",
            f"    mode {mode}",
            f"    balance {backend['balance']}",
            f"    timeout connect {timeouts['connect']}",
            f"    timeout server {timeouts['server']}",
        ]
        if check.get("path") and mode == "http":
            lines.append(f"    option httpchk GET {check['path']}")
        lines.append(f"    default-server inter {check.get('interval', '2s')}")
        for server in backend["servers"]:
            words = [f"    server {server['name']} {server['address']}"]
            words.append(f"weight {server['weight']}")
            if server["check"]:
                words.append("check")
            lines.append(" ".join(words))
        lines.append("")
    return "\n".join(lines) + "\n", omitted


def check_argv(path: Path) -> list[str]:
    """HAProxy's own check of the configuration file `path`."""
    return ["haproxy", "-c", "-f", str(path)]


def check_config(runner: Runner, path: Path) -> str | None:
    """`haproxy -c -f PATH`: None when valid, else HAProxy's own words (its alerts)."""
    return check_problem(runner.run(check_argv(path), timeout=30.0))


def check_problem(done: Completed) -> str | None:
    """What `haproxy -c` said: None when it accepted the file, else its alerts."""
    if done.ok:
        return None
    text = (done.stderr + done.stdout).strip()
    alerts = [line.split(" : ", 1)[-1] for line in text.splitlines() if "ALERT" in line]
    return "; ".join(alerts[:3]) or text or f"haproxy -c exited with {done.returncode}"


def query(path: Path, command: str, timeout: float = _TIMEOUT) -> str:
    """One command on a HAProxy CLI socket (stats or master); its whole answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(str(path))
            # The master CLI keeps a connection open after a command: `quit` ends it.
            sock.sendall(command.encode() + b"; quit\n")
            chunks = []
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
        except OSError as exc:
            raise HaproxyError(f"{path}: {command}: {exc}") from exc
    return b"".join(chunks).decode(errors="replace")


@dataclass(frozen=True)
class Stats:
    """`show stat`, reduced: frontend → status (OPEN/STOP…), backend → server → status."""

    frontends: dict[str, str] = field(default_factory=dict)
    servers: dict[str, dict[str, str]] = field(default_factory=dict)


def parse_stat(text: str) -> Stats:
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines or not lines[0].startswith("# "):
        raise HaproxyError(f"unexpected show stat answer: {text[:200]!r}")
    header = lines[0][2:].split(",")
    column = {name: index for index, name in enumerate(header)}
    frontends: dict[str, str] = {}
    servers: dict[str, dict[str, str]] = {}
    for line in lines[1:]:
        cells = line.split(",")
        proxy, row, status = (
            cells[column["pxname"]],
            cells[column["svname"]],
            cells[column["status"]],
        )
        if row == "FRONTEND":
            frontends[proxy] = status
        elif row != "BACKEND":
            servers.setdefault(proxy, {})[row] = status
    return Stats(frontends, servers)


@dataclass(frozen=True)
class MasterState:
    """`show proc` on the master CLI: its reload count and the current workers' pids."""

    reloads: int
    failed: int
    workers: tuple[int, ...]
    version: str


_MASTER = re.compile(r"^(\d+)\s+master\s+(\d+)\s+\[failed:\s*(\d+)\]\s+\S+\s+(\S+)")
_WORKER = re.compile(r"^(\d+)\s+worker\s+(\d+)\s")


def parse_proc(text: str) -> MasterState:
    reloads = failed = -1
    version = ""
    workers: list[int] = []
    for line in text.splitlines():
        master = _MASTER.match(line)
        if master:
            reloads, failed, version = int(master[2]), int(master[3]), master[4]
            continue
        worker = _WORKER.match(line)
        if worker and worker[2] == "0":
            workers.append(int(worker[1]))  # reloads 0: started by the last (re)load
    if reloads < 0:
        raise HaproxyError(f"unexpected show proc answer: {text[:200]!r}")
    return MasterState(reloads, failed, tuple(workers), version)


def remove_quietly(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
