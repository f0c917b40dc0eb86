"""The crash sweep over every subsystem: one router running all of them, killed and restarted.

One router namespace (with the client namespace on mgmt0's peer) runs the
agent with a document that has links, addresses, routes, a firewall,
sysctls, Kea DHCP, Knot DNS, keepalived HA, HAProxy and WireGuard
(`wireguard-go`). Two revisions, `a` and `b`, differ in every one of them.
`FullRouter.snapshot()` is the whole system as the daemons and the kernel
report it: nft JSON, sysctl values, Kea's `config-get`, Knot's zone
contents, keepalived's and HAProxy's configurations, `wg show dump`, and
the kernel's links, addresses and routes. After every kill and restart the
snapshot must equal one revision's exactly.

Every namespace and process started here is removed by name or PID: the
namespaces by the `Router`, the daemons by the verified pids of their
supervisor records, the probe and the port holder by their PID.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.routers import Router, base_document, require_root, sh
from trueup.system.haproxy import haproxy_paths
from trueup.system.kea import kea_paths
from trueup.system.kealeases import kea_command
from trueup.system.keepalived import keepalived_paths
from trueup.system.knot import knot_paths
from trueup.system.pidrecord import verified_pid

__all__ = ["SUBSYSTEMS", "FullRouter", "full_router"]

# Every subsystem the revisions change, in the order a transaction converges them.
SUBSYSTEMS = [
    "links",
    "addresses",
    "routes",
    "firewall",
    "sysctl",
    "dhcp",
    "dns",
    "ha",
    "proxy",
    "wireguard",
]
FAST = {"TRUEUP_RESYNC_SECONDS": "1"}
# A loaded 2-core machine starts Kea, Knot, keepalived, HAProxy and wireguard-go
# slowly: every wait is for an event, bounded generously.
BOUND = 180.0
HELD_PORT = 51830  # bound by a helper: WireGuard cannot listen on it, so an apply fails

PROBE = r"""
import socket, sys, time
# TCP to the management address: connected, refused or reset means the address answers
# (a reset: the agent was killed with this connection in its listen queue).
log = open(sys.argv[1], "w", buffering=1)
while True:
    s = socket.socket()
    s.settimeout(0.3)
    try:
        s.connect(("198.51.100.2", 7443))
        state = "up"
    except (ConnectionRefusedError, ConnectionResetError):
        state = "up"
    except OSError as exc:
        state = "down " + type(exc).__name__
    finally:
        s.close()
    log.write(f"{time.time():.3f} {state}\n")
    time.sleep(0.05)
"""

HOLD = r"""
import socket, time
# Hold UDP port HELD on every address family, as another program would.
held = []
for family, host in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
    s = socket.socket(family, socket.SOCK_DGRAM)
    if family == socket.AF_INET6:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    s.bind((host, HELD))
    held.append(s)
print("held", flush=True)
while True:
    time.sleep(60)
""".replace("HELD", str(HELD_PORT))


def _genkey() -> tuple[str, str]:
    private = sh("wg", "genkey").stdout.strip()
    public = subprocess.run(
        ["wg", "pubkey"], input=private + "\n", capture_output=True, text=True, check=True
    ).stdout.strip()
    return private, public


def _revision(name: str, wg: str, peer_key: str, *, listen_port: int | None = None) -> Any:
    """Revision `a` or `b`: every subsystem configured, each one different between them."""
    b = name == "b"
    document = base_document(
        interfaces=[
            {
                "name": "lan0",
                "mtu": 1300 if b else 1400,
                "addresses": ["203.0.113.1/24", "2001:db8:1::2/64" if b else "2001:db8:1::1/64"]
                + (["203.0.113.5/24"] if b else []),
            }
        ],
        tables={},
        routes=[{"to": "192.0.2.0/25", "via": "203.0.113.251" if b else "203.0.113.250"}],
        firewall={
            "sets": [{"name": "ops", "type": "ipv4_addr", "elements": ["192.0.2.7"]}],
            "chains": [
                {
                    "name": "input",
                    "type": "filter",
                    "hook": "input",
                    "policy": "accept",
                    "rules": [
                        "ct state established,related accept",
                        'iifname "mgmt0" tcp dport 7443 accept',
                    ]
                    + (["ip saddr @ops tcp dport 22 counter accept"] if b else []),
                }
            ],
        },
        sysctl={"net.ipv4.ip_forward": 1 if b else 0},
        dhcp={
            "interfaces": ["lan0"],
            "subnets": [
                {
                    "id": 1,
                    "subnet": "203.0.113.0/24",
                    "pools": [
                        "203.0.113.160-203.0.113.180" if b else "203.0.113.100-203.0.113.150"
                    ],
                    "options": {"routers": "203.0.113.1"},
                }
            ],
        },
        dns={
            "zone": "lan.test",
            "listen": ["203.0.113.1"],
            "records": [
                {"name": "router", "type": "A", "value": "203.0.113.1"},
                {"name": "www", "type": "A", "value": "203.0.113.11" if b else "203.0.113.10"},
            ],
        },
        ha={
            "role": "primary",
            "advert_interval": 0.5,
            "vips": [
                {
                    "interface": "lan0",
                    "vrid": 51,
                    "addresses": ["203.0.113.201/24" if b else "203.0.113.200/24"],
                }
            ],
        },
        proxies=[
            {
                "name": "web",
                "bind": "198.51.100.2:8081" if b else "198.51.100.2:8080",
                "mode": "http",
                "backend": {"servers": [{"name": "app1", "address": "203.0.113.10:8080"}]},
                "timeouts": {"connect": "2s", "client": "10s", "server": "10s"},
            }
        ],
        wireguard={
            "resolve_interval": "300s",
            "interfaces": [
                {
                    "name": wg,
                    "private_key": {"secret_ref": "wg-key"},
                    "listen_port": listen_port or (51821 if b else 51820),
                    "addresses": ["192.0.2.130/25" if b else "192.0.2.129/25"],
                    "mtu": 1420,
                    "peers": [
                        {
                            "public_key": peer_key,
                            "endpoint": "203.0.113.2:51820",
                            "allowed_ips": ["192.0.2.131/32"] if b else ["192.0.2.132/32"],
                            "persistent_keepalive": 10 if b else 5,
                        }
                    ],
                }
            ],
        },
    )
    return document


class FullRouter:
    """A router running every subsystem; the agent is started and killed by the sweep."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.wg = f"wg{secrets.token_hex(3)}"
        self.probe_log = router.workdir / "probe.log"
        private, _ = _genkey()
        _, peer_public = _genkey()
        self._set_secret("wg-key", private)
        self.paths = {
            "a": router.write("a.yaml", _revision("a", self.wg, peer_public)),
            "b": router.write("b.yaml", _revision("b", self.wg, peer_public)),
            # `b`, but WireGuard cannot listen: the apply fails at its last subsystem
            # and rolls every other one back.
            "bad": router.write(
                "bad.yaml", _revision("b", self.wg, peer_public, listen_port=HELD_PORT)
            ),
        }
        self.snapshots: dict[str, dict[str, Any]] = {}
        self.current = "a"
        self.kills = 0

    # -- setup ----------------------------------------------------------------
    def _set_secret(self, name: str, value: str) -> None:
        path = self.router.workdir / f"{name}.in"
        path.write_text(value + "\n")
        done = self.router.trueup("secret", "set", name, "--from-file", str(path))
        path.unlink()
        assert done.returncode == 0, done.stdout + done.stderr

    def prepare(self) -> None:
        """Both revisions applied once, their snapshots taken; `a` applied; the probe runs."""
        self.apply("a")  # without an agent: the first accepted revision brings management up
        self.agent()
        for name in ("a", "b", "a"):
            self.apply(name)
            seen = self.settled_snapshot()
            if name in self.snapshots:
                assert seen == self.snapshots[name], (seen, self.snapshots[name])
            self.snapshots[name] = seen
        assert self.snapshots["a"] != self.snapshots["b"]
        differing = {
            k for k in self.snapshots["a"] if self.snapshots["a"][k] != self.snapshots["b"][k]
        }
        assert differing == set(self.snapshots["a"]), f"not every part differs: {differing}"
        self.current = "a"
        self.router.spawn_in_client(sys.executable, "-c", PROBE, str(self.probe_log))
        self.router.wait_for(self._probe_up, what="probe sees management", timeout=BOUND)

    def hold_port(self) -> None:
        """A helper holds WireGuard's port of the `bad` revision."""
        log = self.router.workdir / "hold.log"
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.router.name, sys.executable, "-c", HOLD],
            stdout=open(log, "w"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.router.helpers.append(proc)
        self.router.wait_for(
            lambda: "held" in log.read_text(), what="the port is held", timeout=BOUND
        )

    # -- the agent --------------------------------------------------------------
    def agent(self, fault: str | None = None, *, wait: bool = True) -> subprocess.Popen[str]:
        env = dict(FAST)
        if fault:
            env["TRUEUP_FAULT"] = fault
        return self.router.start_agent(env=env, wait_ready=wait, wait_started=wait)

    def stop_agent(self) -> None:
        """SIGKILL the running agents (the daemons stay, as after a crash)."""
        self.router.stop_agents(signal.SIGKILL)

    def killed(self, proc: subprocess.Popen[str]) -> None:
        """Wait for the fault point's SIGKILL."""
        self.router.wait_for(
            lambda: proc.poll() is not None, what="SIGKILL at the fault point", timeout=BOUND
        )
        assert proc.returncode == -signal.SIGKILL, self.router.agent_log()[-4000:]
        self.router.agents.remove(proc)
        self.kills += 1

    def restart(self) -> None:
        """A clean agent; it recovers the open transaction; no transaction stays open."""
        self.agent()
        self.router.wait_for(
            lambda: self.router.api("/v1/status").get("journal", {}).get("open", 1) is None,
            what="no open transaction",
            timeout=BOUND,
        )

    def apply(self, name: str, *, env: dict[str, str] | None = None) -> Any:
        done = self.router.trueup("apply", str(self.paths[name]), env=env, timeout=BOUND)
        if name != "bad" and env is None:
            assert done.returncode == 0, done.stdout + done.stderr
            self.current = name
        return done

    def begins(self) -> int:
        path = self.router.state_dir / "journal.jsonl"
        return path.read_text().count('"type":"begin"') if path.exists() else 0

    # -- checks -----------------------------------------------------------------
    def _probe_up(self) -> bool:
        lines = self.probe_log.read_text().splitlines() if self.probe_log.exists() else []
        return bool(lines) and lines[-1].endswith(" up")

    def settled_snapshot(self) -> dict[str, Any]:
        """The snapshot once two in a row agree (a daemon may still be reloading)."""
        seen: list[dict[str, Any]] = [self.snapshot()]

        def stable() -> bool:
            seen.append(self.snapshot())
            return seen[-1] == seen[-2]

        self.router.wait_for(stable, what="a stable snapshot", timeout=BOUND)
        return seen[-1]

    def matches(self, *names: str) -> str:
        """Which of the revisions `names` the system equals exactly (waits for one)."""
        found: list[str] = []
        last: list[dict[str, Any]] = []

        def one() -> bool:
            last[:] = [self.snapshot()]
            found[:] = [n for n in names if last[0] == self.snapshots[n]]
            return bool(found)

        try:
            self.router.wait_for(one, what=f"the system equals revision {names}", timeout=BOUND)
        except AssertionError:
            differing = {
                n: {
                    k: (last[0].get(k), v)
                    for k, v in self.snapshots[n].items()
                    if last[0].get(k) != v
                }
                for n in names
            }
            raise AssertionError(
                f"equals none of {names}: {differing}\n{self.evidence()}"
            ) from None
        return found[0]

    def consistent(self) -> None:
        """No transaction open, drift in sync, audit chain verifies, management answers."""
        router = self.router
        verified = router.trueup("audit", "verify")
        assert verified.returncode == 0, verified.stdout + verified.stderr
        status = router.api("/v1/status")
        assert status["journal"]["open"] is None
        assert status["management"]["ready"] is True
        router.wait_for(
            lambda: router.trueup("drift").returncode == 0, what="drift in sync", timeout=BOUND
        )
        code, body = router.from_client("http://198.51.100.2:7443/v1/health/management")
        assert code in (200, 401), (code, body)
        downs = [line for line in self.probe_log.read_text().splitlines() if " down" in line]
        assert not downs, downs[:5]

    def evidence(self) -> str:
        journal = self.router.state_dir / "journal.jsonl"
        lines = journal.read_text().splitlines()[-8:] if journal.exists() else []
        return "\n".join(line[:800] for line in lines) + "\n" + self.router.agent_log()[-3000:]

    # -- the system ---------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        router = self.router
        kernel = router.snapshot()
        vips = {"203.0.113.200/24", "203.0.113.201/24"}  # the HA role's, compared as keepalived's
        kernel["lan0"] = [a for a in kernel["lan0"] if a not in vips]
        kernel.pop("t100", None)
        return {
            "kernel": kernel,
            "nft": self._nft(),
            "sysctl": router.run("sysctl", "-n", "net.ipv4.ip_forward").stdout.strip(),
            "kea": self._kea(),
            "knot": self._knot(),
            "keepalived": _read(keepalived_paths(self.run("keepalived")).config),
            "haproxy": _read(haproxy_paths(self.run("haproxy")).config),
            "wireguard": self._wg(),
        }

    def run(self, name: str) -> Path:
        return self.router.state_dir / "run" / name

    def _nft(self) -> Any:
        listed = self.router.run("nft", "-j", "list", "table", "inet", "trueup")
        if listed.returncode != 0:
            return None
        objects = [o for o in json.loads(listed.stdout)["nftables"] if "metainfo" not in o]
        for entry in objects:
            for body in entry.values():
                body.pop("handle", None)
                body.pop("packets", None)
                body.pop("bytes", None)
        return json.dumps(objects, sort_keys=True)

    def _kea(self) -> Any:
        try:
            answer = kea_command(
                kea_paths(self.run("kea-dhcp4"), 4).socket, "config-get", timeout=5
            )
        except Exception as exc:  # not answering is a state like any other
            return f"no answer: {type(exc).__name__}"
        config = dict(answer.get("arguments", {}))
        config.pop("hash", None)
        return json.dumps(config, sort_keys=True)

    def _knot(self) -> Any:
        socket = knot_paths(self.run("knot")).socket
        read = subprocess.run(
            ["knotc", "-s", str(socket), "zone-read", "lan.test"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if read.returncode != 0:
            return f"no answer: {read.stdout.strip()} {read.stderr.strip()}"
        # Records without the SOA's serial, which a reload of the same contents may bump.
        return sorted(line for line in read.stdout.splitlines() if " SOA " not in line)

    def _wg(self) -> Any:
        dump = self.router.run("wg", "show", self.wg, "dump")
        if dump.returncode != 0:
            return None
        lines = dump.stdout.splitlines()
        # The interface line as is; for peers, without handshake time and transfer counters.
        return [
            lines[0],
            *("\t".join(line.split("\t")[:4] + line.split("\t")[7:]) for line in lines[1:]),
        ]

    # -- cleanup ------------------------------------------------------------------
    def close(self) -> None:
        router = self.router
        router.stop_agents(signal.SIGKILL)
        for pid in _daemon_pids(router):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        router.close()
        (Path("/var/run/wireguard") / f"{self.wg}.sock").unlink(missing_ok=True)


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _daemon_pids(router: Router) -> list[int]:
    """The verified pids of every supervised daemon, and keepalived's VRRP child."""
    pids: list[int] = []
    run = router.state_dir / "run"
    for record in run.glob("*/*.pid"):
        try:
            pid = verified_pid(json.loads(record.read_text()))
        except (OSError, ValueError):
            continue
        if pid is not None:
            pids.append(pid)
    child = keepalived_paths(run / "keepalived").pid_file("vrrp")
    try:
        vrrp = int(child.read_text().split()[0])
        stat = Path(f"/proc/{vrrp}/stat").read_text()
    except (OSError, ValueError, IndexError):
        return pids
    if int(stat[stat.rfind(")") + 2 :].split()[1]) in pids:
        pids.insert(0, vrrp)
    return pids


def full_router(tmp_path: Path) -> Iterator[FullRouter]:
    require_root()
    router = Router(tmp_path, client=True)
    full = FullRouter(router)
    try:
        yield full
    finally:
        full.close()


def kill_at(full: FullRouter, fault: str, name: str | None = None) -> None:
    """Apply the other revision (or `name`) with the agent set to die at `fault`; restart.

    The transaction never commits at these points: after the restart the
    system is the revision it was before, exactly.
    """
    before = full.current
    target = name or ("b" if before == "a" else "a")
    full.stop_agent()
    proc = full.agent(fault)
    full.apply(target, env={})
    full.killed(proc)
    full.restart()
    assert full.matches(before) == before
    full.current = before
    full.consistent()


def kill_in_recovery(full: FullRouter, name: str) -> None:
    """Kill an apply before its commit, then kill the recovery at `recovery:NAME`; restart.

    Recovery converges to the committed revision, so a recovery killed half
    way is recovered the same way by the next start.
    """
    before = full.current
    target = "b" if before == "a" else "a"
    full.stop_agent()
    proc = full.agent("apply/before-commit")
    full.apply(target, env={})
    full.killed(proc)
    proc = full.agent(f"recovery:{name}", wait=False)
    full.killed(proc)
    full.restart()
    assert full.matches(before) == before
    full.consistent()
