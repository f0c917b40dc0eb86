"""The restore never holds the router hostage: real Kea, real clients, in namespaces.

* SIGKILL right after each transition that holds the fence → a DHCPDISCOVER
  flood from the client namespace gets no OFFER until the record is
  `completed` (the agent started again resumes it), and gets one after.
* The LAN link appearing late with a pending restore → the restore waits
  (shown in status), completes without a rollback, and DHCP serves after.
* A restore refused because another writer holds the device → 409 with a
  next step, the record not left `applying`, and the agent finishes it by
  itself once the writer is free (no restart).
* An archive cut short inside its lease member → config-only eligible and
  restored, full refused naming the lease member.

Every namespace and process is removed by name or PID: the namespaces by
the `Router` fixtures and `DhcpRouter`, Kea by the verified pids of its
records, agents and the flooder by their PIDs.
"""

from __future__ import annotations

import json
import os
import signal
import tarfile
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.test_dhcp import (  # noqa: F401  (the fixture)
    DhcpRouter,
    dhcp_document,
    dhcp_router,
    digest,
    wait_until,
)
from tests.integration.test_dhcp_fence_flood import (  # noqa: F401  (the fixture)
    ACK,
    OFFER,
    PER_KEA,
    POOL,
    Flooder,
    fenced_router,
)
from tests.routers import sh
from trueup.journal.restore import BOOT_ID_ENV
from trueup.journal.state import StateDir

WAIT = 120.0  # a generous bound on a loaded 2-core machine, for each event waited for
pytestmark = pytest.mark.timeout(900)

# The transitions after which the record says the fence is held (`analyzed` is written
# before the fence is taken: Kea still serves then, and nothing says otherwise).
FENCED = ["fenced", "staged", "awaiting_restart", "applying", "verifying"]


def _record(dhcp: DhcpRouter) -> dict[str, Any]:
    path = dhcp.router.state_dir / "restore" / "restore.json"
    return dict(json.loads(path.read_text())) if path.exists() else {}


def _fence(dhcp: DhcpRouter) -> dict[str, Any] | None:
    path = dhcp.router.state_dir / "fences" / "dhcp.json"
    return dict(json.loads(path.read_text())) if path.exists() else None


def _backed_up(dhcp: DhcpRouter, archive: Path, *, leases: bool = False) -> None:
    """The router serving a client, backed up, then another DHCP configuration applied."""
    router = dhcp.router
    router.start_agent("--config", str(router.write("doc.yaml", dhcp_document())))
    assert dhcp.udhcpc() is not None
    made = router.trueup(
        "backup", "create", "--out", str(archive), *(["--with-leases"] if leases else [])
    )
    assert made.returncode == 0, made.stdout + made.stderr
    other = router.write("other.yaml", dhcp_document(lifetimes={"valid": 1800}))
    applied = router.trueup("apply", str(other))
    assert applied.returncode == 0, applied.stdout + applied.stderr


def _at(history_entry: dict[str, Any]) -> float:
    return datetime.fromisoformat(str(history_entry["at"])).timestamp()


@pytest.mark.parametrize("killed_at", FENCED)
def test_sigkill_after_a_fenced_transition_no_offer_until_completed_then_one(
    fenced_router: DhcpRouter,  # noqa: F811
    tmp_path: Path,
    killed_at: str,
) -> None:
    dhcp = fenced_router
    router = dhcp.router
    archive = tmp_path / "edge-01.tar"
    _backed_up(dhcp, archive)
    router.stop_agents()  # the agent goes; Kea (which outlives it) keeps serving
    kea = dhcp.kea_pid()
    assert kea is not None
    killed = router.trueup(
        "restore",
        "apply",
        str(archive),
        "--mode",
        "config-only",
        env={"TRUEUP_FAULT": f"restore:{killed_at}"},
        timeout=WAIT,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    assert _record(dhcp)["state"] == killed_at
    assert _fence(dhcp) is not None
    assert dhcp.kea_pid() == kea, "the Kea that outlived the agent is still running"

    flooder = Flooder(dhcp, tmp_path / "flood.json")
    try:
        # The agent is down and the record says fenced: Kea must drop everything.
        flooder.wait_sent(PER_KEA, "DISCOVERs while the agent is down")
        assert flooder.answered() == 0, flooder.counts()
        router.start_agent(wait_started=False)  # resumes the restore after management
        wait_until(lambda: _record(dhcp).get("state") == "completed", "restore completed", WAIT)
        wait_until(lambda: _fence(dhcp) is None, "the fence lifted", WAIT)
        wait_until(lambda: flooder.answered() > 0, "an OFFER after completed", WAIT)
        result = flooder.finish()
    finally:
        flooder.kill()

    record = _record(dhcp)
    completed = next(h for h in record["history"] if h["state"] == "completed" and "at" in h)
    answers = [a for a in result["answers"] if a["type"] in (OFFER, ACK)]
    early = [a for a in answers if a["at"] < _at(completed)]
    assert early == [], f"{len(early)} answer(s) before `completed`: {early[:5]}"
    assert any(a["type"] == OFFER and a["yiaddr"] in POOL for a in answers)
    assert any(h.get("note") == "resumed (same boot)" for h in record["history"])


def _rebuild_without_lan0(dhcp: DhcpRouter) -> None:
    """A reboot: the router's namespace made again by name with mgmt0 only (lan0 comes late)."""
    router = dhcp.router
    sh("ip", "netns", "del", router.name)

    def gone() -> bool:  # the kernel frees a deleted namespace (and its veth peers) later
        shown = sh("ip", "-n", dhcp.clientns, "link", "show", "lan0p", check=False)
        return shown.returncode != 0

    wait_until(gone, "the old namespace's links gone", WAIT)
    sh("ip", "netns", "add", router.name)
    router.ip("link", "set", "lo", "up")
    router.ip("link", "add", "mgmt0", "type", "veth", "peer", "name", "mgmt0p")
    router.ip("link", "set", "mgmt0p", "up")


def _add_lan0(dhcp: DhcpRouter) -> None:
    router = dhcp.router
    router.ip("link", "add", "lan0", "type", "veth", "peer", "name", "lan0p")
    router.ip("link", "set", "lan0p", "netns", dhcp.clientns)
    sh("ip", "-n", dhcp.clientns, "link", "set", "lan0p", "up")


def test_a_lan_link_appearing_late_is_waited_for_and_the_restore_completes(
    dhcp_router: DhcpRouter,  # noqa: F811
    tmp_path: Path,
) -> None:
    dhcp = dhcp_router
    router = dhcp.router
    boot = tmp_path / "boot_id"
    boot.write_text("11111111-1111-1111-1111-111111111111\n")
    env = {BOOT_ID_ENV: str(boot)}
    archive = tmp_path / "edge-01.tar"
    _backed_up(dhcp, archive)
    router.stop_agents()
    router.start_agent(env=env)
    waiting = router.trueup(
        "restore", "apply", str(archive), "--mode", "config-only", "--reboot", env=env
    )
    assert waiting.returncode == 0, waiting.stdout + waiting.stderr
    assert _record(dhcp)["state"] == "awaiting_restart"
    # The reboot: every process gone, the namespace rebuilt without lan0, a new boot ID.
    router.stop_agents(signal.SIGKILL)
    kea = dhcp.kea_pid()
    assert kea is not None
    os.kill(kea, signal.SIGKILL)
    wait_until(lambda: dhcp.kea_pid() is None, "Kea gone with the reboot", WAIT)
    _rebuild_without_lan0(dhcp)
    boot.write_text("22222222-2222-2222-2222-222222222222\n")
    router.start_agent(env=env, wait_started=False)

    def shows_the_wait() -> bool:
        restore = router.api("/v1/status").get("restore") or {}
        return (restore.get("waiting") or {}).get("links") == ["lan0"]

    wait_until(shows_the_wait, "status showing the wait for lan0", WAIT)
    shown = router.trueup("status")
    assert "waiting for links lan0 (since" in shown.stdout, shown.stdout
    assert router.api("/v1/health/management")["ready"] is True
    assert _record(dhcp)["state"] == "awaiting_restart", "waited for, not rolled back"
    assert _fence(dhcp) is not None
    _add_lan0(dhcp)
    wait_until(lambda: _record(dhcp).get("state") == "completed", "restore completed", WAIT)
    record = _record(dhcp)
    states = [h["state"] for h in record["history"]]
    assert "rolled_back" not in states and "waiting" not in record, record
    assert any("lan0 appeared" in note for note in record.get("notes", [])), record
    assert _fence(dhcp) is None
    wait_until(lambda: dhcp.udhcpc() in POOL, "a lease from Kea after the restore", WAIT)


def test_a_restore_refused_while_the_writer_is_busy_is_finished_by_the_agent_itself(
    dhcp_router: DhcpRouter,  # noqa: F811
    tmp_path: Path,
) -> None:
    dhcp = dhcp_router
    router = dhcp.router
    archive = tmp_path / "edge-01.tar"
    _backed_up(dhcp, archive)
    body = {"archive": str(archive), "mode": "config-only", "mappings": {}, "actor": "test"}
    sock = str(router.state_dir / "agent.sock")
    # Another writer holds the device (the lock every apply, rollback and restore takes).
    with StateDir(router.state_dir).writer_lock("apply", 0.0):
        with httpx.Client(
            transport=httpx.HTTPTransport(uds=sock), base_url="http://agent", timeout=WAIT
        ) as client:
            answer = client.post("/v1/restore/apply", json=body)
        assert answer.status_code == 409, answer.text
        refusal = answer.json()
        assert "writer" in refusal["message"] and "by itself" in refusal["message"]
        assert refusal["next"] and refusal["restore"]["state"] == "awaiting_restart"
        record = _record(dhcp)
        assert record["state"] == "awaiting_restart", "never left `applying` with nobody on it"
        assert _fence(dhcp) is not None

        def retry_shown() -> bool:
            restore = router.api("/v1/status").get("restore") or {}
            return bool(restore.get("retry")) and "retries by itself" in str(restore.get("next"))

        wait_until(retry_shown, "the agent's next retry in status", WAIT)
    # The writer is free: the agent finishes the restore by itself, no restart, no command.
    wait_until(lambda: _record(dhcp).get("state") == "completed", "restore completed", WAIT)
    assert _fence(dhcp) is None
    assert len(router.agents) == 1 and router.agents[0].poll() is None, "the same agent"
    wait_until(lambda: dhcp.udhcpc() in POOL, "a lease after the restore", WAIT)


def test_an_archive_cut_short_inside_its_lease_member_restores_config_only(
    dhcp_router: DhcpRouter,  # noqa: F811
    tmp_path: Path,
) -> None:
    dhcp = dhcp_router
    router = dhcp.router
    archive = tmp_path / "edge-01.tar"
    _backed_up(dhcp, archive, leases=True)
    lease_member = "native/dhcp-leases/kea-leases4.csv"
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        member = tar.getmember(lease_member)
    assert names[-1] == lease_member and member.size > 2
    data = archive.read_bytes()
    archive.write_bytes(data[: member.offset_data + member.size // 2])  # a transfer cut short

    analysed = router.trueup("restore", "analyze", str(archive), "-o", "json")
    assert analysed.returncode == 0, analysed.stdout + analysed.stderr
    body = json.loads(analysed.stdout)
    assert body["eligible"] == {"config-only": True, "full": False}, body["problems"]
    assert [(p["entry"], p["code"]) for p in body["refusals"]["full"]] == [
        (lease_member, "truncated")
    ]
    assert body["refusals"]["config-only"] == []

    before = digest(dhcp.leases)
    full = router.trueup("restore", "apply", str(archive), "--mode", "full")
    assert full.returncode == 1 and lease_member in full.stderr, full.stdout + full.stderr
    assert _record(dhcp) == {} and _fence(dhcp) is None, "a refused restore changes nothing"
    done = router.trueup("restore", "apply", str(archive), "--mode", "config-only", "-o", "json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["state"] == "completed"
    assert digest(dhcp.leases) == before, "config-only never touches the lease file"
    assert _fence(dhcp) is None
