"""`trueup restore apply` on a real router namespace with real Kea: the journaled state machine.

Every namespace and process started here is removed by the `dhcp_router`
fixture (namespaces by name, Kea by the verified pids of its records, agents
by PID). The archive is made from a router serving a client; then the router
gets an HA-primary DHCP configuration the archive does not have (the
incident's shape) and the lease is deleted through Kea's socket, so a full
restore has something to bring back.
"""

from __future__ import annotations

import json
import os
import signal
import tarfile
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_dhcp import (  # noqa: F401  (the fixture)
    HA,
    DhcpRouter,
    dhcp_document,
    dhcp_router,
    digest,
    ha_in_kea,
    wait_until,
)
from tests.routers import Router, base_document, sh
from trueup.journal.restore import BOOT_ID_ENV
from trueup.system.kealeases import kea_command

PENDING = ["analyzed", "fenced", "staged", "awaiting_restart", "applying", "verifying"]


def _prepare(dhcp: DhcpRouter, tmp_path: Path) -> tuple[Path, str]:
    """(archive, leased address): backed up, then HA-primary applied and the lease deleted."""
    router = dhcp.router
    config = router.write("doc.yaml", dhcp_document())
    router.start_agent("--config", str(config))
    address = dhcp.udhcpc()
    assert address is not None
    archive = tmp_path / "edge-01.tar"
    made = router.trueup("backup", "create", "--out", str(archive), "--with-leases")
    assert made.returncode == 0, made.stdout + made.stderr
    ha = router.write("ha.yaml", dhcp_document(ha=HA))
    applied = router.trueup("apply", str(ha))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    wait_until(lambda: ha_in_kea(dhcp), "HA in Kea")
    deleted = kea_command(dhcp.socket, "lease4-del", {"ip-address": address})
    assert deleted["result"] == 0, deleted
    return archive, address


def _leases(dhcp: DhcpRouter) -> set[str]:
    shown = dhcp.router.trueup("dhcp", "leases", "-o", "json")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    body = json.loads(shown.stdout)
    items = body["leases"] if isinstance(body, dict) else body
    return {str(lease["address"]) for lease in items}


def _restore(dhcp: DhcpRouter) -> dict[str, Any]:
    body = dhcp.router.api("/v1/restore")
    return dict(body) if isinstance(body, dict) else {}


def _record(dhcp: DhcpRouter) -> dict[str, Any]:
    return dict(json.loads((dhcp.router.state_dir / "restore" / "restore.json").read_text()))


def _fence(dhcp: DhcpRouter) -> dict[str, Any] | None:
    path = dhcp.router.state_dir / "fences" / "dhcp.json"
    return dict(json.loads(path.read_text())) if path.exists() else None


def _rebuild_namespace(dhcp: DhcpRouter) -> None:
    """The router's namespace deleted and made again by name, its links fresh (a reboot)."""
    router = dhcp.router
    sh("ip", "netns", "del", router.name)

    def gone() -> bool:  # the kernel frees a deleted namespace (and its veth peers) later
        shown = sh("ip", "-n", dhcp.clientns, "link", "show", "lan0p", check=False)
        return shown.returncode != 0

    wait_until(gone, "the old namespace's links gone", 60)
    sh("ip", "netns", "add", router.name)
    router.ip("link", "set", "lo", "up")
    for link in ("mgmt0", "lan0"):
        router.ip("link", "add", link, "type", "veth", "peer", "name", f"{link}p")
        router.ip("link", "set", f"{link}p", "up")
    router.ip("link", "set", "lan0p", "netns", dhcp.clientns)
    sh("ip", "-n", dhcp.clientns, "link", "set", "lan0p", "up")


def _finished_like_uninterrupted(dhcp: DhcpRouter, address: str) -> None:
    router = dhcp.router
    assert _fence(dhcp) is None, "completed lifts the fence"
    wait_until(lambda: dhcp.kea_pid() is not None, "Kea running after the restore", 60)
    assert not ha_in_kea(dhcp), "the restored document has no HA"
    assert address in _leases(dhcp), "the archived lease is back"
    status = json.loads(router.trueup("status", "-o", "json").stdout)
    assert status["restore"]["state"] == "completed" and status["restore"]["pending"] is False
    assert status["management"]["ready"] is True


def test_config_only_keeps_the_lease_file_byte_identical_and_drops_ha(
    dhcp_router: DhcpRouter,  # noqa: F811
    tmp_path: Path,
) -> None:
    archive, _address = _prepare(dhcp_router, tmp_path)
    before = digest(dhcp_router.leases)
    result = dhcp_router.router.trueup(
        "restore", "apply", str(archive), "--mode", "config-only", "-o", "json"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    record = json.loads(result.stdout)
    assert record["state"] == "completed", record
    assert [h["state"] for h in record["history"]] == [*PENDING, "completed"]
    assert not ha_in_kea(dhcp_router)
    assert digest(dhcp_router.leases) == before, "config-only never touches the lease file"
    assert _fence(dhcp_router) is None
    assert _restore(dhcp_router)["state"] == "completed"
    shown = dhcp_router.router.trueup("restore", "status")
    assert "completed" in shown.stdout and "next:" in shown.stdout


def test_full_restore_brings_the_archived_leases_back_and_a_client_renews(
    dhcp_router: DhcpRouter,  # noqa: F811
    tmp_path: Path,
) -> None:
    archive, address = _prepare(dhcp_router, tmp_path)
    assert address not in _leases(dhcp_router)
    old_pid = dhcp_router.kea_pid()
    result = dhcp_router.router.trueup(
        "restore", "apply", str(archive), "--mode", "full", "-o", "json", timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout)["state"] == "completed"
    _finished_like_uninterrupted(dhcp_router, address)
    assert dhcp_router.kea_pid() != old_pid, "Kea was stopped for the lease swap and started"
    copies = list(dhcp_router.run.glob("kea-leases4.csv.pre-restore-*"))
    assert copies, "the previous lease file is kept as a dated copy"
    lease = kea_command(dhcp_router.socket, "lease4-get", {"ip-address": address})
    assert lease["result"] == 0, lease
    assert dhcp_router.udhcpc() == address


@pytest.mark.parametrize("killed_at", [*PENDING, "completed"])
def test_sigkill_at_every_transition_then_the_agent_resumes_to_the_same_end(
    dhcp_router: DhcpRouter,  # noqa: F811
    tmp_path: Path,
    killed_at: str,
) -> None:
    router = dhcp_router.router
    archive, address = _prepare(dhcp_router, tmp_path)
    router.stop_agents()
    killed = router.trueup(
        "restore",
        "apply",
        str(archive),
        "--mode",
        "full",
        env={"TRUEUP_FAULT": f"restore:{killed_at}"},
        timeout=120,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    assert _record(dhcp_router)["state"] == killed_at
    fence = _fence(dhcp_router)
    if killed_at != "analyzed":
        assert fence is not None and fence["owner"] == "restore"
        assert archive.name in fence["reason"]
    router.start_agent()  # resumes the restore after the management tier
    wait_until(lambda: _restore(dhcp_router).get("state") == "completed", "restore done", 120)
    wait_until(lambda: _fence(dhcp_router) is None, "the fence lifted", 60)
    if killed_at != "completed":
        history = _restore(dhcp_router)["history"]
        assert any(h.get("note") == "resumed (same boot)" for h in history)
    _finished_like_uninterrupted(dhcp_router, address)


def test_reboot_resumes_from_awaiting_restart_with_management_up_throughout(
    dhcp_router: DhcpRouter,  # noqa: F811
    tmp_path: Path,
) -> None:
    router = dhcp_router.router
    boot = tmp_path / "boot_id"
    boot.write_text("11111111-1111-1111-1111-111111111111\n")
    env = {BOOT_ID_ENV: str(boot)}
    archive, address = _prepare(dhcp_router, tmp_path)
    before = digest(dhcp_router.leases)
    router.stop_agents()
    router.start_agent(env=env)
    waiting = router.trueup(
        "restore", "apply", str(archive), "--mode", "config-only", "--reboot", env=env
    )
    assert waiting.returncode == 0, waiting.stdout + waiting.stderr
    assert "awaiting_restart" in waiting.stdout and "reboot" in waiting.stdout
    # A restart within the same boot keeps waiting; management and diagnostics stay up.
    router.stop_agents(signal.SIGKILL)
    router.start_agent(env=env)
    assert _restore(dhcp_router)["state"] == "awaiting_restart"
    assert router.api("/v1/health/management")["ready"] is True
    assert _fence(dhcp_router) is not None
    assert router.api("/v1/status")["restore"]["pending"] is True
    bundle = tmp_path / "evidence.tar.gz"  # diagnostics stay available while it is pending
    collected = router.trueup("evidence", "--out", str(bundle))
    assert collected.returncode == 0, collected.stdout + collected.stderr
    with tarfile.open(bundle) as tar:
        names = tar.getnames()
    assert {"evidence/state/restore/restore.json", "evidence/state/fences/dhcp.json"} <= set(names)
    assert router.trueup("drift").returncode in (0, 2)
    # The reboot: every process gone, the namespace torn down and rebuilt, a new boot ID.
    router.stop_agents(signal.SIGKILL)
    pid = dhcp_router.kea_pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: dhcp_router.kea_pid() is None, "Kea gone with the reboot")
    _rebuild_namespace(dhcp_router)
    assert router.addresses("lan0") == [], "a fresh namespace"
    boot.write_text("22222222-2222-2222-2222-222222222222\n")
    router.start_agent(env=env)
    assert router.api("/v1/health/management")["ready"] is True
    wait_until(lambda: _restore(dhcp_router).get("state") == "completed", "restore done", 120)
    notes = [h.get("note", "") for h in _restore(dhcp_router)["history"]]
    assert any("reboot" in note for note in notes), notes
    assert _fence(dhcp_router) is None
    wait_until(lambda: dhcp_router.kea_pid() is not None, "Kea started after the reboot", 60)
    assert not ha_in_kea(dhcp_router)
    assert digest(dhcp_router.leases) == before, "config-only: leases unchanged"
    del address


def test_an_archive_from_a_router_with_other_interface_names_needs_map(
    dhcp_router: DhcpRouter,  # noqa: F811
    tmp_path: Path,
) -> None:
    (tmp_path / "other").mkdir()
    other = Router(tmp_path / "other", links=("mgmt0", "lan1"))
    try:
        document = base_document()
        document["spec"]["interfaces"][0]["name"] = "lan1"
        applied = other.trueup("apply", str(other.write("doc.yaml", document)))
        assert applied.returncode == 0, applied.stdout + applied.stderr
        archive = tmp_path / "other.tar"
        made = other.trueup("backup", "create", "--out", str(archive))
        assert made.returncode == 0, made.stdout + made.stderr
    finally:
        other.close()
    router = dhcp_router.router
    router.start_agent("--config", str(router.write("doc.yaml", dhcp_document())))
    analysed = router.api(
        "/v1/restore/analyze", "POST", json={"archive": str(archive), "mappings": {}}
    )
    assert analysed["eligible"]["config-only"] is False
    assert {p["code"] for p in analysed["problems"]} == {"interface_missing"}
    refused = router.trueup("restore", "apply", str(archive), "--mode", "config-only")
    assert refused.returncode == 1 and "--map lan1=NEW" in refused.stderr, refused.stderr
    assert router.api("/v1/restore") == {"restore": None}, "a refused restore leaves no record"
    assert _fence(dhcp_router) is None
    mapped = router.trueup(
        "restore", "apply", str(archive), "--mode", "config-only", "--map", "lan1=lan0"
    )
    assert mapped.returncode == 0, mapped.stdout + mapped.stderr
    assert "completed" in mapped.stdout
    assert router.link("lan0")["mtu"] == 1400
    assert "203.0.113.1/24" in router.addresses("lan0")


def test_a_config_only_restore_leaves_no_local_override_anywhere(
    router: Router, tmp_path: Path
) -> None:
    from trueup.journal.state import StateDir
    from trueup.reconcile.changes import CONTROL_PLANE_FILE

    desired = router.write("desired.yaml", base_document())
    assert router.trueup("apply", str(desired)).returncode == 0
    archive = tmp_path / "edge-01.tar"
    made = router.trueup("backup", "create", "--out", str(archive))
    assert made.returncode == 0, made.stdout + made.stderr
    # Managed by a control plane (as the agent records it when it syncs with one).
    StateDir(router.state_dir).write(
        CONTROL_PLANE_FILE, {"url": "https://cp.example.invalid", "version": 1}
    )
    router.start_agent()
    lab = router.write("lab.yaml", base_document(routes=[]))
    overridden = router.trueup("apply", str(lab), "--override", "lab test")
    assert overridden.returncode == 0, overridden.stdout + overridden.stderr
    assert router.api("/v1/status")["versions"]["override"]["reason"] == "lab test"

    result = router.trueup("restore", "apply", str(archive), "--mode", "config-only", "-o", "json")
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout)["state"] == "completed", result.stdout
    applied = json.loads((router.state_dir / "applied.json").read_text())
    assert applied["origin"] == "restore" and applied.get("override") is None, applied
    status = json.loads(router.trueup("status", "-o", "json").stdout)
    assert status["versions"]["override"] is None and status["versions"]["origin"] == "restore"
    text = router.trueup("status").stdout
    assert "lab test" not in text and "local override" not in text, text
    assert router.routes("main") != []  # the restored revision's routes are back
