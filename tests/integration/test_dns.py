"""DNS on real daemons: the agent's Knot answers `kdig`, heals edits, and seeds records from leases.

Every namespace and process started here is removed by name or PID: the
router and client namespaces by the `Router` fixture, the Knot and Kea
processes (by the verified pids of their supervisor records) and the DHCP
client's namespace by `dns_router`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.routers import Router, base_document, require_root, sh
from trueup.system.knot import knot_paths
from trueup.system.pidrecord import verified_pid

pytestmark = pytest.mark.root

MGMT_URL = "http://198.51.100.2:7443"
HEADER = (
    "address,hwaddr,client_id,valid_lifetime,expire,subnet_id,"
    "fqdn_fwd,fqdn_rev,hostname,state,user_context"
)
RECORDS = [
    {"name": "router", "type": "A", "value": "203.0.113.1"},
    {"name": "router", "type": "AAAA", "value": "2001:db8:1:0::1"},
    {"name": "www", "type": "CNAME", "value": "router", "ttl": 60},
    {"name": "@", "type": "MX", "value": "10 router"},
    {"name": "@", "type": "TXT", "value": 'v=spf1 -all "quoted"'},
    {"name": "_sip._udp", "type": "SRV", "value": "10 5 5060 router"},
    {"name": "1.113.0.203.in-addr.arpa.", "type": "PTR", "value": "router"},
]


def dns_document(leases: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    section: dict[str, Any] = {
        "zone": "lan.test",
        "listen": ["203.0.113.1"],
        "records": RECORDS,
        "reverse": ["203.0.113.0/24"],
    }
    if leases is not None:
        section["leases"] = leases
    document = base_document(dns=section, **extra)
    document["spec"]["routes"] = []
    document["spec"]["tables"] = {}
    return document


def lease_row(
    address: str, hostname: str, *, valid: int = 3600, mac: str = "02:00:00:00:00:01"
) -> str:
    expire = int(time.time()) + valid if valid else int(time.time())
    return f"{address},{mac},,{valid},{expire},1,0,0,{hostname},0,"


class DnsRouter:
    def __init__(self, router: Router) -> None:
        self.router = router
        self.clientns: str | None = None

    @property
    def knot_run(self) -> Path:
        return self.router.state_dir / "run" / "knot"

    @property
    def socket(self) -> Path:
        return knot_paths(self.knot_run).socket

    @property
    def lease_file(self) -> Path:
        # Where trueup's DHCP subsystem has Kea keep its memfile (trueup.system.kea).
        return self.router.state_dir / "run" / "kea-dhcp4" / "kea-leases4.csv"

    def write_leases(self, *rows: str) -> None:
        self.lease_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.lease_file.write_text("\n".join([HEADER, *rows]) + "\n")

    def dig(self, name: str, rtype: str = "A", ns: str | None = None) -> list[str]:
        argv = ["kdig", "+short", "+time=2", "+retry=0", "@203.0.113.1", name, rtype]
        where = ns or self.router.name
        proc = sh("ip", "netns", "exec", where, *argv, check=False)
        return sorted(line for line in proc.stdout.splitlines() if line and ";;" not in line)

    def knotc(self, *args: str, input: str | None = None) -> str:
        proc = subprocess.run(
            ["knotc", "-s", str(self.socket), *args],
            input=input, capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        assert proc.returncode == 0 and "error" not in proc.stdout, proc.stdout + proc.stderr
        return proc.stdout

    def daemon_pid(self, name: str) -> int | None:
        try:
            record = json.loads((self.router.state_dir / "run" / name / f"{name}.pid").read_text())
        except (OSError, ValueError):
            return None
        return verified_pid(record)

    def kill_daemons(self) -> None:
        """SIGKILL every daemon the agent started, by the verified pid of its record."""
        for record in self.router.state_dir.glob("run/*/*.pid"):
            try:
                pid = verified_pid(json.loads(record.read_text()))
            except (OSError, ValueError):
                continue
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                deadline = time.monotonic() + 60
                while verified_pid(json.loads(record.read_text())) and time.monotonic() < deadline:
                    time.sleep(0.05)

    def close(self) -> None:
        self.router.stop_agents(signal.SIGKILL)
        self.kill_daemons()
        if self.clientns is not None:
            sh("ip", "netns", "del", self.clientns, check=False)


@pytest.fixture
def dns_router(tmp_path: Path) -> Iterator[DnsRouter]:
    require_root()
    router = Router(tmp_path, client=True)
    dns = DnsRouter(router)
    try:
        yield dns
    finally:
        dns.close()
        router.close()


def wait_dig(dns: DnsRouter, name: str, rtype: str, want: list[str], timeout: float = 90.0) -> None:
    dns.router.wait_for(
        lambda: dns.dig(name, rtype) == want, what=f"{name} {rtype} → {want}", timeout=timeout
    )


def test_static_records_are_answered_and_an_edit_through_knotc_is_healed(
    dns_router: DnsRouter,
) -> None:
    router = dns_router.router
    applied = router.trueup("apply", str(router.write("dns.yaml", dns_document())))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert dns_router.dig("router.lan.test") == ["203.0.113.1"]
    assert dns_router.dig("router.lan.test", "AAAA") == ["2001:db8:1::1"]
    assert dns_router.dig("www.lan.test", "CNAME") == ["router.lan.test."]
    assert dns_router.dig("lan.test", "MX") == ["10 router.lan.test."]
    assert dns_router.dig("lan.test", "TXT") == ['"v=spf1 -all \\"quoted\\""']
    assert dns_router.dig("_sip._udp.lan.test", "SRV") == ["10 5 5060 router.lan.test."]
    assert dns_router.dig("1.113.0.203.in-addr.arpa", "PTR") == ["router.lan.test."]
    # The daemon's files are the agent's alone.
    assert dns_router.knot_run.stat().st_mode & 0o777 == 0o700
    zone_file = dns_router.knot_run / "zones" / "lan.test.zone"
    assert zone_file.stat().st_mode & 0o777 == 0o600
    assert router.trueup("drift").returncode == 0

    router.start_agent()
    # Behind trueup's back: a static record replaced and one added, in one transaction.
    dns_router.knotc("zone-begin", "lan.test.")
    dns_router.knotc("zone-unset", "lan.test.", "router", "A", "203.0.113.1")
    dns_router.knotc("zone-set", "lan.test.", "router", "300", "A", "192.0.2.66")
    dns_router.knotc("zone-set", "lan.test.", "intruder", "300", "A", "192.0.2.67")
    dns_router.knotc("zone-commit", "lan.test.")
    assert dns_router.dig("router.lan.test") == ["192.0.2.66"]

    def heals() -> list[dict[str, Any]]:
        lines = (router.state_dir / "audit.jsonl").read_text().splitlines()
        return [
            r["details"]
            for r in map(json.loads, lines)
            if r["event"] == "reconcile" and r["details"].get("subsystem") == "dns"
        ]

    router.wait_for(lambda: bool(heals()), what="the heal audited", timeout=40)
    assert heals()[0]["outcome"] == "healed"
    assert "spec.dns.zones[lan.test.].records" in heals()[0]["paths"]
    assert dns_router.dig("router.lan.test") == ["203.0.113.1"]
    assert dns_router.dig("intruder.lan.test") == []

    # The zone file Knot starts from, edited by hand: drift, written back.
    zone_file.write_text(zone_file.read_text() + "evil.lan.test. 300 IN A 192.0.2.68\n")
    router.wait_for(
        lambda: "evil" not in zone_file.read_text(), what="zone file healed", timeout=40
    )
    assert zone_file.stat().st_mode & 0o777 == 0o600


def test_lease_records_are_seeded_with_kea_stopped_and_follow_the_lease_file(
    dns_router: DnsRouter,
) -> None:
    router = dns_router.router
    dns_router.write_leases(
        lease_row("203.0.113.120", "laptop", mac="02:00:00:00:00:20"),
        lease_row("203.0.113.121", "router", mac="02:00:00:00:00:21"),  # static name: not taken
        lease_row("203.0.113.122", "gone", valid=0, mac="02:00:00:00:00:22"),  # released
    )
    before = dns_router.lease_file.read_bytes()
    config = router.write("dns.yaml", dns_document(leases={"ttl": 60}))
    router.start_agent("--config", str(config))
    wait_dig(dns_router, "laptop.lan.test", "A", ["203.0.113.120"])
    assert dns_router.dig("120.113.0.203.in-addr.arpa", "PTR") == ["laptop.lan.test."]
    assert dns_router.dig("router.lan.test") == ["203.0.113.1"]
    assert dns_router.dig("gone.lan.test") == []
    assert dns_router.daemon_pid("kea-dhcp4") is None  # Kea was never started
    assert dns_router.lease_file.read_bytes() == before  # and its file never written
    assert router.api("/v1/health/services")["subsystems"]["dns"]["health"] == "ok"

    # Kea appends rows as leases change: the records follow.
    with dns_router.lease_file.open("a") as leases:
        leases.write(lease_row("203.0.113.130", "phone", mac="02:00:00:00:00:30") + "\n")
        leases.write(lease_row("203.0.113.120", "laptop", valid=0, mac="02:00:00:00:00:20") + "\n")
    wait_dig(dns_router, "phone.lan.test", "A", ["203.0.113.130"])
    wait_dig(dns_router, "laptop.lan.test", "A", [])
    assert dns_router.dig("120.113.0.203.in-addr.arpa", "PTR") == []
    # The zone follows first; the drift record follows at the loop's next look.
    router.wait_for(lambda: router.trueup("drift").returncode == 0, what="no drift after the rows")


def test_a_broken_lease_file_fails_dns_alone_and_management_stays_reachable(
    dns_router: DnsRouter,
) -> None:
    router = dns_router.router
    dns_router.lease_file.parent.mkdir(parents=True, mode=0o700)
    dns_router.lease_file.write_text("this is not,a lease file\n203.0.113.9,x\n")
    config = router.write("dns.yaml", dns_document(leases={}))
    router.start_agent("--config", str(config), wait_started=False)
    status, body = router.from_client(f"{MGMT_URL}/v1/health/management")
    assert status == 200 and body["ready"] is True
    router.wait_for(
        lambda: router.api("/v1/health/services")["subsystems"]["dns"]["health"] == "failed",
        what="dns failed in /v1/health/services",
        timeout=40,
    )
    services = router.api("/v1/health/services")["subsystems"]
    assert "seeding from the leases failed" in services["dns"]["reason"]
    assert "not a Kea lease file" in services["dns"]["reason"]
    assert services["addresses"]["health"] == "ok" and services["management"]["health"] == "ok"
    # Static records are served all the same; only the lease records are missing.
    assert dns_router.dig("router.lan.test") == ["203.0.113.1"]
    status, body = router.from_client(f"{MGMT_URL}/v1/health/management")
    assert status == 200 and body["ready"] is True


def test_end_to_end_a_dhcp_client_s_name_resolves_and_is_seeded_again_with_kea_stopped(
    dns_router: DnsRouter,
) -> None:
    router = dns_router.router
    # The LAN peer in a namespace of its own: the DHCP client.
    dns_router.clientns = f"{router.name}-d"
    sh("ip", "netns", "add", dns_router.clientns)
    router.ip("link", "set", "lan0p", "netns", dns_router.clientns)
    sh("ip", "-n", dns_router.clientns, "link", "set", "lo", "up")
    sh("ip", "-n", dns_router.clientns, "link", "set", "lan0p", "up")
    dhcp = {
        "interfaces": ["lan0"],
        "subnets": [
            {
                "id": 1,
                "subnet": "203.0.113.0/24",
                "pools": ["203.0.113.100-203.0.113.150"],
                "options": {"routers": "203.0.113.1"},
            }
        ],
    }
    with_dhcp = router.write("dhcp.yaml", dns_document(leases={"ttl": 60}, dhcp=dhcp))
    router.start_agent("--config", str(with_dhcp))
    router.wait_for(
        lambda: dns_router.daemon_pid("kea-dhcp4") is not None, what="kea started", timeout=30
    )
    proc = subprocess.run(
        [
            "ip", "netns", "exec", dns_router.clientns,
            "udhcpc", "-i", "lan0p", "-n", "-q", "-f", "-t", "5", "-T", "2",
            "-s", "/bin/true", "-x", "hostname:dhcp-client",
        ],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    offered = [
        line.split("lease of", 1)[1].split()[0]
        for line in (proc.stdout + proc.stderr).splitlines()
        if "lease of" in line and "obtained" in line
    ]
    assert offered and offered[0].startswith("203.0.113."), proc.stdout + proc.stderr
    address = offered[0]
    wait_dig(dns_router, "dhcp-client.lan.test", "A", [address])
    pointer = ".".join(reversed(address.split("."))) + ".in-addr.arpa"
    assert dns_router.dig(pointer, "PTR") == ["dhcp-client.lan.test."]

    # A reboot, in effect: the agent and every daemon gone; Kea stays stopped (the next
    # document has no DHCP), so the record can only come from the lease file.
    router.stop_agents()
    dns_router.kill_daemons()
    assert dns_router.dig("dhcp-client.lan.test") == []
    without_dhcp = router.write("nodhcp.yaml", dns_document(leases={"ttl": 60}))
    router.start_agent("--config", str(without_dhcp))
    wait_dig(dns_router, "dhcp-client.lan.test", "A", [address])
    assert dns_router.daemon_pid("kea-dhcp4") is None
    assert router.api("/v1/health/services")["subsystems"]["dns"]["health"] == "ok"
