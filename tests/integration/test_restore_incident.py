"""The incident behind trueup, end to end, on real Kea and Knot in namespaces.

A router whose running Kea still holds an HA-primary configuration that the
restored document does not have, with DNS records seeded from the leases,
is restored with `--reboot`; the reboot happens in the middle (every process
killed, the boot ID changed). Throughout, the management address answers
from the operator's namespace; at the end the HA configuration is gone, the
leases are unchanged, the lease records are served again, and the fence was
lifted only at `completed`.

Every namespace and process is removed by the `dns_router` fixture (the
router, operator and DHCP client namespaces by name; agents and daemons by
PID).
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any

from tests.integration.test_dhcp import HA, SUBNET, digest, wait_until
from tests.integration.test_dns import (  # noqa: F401  (the fixture)
    MGMT_URL,
    DnsRouter,
    dns_document,
    dns_router,
    wait_dig,
)
from tests.routers import sh
from trueup.journal.restore import BOOT_ID_ENV
from trueup.system.kea import kea_paths
from trueup.system.kealeases import kea_command


def _udhcpc(clientns: str) -> str | None:
    proc = subprocess.run(
        [
            "ip", "netns", "exec", clientns,
            "udhcpc", "-i", "lan0p", "-n", "-q", "-f", "-t", "5", "-T", "2",
            "-s", "/bin/true", "-x", "hostname:dhcp-client",
        ],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    for line in (proc.stdout + proc.stderr).splitlines():
        if "lease of" in line and "obtained" in line:
            return line.split("lease of", 1)[1].split()[0]
    return None


def _ha_in_kea(dns: DnsRouter) -> bool:
    socket = kea_paths(dns.router.state_dir / "run" / "kea-dhcp4", 4).socket
    config = kea_command(socket, "config-get")["arguments"]["Dhcp4"]
    text = json.dumps(config["hooks-libraries"])
    return "libdhcp_ha" in text or "high-availability" in text


def _fence(dns: DnsRouter) -> dict[str, Any] | None:
    path = dns.router.state_dir / "fences" / "dhcp.json"
    return dict(json.loads(path.read_text())) if path.exists() else None


def _management_answers(dns: DnsRouter) -> bool:
    status, body = dns.router.from_client(f"{MGMT_URL}/v1/health/management")
    return status == 200 and body["ready"] is True


def test_incident_ha_primary_dns_seeding_and_a_reboot_in_the_middle(
    dns_router: DnsRouter,  # noqa: F811
    tmp_path: Path,
) -> None:
    router = dns_router.router
    boot = tmp_path / "boot_id"
    boot.write_text("11111111-1111-1111-1111-111111111111\n")
    env = {BOOT_ID_ENV: str(boot)}
    dns_router.clientns = f"{router.name}-d"
    sh("ip", "netns", "add", dns_router.clientns)
    router.ip("link", "set", "lan0p", "netns", dns_router.clientns)
    sh("ip", "-n", dns_router.clientns, "link", "set", "lo", "up")
    sh("ip", "-n", dns_router.clientns, "link", "set", "lan0p", "up")
    dhcp = {"interfaces": ["lan0"], "subnets": [SUBNET]}

    # The router as it was backed up: DHCP without HA, DNS seeded from the leases.
    plain = router.write("plain.yaml", dns_document(leases={"ttl": 60}, dhcp=dhcp))
    router.start_agent("--config", str(plain), env=env)
    wait_until(lambda: dns_router.daemon_pid("kea-dhcp4") is not None, "Kea started")
    address = _udhcpc(dns_router.clientns)
    assert address is not None
    wait_dig(dns_router, "dhcp-client.lan.test", "A", [address])
    archive = tmp_path / "edge-01.tar"
    made = router.trueup("backup", "create", "--out", str(archive), "--with-leases", env=env)
    assert made.returncode == 0, made.stdout + made.stderr

    # Then Kea got an HA-primary configuration the archive does not have.
    ha = router.write("ha.yaml", dns_document(leases={"ttl": 60}, dhcp={**dhcp, "ha": HA}))
    applied = router.trueup("apply", str(ha), env=env)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    wait_until(lambda: _ha_in_kea(dns_router), "HA in Kea")
    lease_file = router.state_dir / "run" / "kea-dhcp4" / "kea-leases4.csv"
    before = digest(lease_file)

    waiting = router.trueup(
        "restore", "apply", str(archive), "--mode", "config-only", "--reboot", env=env
    )
    assert waiting.returncode == 0, waiting.stdout + waiting.stderr
    assert "awaiting_restart" in waiting.stdout
    assert _management_answers(dns_router)
    assert _fence(dns_router) is not None

    # The reboot: agent and daemons killed, a new boot ID; the agent starts again.
    router.stop_agents(signal.SIGKILL)
    dns_router.kill_daemons()
    boot.write_text("22222222-2222-2222-2222-222222222222\n")
    router.start_agent(env=env, wait_started=False)
    assert _management_answers(dns_router), "management within the startup goal"

    def done() -> bool:
        assert _management_answers(dns_router), "management reachable throughout"
        fence = _fence(dns_router)  # read before the state: a lifted fence means completed
        state = router.api("/v1/restore").get("state")
        if fence is None:
            assert state == "completed", f"the fence was lifted in {state}"
        return state == "completed" and fence is None

    wait_until(done, "the restore completed after the reboot", timeout=120)
    record = router.api("/v1/restore")
    assert any("reboot" in h.get("note", "") for h in record["history"]), record["history"]
    wait_until(lambda: dns_router.daemon_pid("kea-dhcp4") is not None, "Kea back", 60)
    wait_until(lambda: not _ha_in_kea(dns_router), "HA configuration gone", 60)
    assert digest(lease_file) == before, "the leases are unchanged"
    socket = kea_paths(router.state_dir / "run" / "kea-dhcp4", 4).socket
    lease = kea_command(socket, "lease4-get", {"ip-address": address})
    assert lease["result"] == 0, lease
    wait_dig(dns_router, "dhcp-client.lan.test", "A", [address])
    assert _management_answers(dns_router)
