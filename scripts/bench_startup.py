"""Startup: how fast management answers, seen from the agent's socket and from another host.

1. Process start → /v1/health/management = 200 on the unix socket while every
   other subsystem fails or hangs. Deadlines at 5 s and at 90 s: management
   readiness must not depend on them. Baseline in the same run: the
   interpreter importing the agent.
2. Process start → the first 200 on `http://198.51.100.2:7443/v1/health/management`
   from a client in a second namespace over a veth, with no static neighbour
   entry (the client's ARP is part of it): 20 cold starts (the management
   address flushed and the link down before each, the client's neighbour
   table flushed, the client polling from before the process starts), against
   a bare Python listener doing the same job (link up and address added over
   raw netlink, one gratuitous ARP, bind, answer 200) measured in the same
   run, and against the full agent with the fast path bypassed. Then the
   import profile of both paths (`python -X importtime`).

Bytecode: the measured processes use trueup's compiled bytecode, as an
installed agent does (`python -m compileall trueup` first; with
PYTHONDONTWRITEBYTECODE set nothing would otherwise ever be cached).

`python -m scripts.bench_startup [--quick] [--client-only]` prints the
section(s) without touching docs/benchmarks.md.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import yaml

from scripts.benchlib import PYTHON, REPO, env, median, namespace, percentile, sh

PLUGINS = ["--plugin", "tests.plugins:ResolverProbe", "--plugin", "tests.plugins:FailingService"]


def _document(deadline: float) -> dict:
    return {
        "apiVersion": "trueup/v1",
        "kind": "DeviceState",
        "metadata": {"device": "bench"},
        "spec": {
            "management": {"interface": "mgmt0", "addresses": ["198.51.100.2/24"]},
            "interfaces": [{"name": "lan9", "addresses": ["203.0.113.1/24"]}],  # absent link
            "convergence": {"deadlines": {"default": deadline}},
        },
    }


def _time_to_ready(ns: str, config: Path, state: Path) -> float:
    sock = state / "agent.sock"
    start = time.perf_counter()
    proc = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            ns,
            PYTHON,
            "-m",
            "trueup.cli",
            "agent",
            "run",
            "--config",
            str(config),
            "--state-dir",
            str(state),
            *PLUGINS,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env(),
    )
    try:
        while True:
            if sock.exists():
                try:
                    with httpx.Client(
                        transport=httpx.HTTPTransport(uds=str(sock)),
                        base_url="http://agent",
                        timeout=1,
                    ) as client:
                        if client.get("/v1/health/management").status_code == 200:
                            return time.perf_counter() - start
                except httpx.TransportError:
                    pass
            if proc.poll() is not None:
                raise RuntimeError("agent exited before management was ready")
            if time.perf_counter() - start > 30:
                raise RuntimeError("management not ready within 30 s")
            time.sleep(0.002)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run(quick: bool) -> str:
    return run_socket(quick) + "\n" + run_client(quick)


def run_socket(quick: bool) -> str:
    trials = 5 if quick else 15
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        base: list[float] = []
        with namespace("base", ("mgmt0",)) as ns:
            for _ in range(trials):
                t = time.perf_counter()
                sh("ip", "netns", "exec", ns, PYTHON, "-c", "import trueup.agent.process")
                base.append(time.perf_counter() - t)
        for deadline in (5.0, 90.0):
            samples = []
            for n in range(trials):
                with namespace(f"s{int(deadline)}-{n}", ("mgmt0",)) as ns:
                    etc = Path("/etc/netns") / ns
                    etc.mkdir(parents=True, exist_ok=True)
                    (etc / "resolv.conf").write_text(
                        "nameserver 127.0.0.53\noptions timeout:30 attempts:3\n"
                    )
                    silent = subprocess.Popen(
                        [
                            "ip",
                            "netns",
                            "exec",
                            ns,
                            sys.executable,
                            "-c",
                            "import socket\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
                            "s.bind(('127.0.0.53',53))\nwhile True: s.recvfrom(512)\n",
                        ]
                    )
                    try:
                        config = Path(tmp) / f"d{int(deadline)}-{n}.yaml"
                        config.write_text(yaml.safe_dump(_document(deadline)))
                        samples.append(_time_to_ready(ns, config, Path(tmp) / f"s{deadline}{n}"))
                    finally:
                        silent.kill()
                        silent.wait()
                        (etc / "resolv.conf").unlink()
                        etc.rmdir()
            rows.append((deadline, median(samples), percentile(samples, 99), max(samples)))
    base_m = median(base)
    lines = [
        "## Startup: process start → management ready, everything else failing or hanging "
        "(management first)",
        "",
        f"`make bench` — {trials} cold starts per deadline, each in a fresh namespace; the other "
        "subsystems: a missing link (`lan9`), a resolver that never answers (preparation "
        "hangs), a service that fails to start.",
        "",
        "| subsystem deadline | median s | p99 s | max s | ratio to import baseline | goal |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for deadline, med, p99, worst in rows:
        lines.append(
            f"| {deadline:g} s | {med:.3f} | {p99:.3f} | {worst:.3f} | "
            f"{med / base_m:.2f} | < 1 s {'✅' if p99 < 1 else '❌'} |"
        )
    lines += [
        "",
        f"Baseline (same run): `python -c 'import trueup.agent.process'` median {base_m:.3f} s. "
        "Readiness is the same at both deadlines because no subsystem work precedes phase 1.",
        "",
    ]
    return "\n".join(lines)


# -- from the client namespace ------------------------------------------------------
MGMT, CLIENT_ADDRESS, PORT = "198.51.100.2", "198.51.100.1", 7443
COLD_STARTS = 20

# Polls from the client namespace: a line on stdin starts a round, which ends
# with the CLOCK_MONOTONIC time (shared by all namespaces) of the first 200.
POLLER = r"""
import socket, sys, time
host, port = sys.argv[1], int(sys.argv[2])
request = b"GET /v1/health/management HTTP/1.1\r\nhost: r\r\nconnection: close\r\n\r\n"
for _ in sys.stdin:
    deadline, done = time.monotonic() + 30, -1.0
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.25) as conn:
                conn.sendall(request)
                data = b""
                while b"\r\n" not in data:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                if data.startswith(b"HTTP/1.1 200"):
                    done = time.monotonic()
                    break
        except OSError:
            pass
        time.sleep(0.002)
    print(done, flush=True)
"""

# The floor: what any agent must do before it can answer, in a bare interpreter.
BARE = r"""
import fcntl, socket, struct
IF, ADDR, PLEN, PORT = "mgmt0", "198.51.100.2", 24, 7443
index = socket.if_nametoindex(IF)
nl = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
nl.bind((0, 0))
def request(kind, flags, body):
    nl.send(struct.pack("=IHHII", 16 + len(body), kind, flags | 5, 1, 0) + body)
    nl.recv(65536)
def attr(kind, data):
    return struct.pack("=HH", 4 + len(data), kind) + data
request(16, 0, struct.pack("=BxHiII", 0, 0, index, 1, 1))  # RTM_NEWLINK: up
ip = socket.inet_aton(ADDR)
bcast = struct.pack("!I", struct.unpack("!I", ip)[0] | (1 << (32 - PLEN)) - 1)
body = struct.pack("=BBBBI", 2, PLEN, 0, 0, index) + attr(2, ip) + attr(1, ip) + attr(4, bcast)
request(20, 0x600, body)  # RTM_NEWADDR, create | exclusive
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind((ADDR, PORT))
server.listen(128)
mac = fcntl.ioctl(server.fileno(), 0x8927, struct.pack("256s", IF.encode()))[18:24]
arp = struct.pack("!HHBBH", 1, 0x0800, 6, 4, 1) + mac + ip + b"\0" * 6 + ip
with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as raw:
    raw.bind((IF, 0x0806))
    raw.send(b"\xff" * 6 + mac + b"\x08\x06" + arp)
answer = b'{"ready": true}'
response = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(answer)
while True:
    conn, _ = server.accept()
    conn.recv(65536)
    conn.sendall(response + answer)
    conn.close()
"""


@contextlib.contextmanager
def _router_and_client() -> Iterator[tuple[str, str]]:
    """A router namespace (mgmt0) and a client namespace (its peer, 198.51.100.1/24)."""
    router, client = f"tu-bench-{os.getpid()}-fb-r", f"tu-bench-{os.getpid()}-fb-c"
    try:
        for name in (router, client):
            sh("ip", "netns", "add", name)
            sh("ip", "-n", name, "link", "set", "lo", "up")
        sh("ip", "-n", router, "link", "add", "mgmt0", "type", "veth", "peer", "name", "mgmt0p")
        sh("ip", "-n", router, "link", "set", "mgmt0p", "netns", client)
        sh("ip", "-n", client, "addr", "add", f"{CLIENT_ADDRESS}/24", "dev", "mgmt0p")
        sh("ip", "-n", client, "link", "set", "mgmt0p", "up")
        yield router, client
    finally:
        for name in (router, client):
            sh("ip", "netns", "del", name, check=False)


class _Poller:
    def __init__(self, client: str) -> None:
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", client, PYTHON, "-c", POLLER, MGMT, str(PORT)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def start(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def first_200(self) -> float:
        assert self.proc.stdout is not None
        return float(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL by PID (`ip netns exec` execs the program, so this is the program)."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGKILL)
    proc.wait()


def _cold_start(router: str, client: str, poller: _Poller, argv: list[str], log: Path) -> float:
    """Seconds from process start to the client's first 200."""
    sh("ip", "-n", router, "addr", "flush", "dev", "mgmt0")
    sh("ip", "-n", router, "link", "set", "mgmt0", "down")
    sh("ip", "-n", client, "neigh", "flush", "dev", "mgmt0p")
    poller.start()  # the client asks before the address exists, as a monitor would
    with open(log, "wb") as output:
        started = time.monotonic()
        proc = subprocess.Popen(
            ["ip", "netns", "exec", router, *argv],
            stdout=output,
            stderr=subprocess.STDOUT,
            env=env(),
        )
        try:
            answered = poller.first_200()
        finally:
            _stop(proc)
    if answered < 0:
        raise RuntimeError(
            f"{' '.join(argv[:4])}…: no 200 from the client within 30 s:\n{log.read_text()}"
        )
    return answered - started


def _import_profile(module: str) -> tuple[float, list[tuple[str, float]]]:
    """(total ms, [(top-level package, ms of its own import time)]) for `import module`."""
    proc = subprocess.run(
        [PYTHON, "-X", "importtime", "-c", f"import {module}"],
        capture_output=True,
        text=True,
        env=env(),
        check=True,
    )
    by_package: dict[str, float] = {}
    total = 0.0
    lines = proc.stderr.splitlines()
    # What `site` imported at interpreter start is not the module's: count what follows it.
    starts = [i for i, line in enumerate(lines) if line.endswith("| site")]
    for line in lines[starts[-1] + 1 if starts else 0 :]:
        match = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|\s*(\S+)", line)
        if match is None:
            continue
        own, cumulative, name = int(match[1]), int(match[2]), match[3]
        by_package[name.split(".")[0]] = by_package.get(name.split(".")[0], 0.0) + own / 1000
        if name == module:
            total = cumulative / 1000
    return total, sorted(by_package.items(), key=lambda kv: -kv[1])


def run_client(quick: bool) -> str:
    trials = 5 if quick else COLD_STARTS
    load_before = os.getloadavg()[0]
    # An installed agent runs from compiled bytecode; compile it once here.
    sh(PYTHON, "-m", "compileall", "-q", str(REPO / "trueup"))
    with tempfile.TemporaryDirectory() as tmp, _router_and_client() as (router, client):
        state = Path(tmp) / "state"
        document = Path(tmp) / "desired.yaml"
        document.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "trueup/v1",
                    "kind": "DeviceState",
                    "metadata": {"device": "bench"},
                    "spec": {
                        "management": {
                            "interface": "mgmt0",
                            "addresses": [f"{MGMT}/24"],
                            "gateway": CLIENT_ADDRESS,
                            "api": {"port": PORT},
                        }
                    },
                }
            )
        )
        apply = ["ip", "netns", "exec", router, PYTHON, "-m", "trueup.cli", "apply"]
        applied = subprocess.run(
            [*apply, str(document), "--init", "--state-dir", str(state)],
            capture_output=True,
            text=True,
            env=env(),
            check=False,
        )
        if applied.returncode != 0:
            raise RuntimeError(f"trueup apply: {applied.stderr}")
        agent = [PYTHON, "-m", "trueup.cli", "agent", "run", "--state-dir", str(state)]
        # The typer command directly: the same agent without the fast path.
        full = [PYTHON, "-c", "from trueup.cli.main import main; main()", *agent[3:]]
        poller = _Poller(client)
        try:
            rows: dict[str, list[float]] = {"bare": [], "fast": [], "full": []}
            # Interleaved, so a burst of load on the machine hits every row alike;
            # the bypassed fast path (the old figure) only every fourth round.
            commands = {"bare": [PYTHON, "-c", BARE], "fast": agent, "full": full}
            for n in range(trials):
                for name in ("bare", "fast", "full") if n % 4 == 0 else ("bare", "fast"):
                    log = Path(tmp) / f"{name}-{n}.log"
                    rows[name].append(_cold_start(router, client, poller, commands[name], log))
        finally:
            poller.close()
    load_after = os.getloadavg()[0]
    fast_total, fast_profile = _import_profile("trueup.agent.fastboot")
    full_total, full_profile = _import_profile("trueup.agent.launch")
    bare_m = median(rows["bare"])
    lines = [
        "## Startup from another host: process start → 200 on the management address",
        "",
        f"`make bench` — {trials} cold starts each, interleaved: before each, the management "
        "address flushed and `mgmt0` down, the client's neighbour table flushed; a client in a "
        "second namespace (over a veth, no static neighbour entry: its ARP is part of the "
        "figure) polls `GET /v1/health/management` from before the process starts. The "
        "agent's state directory holds a committed revision (`management.json`). Load average "
        f"{load_before:.1f} → {load_after:.1f} on {os.cpu_count()} cores during the run.",
        "",
        "| process | median s | p99 s | max s | ratio to bare listener | goal |",
        "|---|---:|---:|---:|---:|---|",
    ]
    labels = {
        "bare": "bare Python listener (link up + address over raw netlink, 1 gratuitous ARP, "
        "bind, answer 200)",
        "fast": "`trueup agent run` (fast path: `management.json`, raw netlink, early listener)",
        "full": f"`trueup agent run` with the fast path bypassed ({len(rows['full'])} starts)",
    }
    for name in ("bare", "fast", "full"):
        samples = rows[name]
        med = median(samples)
        goal = "baseline"
        if name == "fast":
            goal = f"< 0.300 s median {'✅' if med < 0.3 else '❌'}"
        elif name == "full":
            goal = "—"
        lines.append(
            f"| {labels[name]} | {med:.3f} | {percentile(samples, 99):.3f} | "
            f"{max(samples):.3f} | {med / bare_m:.2f} | {goal} |"
        )

    def top(profile: list[tuple[str, float]]) -> str:
        return ", ".join(f"{name} {ms:.0f}" for name, ms in profile[:8])

    lines += [
        "",
        "Import profile (`python -X importtime -c 'import MODULE'`, after the interpreter's "
        "own start-up; own time summed per top-level package, ms):",
        "",
        "| path | import total ms | heaviest packages (ms) |",
        "|---|---:|---|",
        f"| fast path (`trueup.agent.fastboot`) | {fast_total:.0f} | {top(fast_profile)} |",
        f"| full agent (`trueup.agent.launch`) | {full_total:.0f} | {top(full_profile)} |",
        "",
        "The fast path answers before the full agent's imports; the full agent takes its "
        "listeners over without closing them (see docs/startup.md).",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    quick_mode = "--quick" in sys.argv
    if "--client-only" in sys.argv:
        print(run_client(quick_mode))
    else:
        print(run(quick_mode))
