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
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.routers import Router, base_document, require_root, sh
from trueup.system.daemon import verified_pid
from trueup.system.kealeases import kea_command, leases_from_memfile

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


def wait_until(predicate: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
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
        return self.run / "kea4.sock"

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
