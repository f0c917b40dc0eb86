"""`backup create --with-leases` then `restore analyze`, on a real router namespace with real Kea."""

from __future__ import annotations

import json
import os
import signal
import tarfile
from pathlib import Path

from tests.integration.test_dhcp import (  # noqa: F401  (the fixture)
    DhcpRouter,
    dhcp_document,
    dhcp_router,
    digest,
    wait_until,
)


def _analyze(dhcp: DhcpRouter, archive: Path) -> tuple[int, dict[str, object]]:
    result = dhcp.router.trueup("restore", "analyze", str(archive), "-o", "json")
    return result.returncode, json.loads(result.stdout)


def test_backup_with_leases_from_running_and_stopped_kea_analyses_eligible(
    dhcp_router: DhcpRouter,  # noqa: F811
    tmp_path: Path,
) -> None:
    router = dhcp_router.router
    config = router.write("doc.yaml", dhcp_document())
    router.start_agent("--config", str(config))
    address = dhcp_router.udhcpc()
    assert address is not None
    before = digest(dhcp_router.leases)

    running = tmp_path / "running.tar"
    made = router.trueup("backup", "create", "--out", str(running), "--with-leases")
    assert made.returncode == 0, made.stdout + made.stderr
    assert running.stat().st_mode & 0o777 == 0o600
    with tarfile.open(running) as tar:
        csv = tar.extractfile("native/dhcp-leases/kea-leases4.csv")
        assert csv is not None and address.encode() in csv.read()
    code, body = _analyze(dhcp_router, running)
    assert code == 0, body
    assert body["eligible"] == {"config-only": True, "full": True}
    plans = body["plans"]
    assert isinstance(plans, dict) and plans["full"]["leases"]["restore"] == 1
    assert body["components"]["native/dhcp-leases"]["source"] == {"4": "socket"}  # type: ignore[index]
    assert digest(dhcp_router.leases) == before, "a backup must not touch the lease file"

    router.stop_agents()
    pid = dhcp_router.kea_pid()
    assert pid is not None
    os.kill(pid, signal.SIGTERM)
    wait_until(lambda: dhcp_router.kea_pid() is None, "Kea stopped")
    stopped = tmp_path / "stopped.tar"
    made = router.trueup("backup", "create", "--out", str(stopped), "--with-leases")
    assert made.returncode == 0, made.stdout + made.stderr
    code, body = _analyze(dhcp_router, stopped)
    assert code == 0 and body["eligible"] == {"config-only": True, "full": True}, body
    assert body["components"]["native/dhcp-leases"]["source"] == {"4": "memfile"}  # type: ignore[index]
    assert body["components"]["native/dhcp-leases"]["counts"] == {"4": 1}  # type: ignore[index]
    assert dhcp_router.kea_pid() is None, "a backup never starts Kea"
    assert digest(dhcp_router.leases) == before
