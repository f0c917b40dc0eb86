"""DHCP on real daemons: the agent's Kea serves a `udhcpc` client in another namespace.

Every namespace and process started here is removed by name or PID: the
router and client namespaces by the `Router` fixture, the DHCP client's
namespace and the Kea processes (by the verified pids of their records) by
`dhcp_router`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.routers import Router, base_document, require_root, sh
from trueup.system.kea import kea_paths
from trueup.system.kealeases import kea_command, leases_from_memfile
from trueup.system.pidrecord import verified_pid

SUBNET = {
    "id": 1,
    "subnet": "203.0.113.0/24",
    "pools": ["203.0.113.100-203.0.113.150"],
    "options": {"routers": "203.0.113.1"},
}
HA = {
    "this-server": "edge-01",
    "mode": "hot-standby",
    "peers": [
        {"name": "edge-01", "url": "http://203.0.113.1:8000/", "role": "primary"},
        {"name": "edge-02", "url": "http://203.0.113.2:8000/", "role": "standby"},
    ],
}


def dhcp_document(**dhcp: Any) -> dict[str, Any]:
    section: dict[str, Any] = {"interfaces": ["lan0"], "subnets": [SUBNET]}
    section.update(dhcp)
    document = base_document(dhcp=section)
    document["spec"]["interfaces"] = [{"name": "lan0", "addresses": ["203.0.113.1/24"]}]
    document["spec"]["routes"] = []
    document["spec"]["tables"] = {}
    return document


def wait_until(predicate: Callable[[], Any], what: str, timeout: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


class DhcpRouter:
    """A router whose lan0 peer sits in a DHCP client namespace."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.clientns = f"{router.name}-d"
        sh("ip", "netns", "add", self.clientns)
        router.ip("link", "set", "lan0p", "netns", self.clientns)
        sh("ip", "-n", self.clientns, "link", "set", "lo", "up")
        sh("ip", "-n", self.clientns, "link", "set", "lan0p", "up")

    @property
    def run(self) -> Path:
        return self.router.state_dir / "run" / "kea-dhcp4"

    @property
    def leases(self) -> Path:
        return self.run / "kea-leases4.csv"

    @property
    def socket(self) -> Path:
        return kea_paths(self.run, 4).socket

    def kea_pid(self) -> int | None:
        try:
            return verified_pid(json.loads((self.run / "kea-dhcp4.pid").read_text()))
        except (OSError, ValueError):
            return None

    def udhcpc(self, timeout: int = 3, tries: int = 2) -> str | None:
        """One DHCP exchange from the client namespace: the offered address, or None."""
        proc = subprocess.run(
            [
                "ip", "netns", "exec", self.clientns,
                "udhcpc", "-i", "lan0p", "-n", "-q", "-f",
                "-t", str(tries), "-T", str(timeout), "-s", "/bin/true",
                "-x", "hostname:dhcp-client",
            ],
            capture_output=True,
            text=True,
            timeout=timeout * tries + 30,
            check=False,
        )  # fmt: skip
        for line in (proc.stdout + proc.stderr).splitlines():
            if "lease of" in line and "obtained" in line:
                return line.split("lease of", 1)[1].split()[0]
        return None

    def close(self) -> None:
        for record in self.router.state_dir.glob("run/*/*.pid"):
            try:
                pid = verified_pid(json.loads(record.read_text()))
            except (OSError, ValueError):
                continue
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
        sh("ip", "netns", "del", self.clientns, check=False)
        socket_dir = kea_paths(self.run, 4).socket.parent
        if socket_dir != self.run:  # a long run directory's socket lives under /run/trueup
            shutil.rmtree(socket_dir, ignore_errors=True)


@pytest.fixture
def dhcp_router(tmp_path: Path) -> Iterator[DhcpRouter]:
    require_root()
    router = Router(tmp_path, client=True)
    dhcp = None
    try:
        dhcp = DhcpRouter(router)
        yield dhcp
    finally:
        if dhcp is not None:
            dhcp.close()
        router.close()


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_client_gets_a_lease_from_the_agent_s_kea(dhcp_router: DhcpRouter) -> None:
    router = dhcp_router.router
    path = router.write("doc.yaml", dhcp_document())
    result = router.trueup("apply", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert dhcp_router.kea_pid() is not None
    assert dhcp_router.run.stat().st_mode & 0o777 == 0o700
    address = dhcp_router.udhcpc()
    assert address is not None and address.startswith("203.0.113.")
    leases = list(leases_from_memfile(4, dhcp_router.leases))
    assert [lease.address for lease in leases] == [address]


def status_of(router: Router) -> dict[str, Any]:
    result = router.trueup("status", "-o", "json")
    assert result.returncode in (0, 2), result.stdout + result.stderr
    return dict(json.loads(result.stdout))


def test_the_fence_stops_allocation_survives_a_killed_agent_and_lifts(
    dhcp_router: DhcpRouter,
) -> None:
    router = dhcp_router.router
    config = router.write("doc.yaml", dhcp_document())
    held = router.trueup("dhcp", "fence", "hold", "--reason", "restore in progress")
    assert held.returncode == 0, held.stderr
    router.start_agent("--config", str(config))
    pid = wait_until(dhcp_router.kea_pid, "Kea started by the agent")
    assert dhcp_router.udhcpc() is None  # fenced: no lease within the client's timeout
    services = router.api("/v1/health/services")["subsystems"]
    assert services["dhcp"]["health"] == "fenced"
    assert "restore in progress" in services["dhcp"]["reason"]
    # The agent dies hard; the fence is a file, and a new agent adopts Kea as it is.
    router.stop_agents(signal.SIGKILL)
    router.start_agent()
    assert dhcp_router.kea_pid() == pid
    assert status_of(router)["subsystems"]["dhcp"]["health"] == "fenced"
    assert dhcp_router.udhcpc() is None
    # Kea itself restarts: the supervisor re-asserts the fence on the new process.
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: dhcp_router.kea_pid() not in (None, pid), "Kea restarted")
    assert dhcp_router.udhcpc() is None
    lifted = router.trueup("dhcp", "fence", "lift", "--reason", "restore done")
    assert lifted.returncode == 0, lifted.stderr
    assert dhcp_router.udhcpc() is not None
    audit = (router.state_dir / "audit.jsonl").read_text()
    assert '"fence_held"' in audit and '"fence_lifted"' in audit


def test_leases_are_untouched_and_read_the_same_with_kea_running_or_stopped(
    dhcp_router: DhcpRouter,
) -> None:
    router = dhcp_router.router
    config = router.write("doc.yaml", dhcp_document())
    router.start_agent("--config", str(config))
    address = dhcp_router.udhcpc()
    assert address is not None
    running = json.loads(router.trueup("dhcp", "leases", "-o", "json").stdout)
    assert running["sources"] == {"dhcp4": "socket"}
    before = digest(dhcp_router.leases)
    # An agent restart and a configuration apply leave the lease file byte-identical.
    router.stop_agents()
    router.start_agent("--config", str(config))
    changed = dhcp_document(lifetimes={"valid": 7200})
    result = router.trueup("apply", str(router.write("doc2.yaml", changed)))
    assert result.returncode == 0, result.stdout + result.stderr
    assert (
        kea_command(dhcp_router.socket, "config-get")["arguments"]["Dhcp4"]["valid-lifetime"]
        == 7200
    )
    assert digest(dhcp_router.leases) == before
    again = json.loads(router.trueup("dhcp", "leases", "-o", "json").stdout)
    assert again["leases"] == running["leases"]
    # Kea stopped: the same answer from the memfile.
    router.stop_agents()
    pid = dhcp_router.kea_pid()
    assert pid is not None
    os.kill(pid, signal.SIGTERM)
    wait_until(lambda: dhcp_router.kea_pid() is None, "Kea stopped")
    stopped = json.loads(router.trueup("dhcp", "leases", "-o", "json").stdout)
    assert stopped["sources"] == {"dhcp4": "memfile"}
    assert stopped["leases"] == running["leases"] and running["leases"][0]["address"] == address
    assert digest(dhcp_router.leases) == before
    dhcp_router.leases.write_bytes(b"")  # a zero-byte lease file is an empty source
    empty = router.trueup("dhcp", "leases", "-o", "json")
    assert empty.returncode == 0 and json.loads(empty.stdout)["leases"] == []


def ha_in_kea(dhcp_router: DhcpRouter) -> bool:
    config = kea_command(dhcp_router.socket, "config-get")["arguments"]["Dhcp4"]
    text = json.dumps(config["hooks-libraries"])
    return "libdhcp_ha" in text or "high-availability" in text


def test_a_document_without_ha_leaves_no_ha_in_kea_also_after_a_restart(
    dhcp_router: DhcpRouter,
) -> None:
    router = dhcp_router.router
    with_ha = router.write("ha.yaml", dhcp_document(ha=HA))
    result = router.trueup("apply", str(with_ha))
    assert result.returncode == 0, result.stdout + result.stderr
    assert ha_in_kea(dhcp_router)
    ha_file = dhcp_router.run / "kea-dhcp4.conf"
    old_config = ha_file.read_bytes()
    assert b"libdhcp_ha" in old_config
    without = router.write("plain.yaml", dhcp_document())
    result = router.trueup("apply", str(without))
    assert result.returncode == 0, result.stdout + result.stderr
    assert not ha_in_kea(dhcp_router)
    assert b"libdhcp_ha" not in ha_file.read_bytes()
    # Kea stops, the old HA configuration file is put back; the agent starts Kea without HA.
    pid = dhcp_router.kea_pid()
    assert pid is not None
    os.kill(pid, signal.SIGTERM)
    wait_until(lambda: dhcp_router.kea_pid() is None, "Kea stopped")
    ha_file.write_bytes(old_config)
    router.start_agent()
    wait_until(dhcp_router.kea_pid, "Kea started again")
    wait_until(lambda: dhcp_router.socket.exists(), "Kea's socket")
    wait_until(lambda: kea_command(dhcp_router.socket, "status-get")["result"] == 0, "Kea up")
    assert not ha_in_kea(dhcp_router)
    assert b"libdhcp_ha" not in ha_file.read_bytes()


def test_a_configuration_set_through_the_socket_by_someone_else_is_drift(
    dhcp_router: DhcpRouter,
) -> None:
    router = dhcp_router.router
    result = router.trueup("apply", str(router.write("doc.yaml", dhcp_document())))
    assert result.returncode == 0, result.stdout + result.stderr
    assert router.trueup("drift").returncode == 0
    config = kea_command(dhcp_router.socket, "config-get")["arguments"]
    config["Dhcp4"]["valid-lifetime"] = 60
    assert kea_command(dhcp_router.socket, "config-set", config)["result"] == 0
    drift = router.trueup("drift", "-o", "json")
    assert drift.returncode == 2, drift.stdout
    assert "spec.dhcp.dhcp4.config" in drift.stdout and "foreign:" in drift.stdout


def test_kea_that_cannot_start_never_keeps_management_away(dhcp_router: DhcpRouter) -> None:
    router = dhcp_router.router
    config = router.write("doc.yaml", dhcp_document())
    started = time.monotonic()
    # No sbin on PATH: kea-dhcp4 cannot be found, so it cannot start.
    router.start_agent("--config", str(config), env={"PATH": "/usr/bin:/bin"}, wait_started=False)
    status, body = router.from_client("http://198.51.100.2:7443/v1/health/management")
    assert status == 200 and body["ready"] is True
    assert time.monotonic() - started < 20
    router.wait_for(router.started, what="startup phases done", timeout=60)
    services = router.api("/v1/health/services")["subsystems"]
    assert services["dhcp"]["health"] == "failed", services["dhcp"]
    assert "kea-dhcp4" in services["dhcp"]["reason"]
    assert dhcp_router.kea_pid() is None


def notify_document(**dhcp: Any) -> dict[str, Any]:
    document = dhcp_document(**dhcp)
    document["spec"]["convergence"] = {"subsystems": {"dhcp": "notify"}}
    return document


def test_a_kea_that_cannot_open_its_lease_file_fails_in_its_own_words(
    dhcp_router: DhcpRouter,
) -> None:
    router = dhcp_router.router
    router.start_agent("--config", str(router.write("doc.yaml", notify_document())))
    pid = wait_until(dhcp_router.kea_pid, "Kea started by the agent")
    dhcp_router.leases.unlink()
    dhcp_router.leases.mkdir()  # Kea cannot open its lease database any more
    os.kill(pid, signal.SIGKILL)  # the supervisor starts it again; it exits at once

    def failed_reason() -> str:
        dhcp = status_of(router)["subsystems"]["dhcp"]
        return str(dhcp["reason"]) if dhcp["health"] == "failed" else ""

    reason = wait_until(lambda: "Unable to open database" in failed_reason() and failed_reason(),
                        "DHCP failed with Kea's own cause")  # fmt: skip
    assert "kea-dhcp4" in reason
    text = router.trueup("status")
    (row,) = [line for line in text.stdout.splitlines() if line.startswith("dhcp ")]
    assert "failed" in row and "Unable to open database" in row, text.stdout
    dhcp_router.leases.rmdir()


def test_under_notify_a_hand_change_through_kea_s_socket_shows_what_differs(
    dhcp_router: DhcpRouter,
) -> None:
    router = dhcp_router.router
    router.start_agent("--config", str(router.write("doc.yaml", notify_document())))
    wait_until(dhcp_router.kea_pid, "Kea started by the agent")
    router.wait_for(lambda: router.trueup("drift").returncode == 0, what="in sync")
    config = kea_command(dhcp_router.socket, "config-get")["arguments"]
    config["Dhcp4"]["subnet4"][0]["pools"][0]["pool"] = "203.0.113.100-203.0.113.200"
    config["Dhcp4"]["valid-lifetime"] = 60
    assert kea_command(dhcp_router.socket, "config-set", config)["result"] == 0
    router.wait_for(lambda: router.trueup("drift").returncode == 2, what="the drift seen")
    drift = router.trueup("drift")
    lines = drift.stdout.splitlines()
    assert (
        "  dhcp: spec.dhcp.subnets[0].pools[0]: desired 203.0.113.100-203.0.113.150 "
        "observed 203.0.113.100-203.0.113.200" in lines
    ), drift.stdout
    assert "  dhcp: spec.dhcp.lifetimes.valid: desired 3600 observed 60" in lines, drift.stdout
    # Notify: seen and reported, never set back.
    running = kea_command(dhcp_router.socket, "config-get")["arguments"]["Dhcp4"]
    assert running["subnet4"][0]["pools"][0]["pool"] == "203.0.113.100-203.0.113.200"
