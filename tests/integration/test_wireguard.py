"""WireGuard on real `wireguard-go`: two routers, each a real trueup agent, tunnel to each other.

The routers' `lan0` links are one veth pair across the two namespaces (the
underlay, 203.0.113.0/24); each agent runs `wireguard-go` for its own
interface (names unique per test: `/var/run/wireguard` is shared by every
namespace). Router B reaches A by a host name its namespace's `/etc/hosts`
answers. Every namespace, `/etc/netns` entry and process started here is
removed by name or PID (the `Router`s; `wireguard-go` by the verified pid of
its supervisor record).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.routers import REPO, TRUEUP, Router, base_document, require_root, sh
from trueup.system.pidrecord import verified_pid

pytestmark = pytest.mark.root

MGMT_URL = "http://198.51.100.2:7443"


def _genkey() -> tuple[str, str]:
    private = sh("wg", "genkey").stdout.strip()
    public = subprocess.run(
        ["wg", "pubkey"], input=private + "\n", capture_output=True, text=True, check=True
    ).stdout.strip()
    return private, public


def _document(
    ifname: str,
    underlay: str,
    tunnel: tuple[str, str],
    peer_key: str,
    peer_endpoint: str,
    peer_tunnel: tuple[str, str],
    keepalive: int = 0,
    **extra: Any,
) -> dict[str, Any]:
    document = base_document(
        interfaces=[{"name": "lan0", "mtu": 1500, "addresses": [underlay]}],
        wireguard={
            "resolve_interval": "300s",
            "interfaces": [
                {
                    "name": ifname,
                    "private_key": {"secret_ref": "wg-key"},
                    "listen_port": 51820,
                    "addresses": list(tunnel),
                    "mtu": 1420,
                    "peers": [
                        {
                            "public_key": peer_key,
                            "endpoint": peer_endpoint,
                            "allowed_ips": [
                                f"{peer_tunnel[0].split('/')[0]}/32",
                                f"{peer_tunnel[1].split('/')[0]}/128",
                            ],
                            "persistent_keepalive": keepalive,
                        }
                    ],
                }
            ],
        },
        **extra,
    )
    document["spec"]["routes"] = []
    document["spec"]["tables"] = {}
    return document


def _wg_pids(router: Router) -> list[int]:
    pids = []
    for record in router.state_dir.glob("run/wg-*/wg-*.pid"):
        try:
            pid = verified_pid(json.loads(record.read_text()))
        except (OSError, ValueError):
            continue
        if pid is not None:
            pids.append(pid)
    return pids


def _close(router: Router, *ifnames: str) -> None:
    router.stop_agents(signal.SIGKILL)
    for pid in _wg_pids(router):
        os.kill(pid, signal.SIGKILL)
    router.close()
    for ifname in ifnames:  # a killed wireguard-go leaves its control socket behind
        (Path("/var/run/wireguard") / f"{ifname}.sock").unlink(missing_ok=True)


class Pair:
    def __init__(self, tmp_path: Path) -> None:
        suffix = secrets.token_hex(3)
        self.a = Router(tmp_path / "a", client=True)
        self.b = Router(tmp_path / "b")
        self.if_a, self.if_b = f"wg{suffix}a", f"wg{suffix}b"
        # One underlay: A's lan0 ↔ B's lan0.
        self.b.ip("link", "del", "lan0")
        self.a.ip("link", "set", "lan0p", "netns", self.b.name)
        self.b.ip("link", "set", "lan0p", "name", "lan0")
        self.key_a, self.pub_a = _genkey()
        self.key_b, self.pub_b = _genkey()
        etc = Path("/etc/netns") / self.b.name
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text("127.0.0.1 localhost\n203.0.113.1 peer-a.wg.test\n")

    def documents(self) -> tuple[dict[str, Any], dict[str, Any]]:
        tun_a = ("192.0.2.129/25", "2001:db8:100::1/64")
        tun_b = ("192.0.2.130/25", "2001:db8:100::2/64")
        # Only A keeps the session alive: two sides initiating in lockstep can take
        # several rounds of WireGuard's retry jitter to agree on a handshake.
        doc_a = _document(
            self.if_a, "203.0.113.1/24", tun_a, self.pub_b, "203.0.113.2:51820", tun_b, 5
        )
        doc_b = _document(
            self.if_b, "203.0.113.2/24", tun_b, self.pub_a, "peer-a.wg.test:51820", tun_a
        )
        return doc_a, doc_b

    def close(self) -> None:
        _close(self.a, self.if_a)
        _close(self.b, self.if_b)


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    require_root()
    pair = Pair(tmp_path)
    try:
        yield pair
    finally:
        pair.close()


def _set_secret(router: Router, name: str, value: str) -> None:
    path = router.workdir / f"{name}.in"
    router.workdir.mkdir(parents=True, exist_ok=True)
    path.write_text(value + "\n")
    done = router.trueup("secret", "set", name, "--from-file", str(path))
    path.unlink()
    assert done.returncode == 0, done.stdout + done.stderr


def _ping(router: Router, address: str) -> bool:
    # busybox's ping (ICMP and ICMPv6); the tunnel is the only route to the address.
    return router.run("busybox", "ping", "-c", "1", "-W", "1", address, timeout=10).returncode == 0


def _wg_peers(router: Router, ifname: str) -> list[str]:
    return router.run("wg", "show", ifname, "peers").stdout.split()


def _heals(router: Router) -> list[dict[str, Any]]:
    lines = (router.state_dir / "audit.jsonl").read_text().splitlines()
    return [
        r["details"]
        for r in map(json.loads, lines)
        if r["event"] == "reconcile" and r["details"].get("subsystem") == "wireguard"
    ]


def test_two_routers_tunnel_heal_a_removed_peer_and_never_show_a_key(pair: Pair) -> None:
    a, b = pair.a, pair.b
    doc_a, doc_b = pair.documents()
    a.state_dir.mkdir(parents=True, exist_ok=True)
    b.state_dir.mkdir(parents=True, exist_ok=True)
    # A is configured before its key is stored: WireGuard fails alone, saying where to put it.
    a.start_agent("--config", str(a.write("a.yaml", doc_a)))
    services = a.api("/v1/health/services")["subsystems"]
    assert services["wireguard"]["health"] == "failed"
    assert "trueup secret set wg-key" in services["wireguard"]["reason"]
    assert services["addresses"]["health"] == "ok"
    _set_secret(a, "wg-key", pair.key_a)
    _set_secret(b, "wg-key", pair.key_b)
    assert a.trueup("secret", "list").stdout.split() == ["wg-key"]
    secret_file = a.state_dir / "secrets" / "wg-key"
    assert secret_file.stat().st_mode & 0o777 == 0o600
    assert secret_file.parent.stat().st_mode & 0o777 == 0o700
    b.start_agent("--config", str(b.write("b.yaml", doc_b)))
    wg_b = b.api("/v1/health/services")["subsystems"]["wireguard"]
    assert wg_b["health"] == "ok", (wg_b, b.api("/v1/drift"))
    applied = a.trueup("reconcile", "--subsystem", "wireguard")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    a.wait_for(
        lambda: a.api("/v1/health/services")["subsystems"]["wireguard"]["health"] == "ok",
        what="A's tunnel up",
        timeout=40,
    )

    # Traffic over the tunnel, both families.
    a.wait_for(lambda: _ping(a, "192.0.2.130"), what="ping through the tunnel", timeout=60)
    assert _ping(b, "192.0.2.129")
    a.wait_for(lambda: _ping(a, "2001:db8:100::2"), what="IPv6 through the tunnel")

    # Status: public key, port, the resolved endpoint, handshake and counters; no key.
    def peer_report() -> dict[str, Any]:
        system = b.api("/v1/status")["subsystems"]["wireguard"]["system"]
        return dict(system["interfaces"][pair.if_b]["peers"][pair.pub_a])

    system = b.api("/v1/status")["subsystems"]["wireguard"]["system"]
    assert system["interfaces"][pair.if_b]["public_key"] == pair.pub_b
    assert system["interfaces"][pair.if_b]["listen_port"] == 51820
    assert system["resolution"]["peer-a.wg.test:51820"]["endpoint"] == "203.0.113.1:51820"
    b.wait_for(lambda: bool(peer_report()["latest_handshake"]), what="handshake in status")
    peer = peer_report()
    assert peer["resolved_endpoint"] == "203.0.113.1:51820"
    assert peer["endpoint_name"] == "peer-a.wg.test:51820"
    assert peer["rx_bytes"] > 0 and peer["tx_bytes"] > 0

    # Behind trueup's back: the peer removed with `wg set` → drift → healed.
    sh("ip", "netns", "exec", b.name, "wg", "set", pair.if_b, "peer", pair.pub_a, "remove")
    b.wait_for(lambda: bool(_heals(b)), what="the heal audited", timeout=40)
    assert _heals(b)[0]["outcome"] == "healed"
    assert any(pair.if_b in p for p in _heals(b)[0]["paths"])
    assert _wg_peers(b, pair.if_b) == [pair.pub_a]
    b.wait_for(lambda: _ping(b, "192.0.2.129"), what="tunnel back after the heal", timeout=30)

    # wireguard-go killed: its interface goes; the supervisor and the heal bring both back.
    (old,) = _wg_pids(a)
    os.kill(old, signal.SIGKILL)
    a.wait_for(
        lambda: _wg_pids(a) not in ([], [old]) and _wg_peers(a, pair.if_a) == [pair.pub_b],
        what="wireguard-go back with its peer",
        timeout=40,
    )
    a.wait_for(lambda: _ping(a, "192.0.2.130"), what="tunnel back after the kill", timeout=30)
    assert sorted(a.addresses(pair.if_a)) == ["192.0.2.129/25", "2001:db8:100::1/64"]

    # An agent restart adopts the running wireguard-go (the stored revision re-parses).
    running = _wg_pids(a)
    a.stop_agents()
    a.start_agent()
    a.wait_for(
        lambda: a.api("/v1/health/services")["subsystems"]["wireguard"]["health"] == "ok",
        what="wireguard ok after the restart",
    )
    assert _wg_pids(a) == running
    assert _ping(a, "192.0.2.130")

    # The private keys appear nowhere: status, evidence, logs, journal, audit.
    evidence = a.workdir / "evidence.tar.gz"
    done = a.trueup("evidence", "--out", str(evidence))
    assert done.returncode == 0, done.stdout + done.stderr
    for router, key in ((a, pair.key_a), (b, pair.key_b)):
        status = router.trueup("status", "-o", "json")
        assert status.returncode == 0 and pair.pub_a in status.stdout + json.dumps(
            router.api("/v1/status")
        )
        places = {
            "status": status.stdout + json.dumps(router.api("/v1/status")),
            "drift": json.dumps(router.api("/v1/drift")),
            "agent log": router.agent_log(),
            "journal": (router.state_dir / "journal.jsonl").read_text(),
            "audit": (router.state_dir / "audit.jsonl").read_text(),
            "revisions": "".join(p.read_text() for p in router.state_dir.glob("revisions/*.json")),
        }
        # Every other file of the state directory (run directories, journal archives, …):
        # only the secret store holds the key.
        secrets_dir = router.state_dir / "secrets"
        for path in router.state_dir.rglob("*"):
            if path.is_file() and not path.is_socket() and secrets_dir not in path.parents:
                places[str(path)] = path.read_text(errors="replace")
        assert (secrets_dir / "wg-key").read_text().strip() == key
        for where, text in places.items():
            assert key not in text, f"the private key is in the {where}"
    with tarfile.open(evidence) as tar:
        for member in tar.getmembers():
            data = tar.extractfile(member)
            if data is not None:
                assert pair.key_a.encode() not in data.read(), member.name


def test_a_hanging_resolver_fails_wireguard_alone_at_its_deadline(tmp_path: Path) -> None:
    require_root()
    router = Router(tmp_path, client=True)
    ifname = f"wg{secrets.token_hex(3)}h"
    try:
        etc = Path("/etc/netns") / router.name
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "resolv.conf").write_text("nameserver 127.0.0.53\noptions timeout:30 attempts:3\n")
        (etc / "hosts").write_text("127.0.0.1 localhost\n")
        router.spawn(
            sys.executable,
            "-c",
            "import socket\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
            "s.bind(('127.0.0.53',53))\nwhile True: s.recvfrom(512)\n",
        )
        _key, public = _genkey()
        document = _document(
            ifname,
            "203.0.113.1/24",
            ("192.0.2.129/25", "2001:db8:100::1/64"),
            public,
            "never.wg.test:51820",
            ("192.0.2.130/25", "2001:db8:100::2/64"),
            convergence={"deadlines": {"wireguard": 3}},
        )
        config = router.write("desired.yaml", document)
        router.start_agent("--config", str(config), wait_ready=False, wait_started=False)
        router.wait_for(
            lambda: router.from_client(f"{MGMT_URL}/v1/health/management", timeout=2)[0] == 200,
            what="management ready from the client namespace",
        )
        router.wait_for(
            lambda: (
                router.api("/v1/health/services")["subsystems"]["wireguard"]["health"] == "failed"
            ),
            what="wireguard failed at its deadline",
            timeout=40,
        )
        services = router.api("/v1/health/services")["subsystems"]
        reason = services["wireguard"]["reason"]
        assert "deadline of 3s exceeded while preparing" in reason
        for name in ("management", "links", "addresses", "routes"):
            assert services[name]["health"] == "ok", (name, services[name])
        assert router.addresses("lan0") == ["203.0.113.1/24"]
        assert router.addresses("mgmt0") == ["198.51.100.2/24"]
        status, body = router.from_client(f"{MGMT_URL}/v1/health/management")
        assert status == 200 and body["ready"] is True
    finally:
        _close(router, ifname)


def _dump_peers(router: Router, ifname: str) -> dict[str, list[str]]:
    """`wg show IF dump` per peer: [preshared, endpoint, allowed-ips, …, keepalive]."""
    lines = router.run("wg", "show", ifname, "dump").stdout.splitlines()[1:]
    return {cols[0]: cols[1:] for cols in (line.split("\t") for line in lines)}


def test_keepalive_preshared_key_allowed_ips_and_peers_can_be_removed(tmp_path: Path) -> None:
    require_root()
    router = Router(tmp_path, client=True)
    ifname = f"wg{secrets.token_hex(3)}r"
    try:
        key, _public = _genkey()
        _key2, peer2 = _genkey()
        _key1, peer1 = _genkey()
        psk = sh("wg", "genpsk").stdout.strip()
        _set_secret(router, "wg-key", key)
        _set_secret(router, "wg-psk", psk)
        document = _document(
            ifname,
            "203.0.113.1/24",
            ("192.0.2.129/25", "2001:db8:100::1/64"),
            peer1,
            "203.0.113.2:51820",
            ("192.0.2.130/25", "2001:db8:100::2/64"),
            5,
        )
        interface = document["spec"]["wireguard"]["interfaces"][0]
        interface["peers"][0]["preshared_key"] = {"secret_ref": "wg-psk"}
        interface["peers"].append({"public_key": peer2, "allowed_ips": ["192.0.2.64/26"]})
        config = router.write("desired.yaml", document)
        router.start_agent("--config", str(config))
        router.wait_for(
            lambda: router.api("/v1/health/services")["subsystems"]["wireguard"]["health"] == "ok",
            what="wireguard ok",
            timeout=60,
        )
        live = _dump_peers(router, ifname)[peer1]
        assert live[0] != "(none)" and live[-1] == "5", live

        def apply(what: str) -> dict[str, list[str]]:
            done = router.trueup("apply", str(router.write(f"{what}.yaml", document)))
            assert done.returncode == 0, (what, done.stdout + done.stderr)
            drift = router.trueup("drift")
            assert drift.returncode == 0, (what, drift.stdout + drift.stderr)
            return _dump_peers(router, ifname)

        peer = interface["peers"][0]
        peer["persistent_keepalive"] = 0
        assert apply("keepalive-off")[peer1][-1] == "off"
        del peer["preshared_key"]
        live = apply("no-psk")[peer1]
        assert live[0] == "(none)" and live[-1] == "off", live
        peer["allowed_ips"] = []
        live = apply("no-allowed-ips")[peer1]
        assert live[2] == "(none)" and live[0] == "(none)", live
        assert _dump_peers(router, ifname)[peer2][2] == "192.0.2.64/26"

        # A keepalive set by hand on a peer the document gives none: healed.
        heals = len(_heals(router))
        router.run("wg", "set", ifname, "peer", peer1, "persistent-keepalive", "25")
        router.wait_for(
            lambda: len(_heals(router)) > heals and _dump_peers(router, ifname)[peer1][-1] == "off",
            what="the hand-set keepalive healed",
            timeout=60,
        )
        assert _heals(router)[-1]["outcome"] == "healed"

        # A peer removed from the document goes from the interface.
        interface["peers"] = [interface["peers"][1]]
        assert sorted(apply("one-peer")) == [peer2]
    finally:
        _close(router, ifname)


def test_a_hanging_lookup_never_delays_the_network_tier_at_start_or_on_apply(
    tmp_path: Path,
) -> None:
    """`resolve_timeout: 20` and a resolver that swallows queries: lan0's addresses come while
    WireGuard is still preparing (event order, not a duration), at start and on apply."""
    require_root()
    router = Router(tmp_path, client=True)
    ifname = f"wg{secrets.token_hex(3)}p"
    try:
        etc = Path("/etc/netns") / router.name
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "resolv.conf").write_text("nameserver 127.0.0.53\noptions timeout:30 attempts:3\n")
        (etc / "hosts").write_text("127.0.0.1 localhost\n")
        router.spawn(
            sys.executable,
            "-c",
            "import socket\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
            "s.bind(('127.0.0.53',53))\nwhile True: s.recvfrom(512)\n",
        )
        key, public = _genkey()
        _set_secret(router, "wg-key", key)
        document = _document(
            ifname,
            "203.0.113.1/24",
            ("192.0.2.129/25", "2001:db8:100::1/64"),
            public,
            "never.wg.test:51820",
            ("192.0.2.130/25", "2001:db8:100::2/64"),
            convergence={"deadlines": {"wireguard": 40}},
        )
        document["spec"]["wireguard"]["resolve_timeout"] = "20s"

        def wireguard() -> dict[str, Any]:
            return dict(
                router.api("/v1/health/services").get("subsystems", {}).get("wireguard", {})
            )

        # At start.
        config = router.write("desired.yaml", document)
        router.start_agent("--config", str(config), wait_ready=False, wait_started=False)
        router.wait_for(
            lambda: "203.0.113.1/24" in router.addresses("lan0"),
            what="lan0's address at start",
            timeout=60,
        )
        assert not router.started()
        assert wireguard().get("health") == "pending", wireguard()
        router.wait_for(router.started, what="startup done", timeout=120)
        assert wireguard()["health"] == "failed"
        assert "never.wg.test" in wireguard()["reason"], wireguard()

        # On apply: a new address on lan0, and the name still hangs.
        document["spec"]["interfaces"][0]["addresses"].append("203.0.113.5/24")
        config = router.write("second.yaml", document)
        applying = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                router.name,
                *TRUEUP,
                "apply",
                str(config),
                "--mode",
                "best-effort",
                "--state-dir",
                str(router.state_dir),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        try:
            router.wait_for(
                lambda: "203.0.113.5/24" in router.addresses("lan0"),
                what="the new address on apply",
                timeout=60,
            )
            assert applying.poll() is None, applying.communicate()[0]
            out, _ = applying.communicate(timeout=120)
        finally:
            if applying.poll() is None:
                applying.kill()
                applying.wait()
        assert "wireguard" in out and "never.wg.test" in out, out
        assert router.addresses("lan0") == ["203.0.113.1/24", "203.0.113.5/24"]
        status, body = router.from_client(f"{MGMT_URL}/v1/health/management")
        assert status == 200 and body["ready"] is True
    finally:
        _close(router, ifname)
