"""HA on real keepalived: two routers share a segment with a client; the VIP moves and stays single.

Topology (every namespace named per test, removed by name at the end):

    router A (lan0) ─┐
    router B (lan0) ─┼─ br0 in the segment namespace ── client (203.0.113.50/24)
                     │
Each router runs its own trueup agent, which runs its own keepalived under its
supervisor. Every keepalived process is killed at the end by the verified pids
of its records (the supervisor's, and keepalived's own for its VRRP child).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.routers import Router, base_document, require_root, sh
from trueup.journal.management import api_bind_address, read_management, write_management
from trueup.system.keepalived import keepalived_paths
from trueup.system.pidrecord import proc_start_time, verified_pid

pytestmark = pytest.mark.root

VIP = "203.0.113.254"
CLIENT = "203.0.113.50"


def ha_document(address: str, role: str, **ha: Any) -> dict[str, Any]:
    section: dict[str, Any] = {
        "role": role,
        "advert_interval": 0.5,
        "vips": [{"interface": "lan0", "vrid": 51, "addresses": [f"{VIP}/24"]}],
    }
    section.update(ha)
    document = base_document(
        interfaces=[{"name": "lan0", "addresses": [f"{address}/24"]}],
        routes=[],
        tables={},
        ha=section,
    )
    return document


class Segment:
    """Two routers' lan0 peers and a client on one bridge."""

    def __init__(self, workdir: Path) -> None:
        for side in ("a", "b"):
            (workdir / side).mkdir()
        self.a = Router(workdir / "a")
        self.b = Router(workdir / "b")
        self.name = f"{self.a.name}-seg"
        self.client = f"{self.a.name}-cl"
        sh("ip", "netns", "add", self.name)
        sh("ip", "netns", "add", self.client)
        self.seg("link", "add", "br0", "type", "bridge")
        self.seg("link", "set", "br0", "up")
        for index, router in enumerate((self.a, self.b)):
            port = f"p{index}"
            router.ip("link", "set", "lan0p", "netns", self.name)
            self.seg("link", "set", "lan0p", "name", port)
            self.seg("link", "set", port, "master", "br0")
            self.seg("link", "set", port, "up")
        sh("ip", "-n", self.client, "link", "set", "lo", "up")
        sh("ip", "-n", self.client, "link", "add", "cl0", "type", "veth", "peer", "name", "cl0p")
        sh("ip", "-n", self.client, "link", "set", "cl0p", "netns", self.name)
        self.seg("link", "set", "cl0p", "master", "br0")
        self.seg("link", "set", "cl0p", "up")
        sh("ip", "-n", self.client, "addr", "add", f"{CLIENT}/24", "dev", "cl0")
        sh("ip", "-n", self.client, "link", "set", "cl0", "up")

    def seg(self, *args: str) -> None:
        sh("ip", "-n", self.name, *args)

    def ping(self) -> bool:
        proc = sh(
            "ip",
            "netns",
            "exec",
            self.client,
            "busybox",
            "ping",
            "-c",
            "1",
            "-W",
            "1",
            VIP,
            check=False,
        )
        return proc.returncode == 0

    def vip_mac(self) -> str | None:
        shown = sh("ip", "-n", self.client, "-j", "neigh", "show", VIP, check=False)
        for entry in json.loads(shown.stdout or "[]"):
            if entry.get("lladdr"):
                return str(entry["lladdr"])
        return None

    def close(self) -> None:
        for router in (self.a, self.b):
            router.stop_agents(signal.SIGKILL)
            kill_keepalived(router, signal.SIGKILL)
        sh("ip", "netns", "del", self.client, check=False)
        sh("ip", "netns", "del", self.name, check=False)
        self.a.close()
        self.b.close()


def keepalived_pids(router: Router) -> list[int]:
    """The verified keepalived processes of this router: the supervised parent, its VRRP child."""
    run = router.state_dir / "run" / "keepalived"
    pids: list[int] = []
    try:
        record = json.loads((run / "keepalived.pid").read_text())
    except (OSError, ValueError):
        return pids
    parent = verified_pid(record)
    if parent is None:
        return pids
    pids.append(parent)
    child_file = keepalived_paths(run).pid_file("vrrp")
    try:
        child = int(child_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return pids
    # The child counts only when it is the parent's child, started after it.
    try:
        stat = Path(f"/proc/{child}/stat").read_text()
    except OSError:
        return pids
    ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
    started = proc_start_time(child)
    if ppid == parent and started is not None:
        pids.append(child)
    return pids


def kill_keepalived(router: Router, sig: int) -> None:
    pids = keepalived_pids(router)
    if sig == signal.SIGKILL and len(pids) == 2:
        # A crash that leaves the VIP: the parent must neither respawn its VRRP child
        # nor outlive it (its death makes the child shut down cleanly): stop it first.
        parent, child = pids
        os.kill(parent, signal.SIGSTOP)
        os.kill(child, signal.SIGKILL)
        os.kill(parent, signal.SIGKILL)
    else:
        for pid in pids:
            os.kill(pid, sig)
    deadline = time.monotonic() + 60
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :].split()[0] != "Z"


def holds(router: Router) -> bool:
    return f"{VIP}/24" in router.addresses("lan0")


@pytest.fixture
def segment(tmp_path: Path) -> Iterator[Segment]:
    require_root()
    made = Segment(tmp_path)
    try:
        yield made
    finally:
        made.close()


def start(router: Router, document: dict[str, Any]) -> None:
    config = router.write("ha.yaml", document)
    router.start_agent("--config", str(config))


def test_the_vip_fails_over_and_a_stale_vip_is_released_at_start(segment: Segment) -> None:
    a, b = segment.a, segment.b
    start(a, ha_document("203.0.113.1", "primary"))
    start(b, ha_document("203.0.113.2", "standby"))
    a.wait_for(lambda: holds(a), what="the primary holds the VIP", timeout=30)
    assert not holds(b)
    a.wait_for(segment.ping, what="the client reaches the VIP", timeout=30)
    a_mac = a.ip_json("link", "show", "dev", "lan0")[0]["address"]
    b_mac = b.ip_json("link", "show", "dev", "lan0")[0]["address"]
    assert segment.vip_mac() == a_mac
    status = a.api("/v1/status")["subsystems"]["ha"]
    assert status["health"] == "ok", status
    a.wait_for(
        lambda: a.api("/v1/status")["subsystems"]["ha"].get("system", {}).get("state") == "MASTER",
        what="the primary reports MASTER",
    )
    system = a.api("/v1/status")["subsystems"]["ha"]["system"]
    assert system["holds"] == [f"lan0 {VIP}/24"] and system["priority"] == 200
    # Addresses do not call the VIP drift.
    assert a.trueup("drift").returncode == 0

    # Graceful stop of the primary's keepalived (priority 0): the standby takes over.
    a.stop_agents()
    kill_keepalived(a, signal.SIGTERM)
    b.wait_for(lambda: holds(b), what="the standby takes the VIP", timeout=30)
    assert not holds(a)
    b.wait_for(segment.ping, what="the client reaches the VIP on the standby", timeout=30)
    b.wait_for(lambda: segment.vip_mac() == b_mac, what="the client learns the new holder")

    # The primary comes back (keepalived not running, nothing stale) and preempts.
    start(a, ha_document("203.0.113.1", "primary"))
    a.wait_for(lambda: holds(a) and not holds(b), what="the primary takes back the VIP")

    # A crash: keepalived SIGKILLed leaves the VIP behind; the standby takes over anyway.
    a.stop_agents()
    kill_keepalived(a, signal.SIGKILL)
    assert holds(a), "SIGKILL left the VIP on the former holder"
    b.wait_for(lambda: holds(b), what="the standby takes the VIP after a crash", timeout=30)
    # The agent starts with keepalived not running: the stale VIP is released and reported.
    start(a, ha_document("203.0.113.1", "primary"))
    released = a.api("/v1/status")["subsystems"]["ha"].get("system", {}).get("released", [])
    assert [(r["interface"], r["address"], r["reason"]) for r in released] == [
        ("lan0", f"{VIP}/24", "keepalived not running")
    ]
    assert f"released virtual address {VIP}/24 on lan0" in a.agent_log()
    a.wait_for(lambda: holds(a) and not holds(b), what="one holder again, the primary")


def test_a_saved_bind_on_a_former_vip_serves_on_the_wildcard_and_never_binds_the_vip(
    tmp_path: Path,
) -> None:
    require_root()
    router = Router(tmp_path, client=True)
    try:
        # 198.51.100.9 is an HA virtual address on the management interface that this
        # node does not hold (role none).
        document = base_document(
            routes=[],
            tables={},
            ha={
                "role": "none",
                "vips": [{"interface": "mgmt0", "vrid": 9, "addresses": ["198.51.100.9/24"]}],
            },
        )
        applied = router.trueup("apply", str(router.write("ha.yaml", document)))
        assert applied.returncode == 0, applied.stdout + applied.stderr
        saved = read_management(router.state_dir)
        assert saved is not None and saved["virtual"] == ["198.51.100.9"]
        # The incident: the saved API bind names the former VIP (as an agent that did not
        # tell them apart saved it). It is absent now.
        write_management(router.state_dir, {**saved, "api": {"port": 7443, "bind": "198.51.100.9"}})
        assert api_bind_address(read_management(router.state_dir) or {}) is None
        # Present at start (a crashed holder's leftover): it would bind, but must not.
        router.ip("addr", "add", "198.51.100.9/24", "dev", "mgmt0")
        router.start_agent()
        status, answer = router.from_client("http://198.51.100.2:7443/v1/health/management")
        assert status == 200 and answer["ready"] is True, answer
        router.wait_for(
            lambda: "198.51.100.9/24" not in router.addresses("mgmt0"),
            what="the unheld VIP is released at start",
            timeout=30,
        )
        sockets = router.run("ss", "-Hltn", "sport", "= :7443").stdout
        assert "198.51.100.9" not in sockets and sockets.strip(), sockets

        # A stale copy of the VIP appears (a crashed holder's leftovers): released and
        # reported; the management address stays; the API never binds the VIP.
        router.ip("addr", "add", "198.51.100.9/24", "dev", "mgmt0")
        router.wait_for(
            lambda: "198.51.100.9/24" not in router.addresses("mgmt0"),
            what="the unheld VIP is released",
            timeout=30,
        )
        assert "198.51.100.2/24" in router.addresses("mgmt0")
        released = router.api("/v1/status")["subsystems"]["ha"]["system"]["released"]
        assert [(r["address"], r["reason"]) for r in released] == [
            ("198.51.100.9/24", "role none"),
            ("198.51.100.9/24", "role none"),
        ]
        listeners = router.api("/v1/health/management")["listeners"]
        bound = {
            str(v.get("address"))
            for v in listeners.values()
            if isinstance(v, dict) and v.get("state") == "serving"
        }
        assert "198.51.100.9" not in bound, listeners
        sockets = router.run("ss", "-Hltn", "sport", "= :7443").stdout
        assert "198.51.100.9" not in sockets and sockets.strip(), sockets
        status, answer = router.from_client("http://198.51.100.2:7443/v1/health/management")
        assert status == 200, answer
        assert not keepalived_pids(router)
    finally:
        router.close()


def _instances(router: Router) -> list[int]:
    """Every keepalived process running this router's configuration (parents and children)."""
    config = f"--use-file={keepalived_paths(router.state_dir / 'run' / 'keepalived').config}"
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            words = entry.joinpath("cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if config.encode() in words and _alive(int(entry.name)):
            found.append(int(entry.name))
    return sorted(found)


def _ha_heals(router: Router) -> list[dict[str, Any]]:
    lines = (router.state_dir / "audit.jsonl").read_text().splitlines()
    return [
        r["details"]
        for r in map(json.loads, lines)
        if r["event"] == "reconcile" and r["details"].get("subsystem") == "ha"
    ]


@pytest.fixture
def lone_router(tmp_path: Path) -> Iterator[Router]:
    require_root()
    router = Router(tmp_path)
    try:
        yield router
    finally:
        router.stop_agents(signal.SIGKILL)
        kill_keepalived(router, signal.SIGKILL)
        for pid in _instances(router):  # by this router's own configuration path
            os.kill(pid, signal.SIGKILL)
        router.close()


def test_a_killed_keepalived_parent_is_replaced_by_exactly_one_instance(
    lone_router: Router,
) -> None:
    router = lone_router
    start(router, ha_document("203.0.113.1", "primary"))
    router.wait_for(lambda: holds(router), what="the lone primary holds the VIP")
    router.wait_for(lambda: len(keepalived_pids(router)) == 2, what="keepalived and its child")
    parent, child = keepalived_pids(router)
    assert _instances(router) == sorted((parent, child))
    before = len(_ha_heals(router))

    # The parent alone is killed: its VRRP child keeps running, in the parent's session.
    os.kill(parent, signal.SIGKILL)
    router.wait_for(
        lambda: (lambda pids: len(pids) == 2 and pids[0] != parent)(keepalived_pids(router)),
        what="a new keepalived with its VRRP child",
    )
    assert not _alive(child), "the new keepalived started beside the old VRRP child"
    new_parent, new_child = keepalived_pids(router)
    assert _instances(router) == sorted((new_parent, new_child))
    router.wait_for(lambda: holds(router), what="the VIP held again")

    def ha() -> dict[str, Any]:
        return dict(router.api("/v1/status")["subsystems"]["ha"])

    router.wait_for(lambda: ha()["health"] == "ok", what="ha ok")
    router.wait_for(
        lambda: ha().get("system", {}).get("state") == "MASTER", what="the primary reports MASTER"
    )
    assert "left processes" in router.agent_log() and str(child) in router.agent_log()
    # One restart, never a string of starts that exit at once: at most one heal (the
    # supervisor may have restarted it first), no failure, and still one instance.
    after = _ha_heals(router)[before:]
    assert [h["outcome"] for h in after] in ([], ["healed"]), after
    assert "already running" not in router.agent_log()
    assert _instances(router) == sorted((new_parent, new_child))
