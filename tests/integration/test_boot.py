"""A rebooted router comes back whole; a link that appears late is waited for, not failed.

Real kernel, nft, Kea, Knot and keepalived in namespaces; a real `udhcpc`
client in its own namespace. A reboot is simulated as in
test_restore_incident.py: the agent and every daemon it started SIGKILLed,
then the kernel state flushed (addresses, VIPs, links down, the nft
ruleset), then the agent started again.

Every namespace and process is removed by name or PID: the router, operator
and DHCP client namespaces by the fixtures; agents, Kea, Knot and keepalived
by the verified pids of their records (keepalived's children by its own
configuration path).
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

from tests.integration.test_dhcp import SUBNET, DhcpRouter, dhcp_document, wait_until
from tests.integration.test_dns import DnsRouter, dns_document
from tests.integration.test_ha import _instances, kill_keepalived
from tests.routers import Router, require_root, sh
from trueup.system.kea import kea_paths
from trueup.system.kealeases import kea_command

pytestmark = pytest.mark.root

VIP = "203.0.113.254"
FORMER_VIP = "203.0.113.253"
FIREWALL = {
    "chains": [
        {
            "name": "input",
            "type": "filter",
            "hook": "input",
            "priority": 0,
            "policy": "accept",
            "rules": ["tcp dport 22 counter accept"],
        }
    ]
}


def _boot_document(vip: str) -> dict[str, Any]:
    document = dns_document(
        dhcp={"interfaces": ["lan0"], "subnets": [SUBNET]},
        firewall=FIREWALL,
        ha={
            "role": "primary",
            "advert_interval": 0.5,
            "vips": [{"interface": "lan0", "vrid": 51, "addresses": [f"{vip}/24"]}],
        },
        convergence={"default": "notify"},
    )
    document["spec"]["interfaces"] = [{"name": "lan0", "addresses": ["203.0.113.1/24"]}]
    return document


class BootRouter(DhcpRouter, DnsRouter):
    """A router with a DHCP client namespace, Kea, Knot and keepalived; all removed at the end."""

    def __init__(self, router: Router) -> None:
        DhcpRouter.__init__(self, router)

    def kill_all(self) -> None:
        """What a reboot does to processes: the agent and every daemon it started, SIGKILLed."""
        self.router.stop_agents(signal.SIGKILL)
        self.kill_daemons()
        kill_keepalived(self.router, signal.SIGKILL)
        for pid in _instances(self.router):
            os.kill(pid, signal.SIGKILL)
        # After a reboot none is left, not even dying: a daemon started while its old
        # instance still exits finds it "already running".
        wait_until(lambda: not _instances(self.router), "every killed process gone")

    def close(self) -> None:
        self.kill_all()
        DhcpRouter.close(self)


@pytest.fixture
def boot_router(tmp_path: Path) -> Iterator[BootRouter]:
    require_root()
    router = Router(tmp_path, client=True)
    boot = None
    try:
        boot = BootRouter(router)
        yield boot
    finally:
        if boot is not None:
            boot.close()
        router.close()


def _ruleset(router: Router) -> Any:
    done = router.run("nft", "-j", "list", "table", "inet", "trueup")
    if done.returncode != 0:
        return None
    # Handles are the kernel's numbering, not the ruleset.
    items = json.loads(done.stdout)["nftables"]
    for item in items:
        for body in item.values():
            if isinstance(body, dict):
                body.pop("handle", None)
    return [i for i in items if "metainfo" not in i]


def _kea_config(router: Router) -> Any:
    socket = kea_paths(router.state_dir / "run" / "kea-dhcp4", 4).socket
    try:
        answer = kea_command(socket, "config-get")
    except Exception:
        return None
    body = answer.get("arguments", {}).get("Dhcp4", {})
    return {
        "interfaces": body.get("interfaces-config", {}).get("interfaces"),
        "subnets": [s.get("subnet") for s in body.get("subnet4", [])],
    }


def _subsystems(router: Router) -> dict[str, Any]:
    return dict(router.api("/v1/status").get("subsystems", {}))


def test_a_cold_boot_under_notify_brings_back_every_subsystem(boot_router: BootRouter) -> None:
    router = boot_router.router
    config = router.write("edge.yaml", _boot_document(FORMER_VIP))
    router.start_agent("--config", str(config))
    wait_until(lambda: boot_router.daemon_pid("kea-dhcp4") is not None, "Kea started")
    wait_until(lambda: f"{FORMER_VIP}/24" in router.addresses("lan0"), "the first VIP held")
    # The revision in force before the reboot moved the VIP: FORMER_VIP is now a former one.
    moved = router.write("moved.yaml", _boot_document(VIP))
    applied = router.trueup("apply", str(moved))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    wait_until(lambda: f"{VIP}/24" in router.addresses("lan0"), "the VIP held")
    ruleset = _ruleset(router)
    assert ruleset, "the firewall table is loaded"
    kea = _kea_config(router)
    assert kea == {"interfaces": ["lan0"], "subnets": ["203.0.113.0/24"]}, kea
    assert boot_router.dig("router.lan.test") == ["203.0.113.1"]

    # The reboot: every process gone, the kernel's state gone, a former VIP left behind.
    boot_router.kill_all()
    router.ip("addr", "flush", "dev", "lan0")
    router.ip("addr", "flush", "dev", "mgmt0")
    router.ip("link", "set", "lan0", "down")
    router.ip("link", "set", "mgmt0", "down")
    assert router.run("nft", "flush", "ruleset").returncode == 0
    router.ip("addr", "add", f"{FORMER_VIP}/24", "dev", "lan0")
    assert _ruleset(router) is None

    router.start_agent("--config", str(config))
    # Nothing but the agent's own start: no `trueup reconcile`, policy notify throughout.
    router.wait_for(lambda: router.link("lan0")["up"], what="lan0 up again")
    router.wait_for(
        lambda: "203.0.113.1/24" in router.addresses("lan0"), what="lan0's address back"
    )
    router.wait_for(lambda: _ruleset(router) == ruleset, what="the nft ruleset back, equal")
    router.wait_for(lambda: _kea_config(router) == kea, what="Kea running its configuration")
    router.wait_for(
        lambda: boot_router.dig("router.lan.test") == ["203.0.113.1"], what="Knot serving the zone"
    )
    router.wait_for(
        lambda: f"{FORMER_VIP}/24" not in router.addresses("lan0"), what="the former VIP released"
    )
    router.wait_for(lambda: f"{VIP}/24" in router.addresses("lan0"), what="the VIP held again")
    # Released by the HA role as nobody's (docs/ha.md), not merely removed as an extra address.
    assert f"released virtual address {FORMER_VIP}/24 on lan0" in router.agent_log()
    address = boot_router.udhcpc(timeout=2, tries=5)
    assert address is not None and address.startswith("203.0.113."), router.agent_log()
    subsystems = _subsystems(router)
    for name in ("links", "addresses", "firewall", "dhcp", "dns", "ha"):
        assert subsystems[name]["health"] == "ok", (name, subsystems[name])
        assert subsystems[name]["policy"] == "notify", (name, subsystems[name])
    startup = router.api("/v1/status")["agent"]["startup"]
    phase = next(p for p in startup if p["name"] == "subsystems")
    assert phase["state"] == "done", phase


@pytest.fixture
def late_router(tmp_path: Path) -> Iterator[tuple[Router, str]]:
    """A router without lan0 yet (created by the test) and an empty DHCP client namespace."""
    require_root()
    router = Router(tmp_path, links=("mgmt0",), client=True)
    clientns = f"{router.name}-d"
    try:
        sh("ip", "netns", "add", clientns)
        sh("ip", "-n", clientns, "link", "set", "lo", "up")
        yield router, clientns
    finally:
        router.stop_agents(signal.SIGKILL)
        DnsRouter(router).kill_daemons()
        sh("ip", "netns", "del", clientns, check=False)
        router.close()


def _udhcpc(clientns: str) -> str | None:
    done = sh(
        "ip", "netns", "exec", clientns,
        "udhcpc", "-i", "lan0p", "-n", "-q", "-f", "-t", "3", "-T", "1",
        "-s", "/bin/true", check=False, timeout=60,
    )  # fmt: skip
    for line in (done.stdout + done.stderr).splitlines():
        if "lease of" in line and "obtained" in line:
            return line.split("lease of", 1)[1].split()[0]
    return None


def test_a_lan_link_appearing_late_is_waited_for_and_served_at_once(
    late_router: tuple[Router, str],
) -> None:
    router, clientns = late_router
    config = router.write("dhcp.yaml", dhcp_document())
    started = time.monotonic()
    router.start_agent("--config", str(config), wait_started=False)

    def dhcp() -> dict[str, Any]:
        return dict(_subsystems(router).get("dhcp", {}))

    router.wait_for(
        lambda: dhcp().get("health") == "pending" and "lan0" in str(dhcp().get("reason")),
        what="DHCP pending, waiting on lan0",
    )
    pending = dhcp()
    router.wait_for(router.started, what="startup phases done")
    # The scenario: the LAN link comes 5 s after the agent started (a slow driver).
    time.sleep(max(0.0, started + 5.0 - time.monotonic()))
    assert dhcp().get("health") == "pending", dhcp()
    router.ip("link", "add", "lan0", "type", "veth", "peer", "name", "lan0p")
    router.ip("link", "set", "lan0p", "netns", clientns)
    sh("ip", "-n", clientns, "link", "set", "lan0p", "up")
    appeared = time.monotonic()

    lease = None
    deadline = appeared + 90
    while lease is None and time.monotonic() < deadline:
        lease = _udhcpc(clientns)
    assert lease is not None and lease.startswith("203.0.113."), router.agent_log()
    served_after = time.monotonic() - appeared
    status = router.api("/v1/status")
    for name, sub in status["subsystems"].items():
        assert sub.get("breaker", "closed") == "closed", (name, sub)
        assert not sub.get("reconcile_failures"), (name, sub)
    health = router.api("/v1/health/services")["subsystems"]
    assert health["dhcp"]["health"] == "ok", health["dhcp"]
    assert "waiting on link lan0" in pending["reason"], pending
    print(f"lease {served_after:.2f}s after lan0 appeared")
