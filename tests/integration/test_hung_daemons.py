"""Repair, restore and status with real daemons that misbehave, in namespaces.

A daemon that hangs (SIGSTOP) rather than failing to bind; the agent SIGKILLed
during a restore and during a late-link wait; archives damaged at other points.
Every namespace and process started here is removed by name or PID: the
namespaces by the fixtures, the daemons by the verified pids of their records
(a stopped daemon is sent SIGCONT, then SIGKILL, by that pid).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import tarfile
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_dhcp import (  # noqa: F401  (the fixture)
    DhcpRouter,
    dhcp_document,
    dhcp_router,
    digest,
)
from tests.integration.test_dhcp_fence_flood import ACK, CLIENT, OFFER, PER_KEA, Flooder
from tests.integration.test_dns import DnsRouter
from tests.integration.test_hostage import (  # noqa: F401  (the fixture)
    StatusPoller,
    dns_rig,
    hostage_document,
    timed,
    with_address,
)
from tests.integration.test_restore_hostage import _add_lan0, _rebuild_without_lan0
from tests.routers import Router, require_root, sh
from trueup.journal.restore import BOOT_ID_ENV

pytestmark = [pytest.mark.root, pytest.mark.timeout(900)]

WRITE_BOUND = 15.0


@contextlib.contextmanager
def stopped(pid: int) -> Any:
    """The process `pid` hung (SIGSTOP) for the block, continued after it."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def _record(router: Any) -> dict[str, Any]:
    path = router.state_dir / "restore" / "restore.json"
    return dict(json.loads(path.read_text())) if path.exists() else {}


def _fence(router: Any) -> dict[str, Any] | None:
    path = router.state_dir / "fences" / "dhcp.json"
    return dict(json.loads(path.read_text())) if path.exists() else None


def test_writes_and_status_while_kea_is_hung(dhcp_router: DhcpRouter, tmp_path: Path) -> None:  # noqa: F811
    dhcp = dhcp_router
    router = dhcp.router
    document = dhcp_document()
    config = router.write("doc.yaml", document)
    router.start_agent("--config", str(config))
    assert dhcp.udhcpc() is not None
    archive = tmp_path / "before.tar"
    made = router.trueup("backup", "create", "--out", str(archive))
    assert made.returncode == 0, made.stdout + made.stderr
    kea = dhcp.kea_pid()
    assert kea is not None
    timings: dict[str, float] = {}
    with stopped(kea), StatusPoller(router, ("/v1/status", "/v1/health/services")) as poller:
        atomic, timings["apply"] = timed(
            router, "apply", str(router.write("v2.yaml", with_address(document, "203.0.113.5/24")))
        )
        assert atomic.returncode == 0, atomic.stdout + atomic.stderr
        assert "203.0.113.5/24" in router.addresses("lan0")
        back, timings["rollback"] = timed(router, "rollback")
        assert back.returncode == 0, back.stdout + back.stderr
        assert "203.0.113.5/24" not in router.addresses("lan0")
        managed, timings["management set"] = timed(
            router, "management", "set", "--interface", "mgmt0",
            "--address", "198.51.100.2/24", "--gateway", "198.51.100.1",
        )  # fmt: skip
        assert managed.returncode == 0, managed.stdout + managed.stderr
        assert "writer lock bypassed" not in managed.stderr, managed.stderr
        restored, timings["restore"] = timed(
            router, "restore", "apply", str(archive), "--mode", "config-only", "-o", "json"
        )
        print(f"timings with Kea hung: {timings}")
        assert restored.returncode == 0, restored.stdout + restored.stderr
        assert json.loads(restored.stdout)["state"] in ("completed", "verifying"), restored.stdout
    print(f"timings with Kea hung: {timings}")
    poller.check()
    for what, took in timings.items():
        assert took < WRITE_BOUND + (30 if what == "restore" else 0), (what, took)
    # The hung Kea could not take the fence: it was ended, never continued unfenced.
    router.wait_for(lambda: _record(router).get("state") == "completed", what="restore completed")
    assert _fence(router) is None
    assert dhcp.kea_pid() != kea
    router.wait_for(lambda: dhcp.udhcpc() is not None, what="a lease from a fresh Kea")


def _knot_hung_writes(rig: DnsRouter, tmp_path: Path) -> dict[str, float]:
    """Apply (a zone change), rollback, `management set`, restore with Knot SIGSTOPped."""
    router = rig.router
    document = hostage_document()
    config = router.write("doc.yaml", document)
    router.start_agent("--config", str(config))
    router.wait_for(lambda: rig.dig("router.lan.test") == ["203.0.113.1"], what="knot serving")
    archive = tmp_path / "before.tar"
    made = router.trueup("backup", "create", "--out", str(archive))
    assert made.returncode == 0, made.stdout + made.stderr
    knot = rig.daemon_pid("knot")
    assert knot is not None
    timings: dict[str, float] = {}
    with stopped(knot), StatusPoller(router, ("/v1/status", "/v1/health/services")) as poller:
        # A change of the zone itself (a record added) and of an address.
        changed = with_address(document, "203.0.113.5/24")
        changed["spec"]["dns"]["records"] = [
            *changed["spec"]["dns"]["records"],
            {"name": "extra", "type": "A", "value": "203.0.113.9"},
        ]
        atomic, timings["apply"] = timed(router, "apply", str(router.write("v2.yaml", changed)))
        assert atomic.returncode == 0, atomic.stdout + atomic.stderr
        assert rig.dig("extra.lan.test") == ["203.0.113.9"]
        back, timings["rollback"] = timed(router, "rollback")
        assert back.returncode == 0, back.stdout + back.stderr
        managed, timings["management set"] = timed(
            router, "management", "set", "--interface", "mgmt0",
            "--address", "198.51.100.2/24", "--gateway", "198.51.100.1",
        )  # fmt: skip
        assert managed.returncode == 0, managed.stdout + managed.stderr
        restored, timings["restore"] = timed(
            router, "restore", "apply", str(archive), "--mode", "config-only", "-o", "json"
        )
        assert restored.returncode == 0, restored.stdout + restored.stderr
    print(f"timings with Knot hung: {timings}")
    poller.check()
    router.wait_for(lambda: rig.dig("router.lan.test") == ["203.0.113.1"], what="knot again")
    assert rig.dig("extra.lan.test") == []
    return timings


def test_writes_and_status_while_knot_is_hung(dns_rig: DnsRouter, tmp_path: Path) -> None:  # noqa: F811
    timings = _knot_hung_writes(dns_rig, tmp_path)
    for what, took in timings.items():
        assert took < 60, (what, took)


def _members(archive: Path) -> list[tarfile.TarInfo]:
    with tarfile.open(archive) as tar:
        return tar.getmembers()


def test_archives_damaged_before_or_between_their_entries(
    dhcp_router: DhcpRouter,  # noqa: F811
    tmp_path: Path,
) -> None:
    dhcp = dhcp_router
    router = dhcp.router
    router.start_agent("--config", str(router.write("doc.yaml", dhcp_document())))
    assert dhcp.udhcpc() is not None
    archive = tmp_path / "edge-01.tar"
    made = router.trueup("backup", "create", "--out", str(archive), "--with-leases")
    assert made.returncode == 0, made.stdout + made.stderr
    data = archive.read_bytes()
    members = _members(archive)
    names = [m.name for m in members]
    lease = members[-1]
    assert lease.name.startswith("native/dhcp-leases/"), names
    damaged: dict[str, tuple[bytes, str, bool]] = {}  # case → bytes, entry named, config-only ok
    for member in members[:-1]:
        if member.size < 2:
            continue
        config_ok = not member.name.startswith("config/") and member.name != "manifest.json"
        cut = data[: member.offset_data + member.size // 2]
        damaged[f"cut inside {member.name}"] = (cut, member.name, config_ok)
        if member.name != "manifest.json":
            flipped = bytearray(data)
            flipped[member.offset_data + member.size // 2] ^= 0x01
            damaged[f"a byte changed in {member.name}"] = (bytes(flipped), member.name, config_ok)
    # The manifest's own sha256 of a config entry altered: that entry no longer verifies.
    manifest = members[0]
    assert manifest.name == "manifest.json", names
    text = data[manifest.offset_data : manifest.offset_data + manifest.size]
    entry = next(e for e in json.loads(text)["entries"] if e["path"].startswith("config/"))
    at = manifest.offset_data + text.index(entry["sha256"].encode()) + 10
    flipped = bytearray(data)
    flipped[at] = ord("0") if flipped[at] != ord("0") else ord("1")
    damaged["the manifest's sha256 of a config entry altered"] = (
        bytes(flipped),
        entry["path"],
        False,
    )
    # Cut inside the lease member's tar header (before its data): the configuration is whole.
    damaged["cut inside the lease member's header"] = (data[: lease.offset + 100], lease.name, True)
    before = digest(dhcp.leases)
    outcomes: dict[str, Any] = {}
    for case, (content, entry, config_ok) in damaged.items():
        copy = tmp_path / "damaged.tar"
        copy.write_bytes(content)
        analysed = router.trueup("restore", "analyze", str(copy), "-o", "json")
        try:
            body = json.loads(analysed.stdout)
        except ValueError:
            outcomes[case] = (
                f"not JSON ({analysed.returncode}): {analysed.stdout} {analysed.stderr}"
            )
            continue
        eligible = body.get("eligible", {})
        named = entry in json.dumps(body.get("problems", [])) + json.dumps(body.get("refusals", {}))
        if eligible.get("config-only") is not config_ok or not named:
            outcomes[case] = {"eligible": eligible, "problems": body.get("problems")}
            continue
        done = router.trueup("restore", "apply", str(copy), "--mode", "config-only", "-o", "json")
        if config_ok:
            if done.returncode != 0 or json.loads(done.stdout).get("state") != "completed":
                outcomes[case] = f"config-only not restored: {done.stdout} {done.stderr}"
        elif done.returncode == 0 or entry not in done.stdout + done.stderr:
            outcomes[case] = f"config-only not refused naming {entry}: {done.stdout} {done.stderr}"
        elif _record(router) != {} or _fence(router) is not None:
            outcomes[case] = "a refused restore left a record or a fence"
        (router.state_dir / "restore" / "restore.json").unlink(missing_ok=True)
    assert outcomes == {}, json.dumps(outcomes, indent=1)[:6000]
    assert digest(dhcp.leases) == before
    assert len(damaged) >= 5, names


@pytest.fixture
def two_lans(tmp_path: Path) -> Iterator[DhcpRouter]:
    """A router with lan0 (its peer in a DHCP client namespace) and lan1; removed at the end."""
    require_root()
    router = Router(tmp_path, links=("mgmt0", "lan0", "lan1"), client=True)
    dhcp = None
    try:
        dhcp = DhcpRouter(router)
        sh("ip", "-n", dhcp.clientns, "addr", "add", CLIENT, "dev", "lan0p")
        yield dhcp
    finally:
        if dhcp is not None:
            dhcp.close()
        router.close()


def _with_lan1(document: dict[str, Any]) -> dict[str, Any]:
    document["spec"]["interfaces"].append({"name": "lan1", "addresses": ["192.0.2.1/24"]})
    return document


def test_sigkill_during_a_restore_s_late_link_wait_no_offer_until_completed(
    two_lans: DhcpRouter, tmp_path: Path
) -> None:
    dhcp = two_lans
    router = dhcp.router
    boot = tmp_path / "boot_id"
    boot.write_text("11111111-1111-1111-1111-111111111111\n")
    env = {BOOT_ID_ENV: str(boot)}
    router.start_agent("--config", str(router.write("doc.yaml", _with_lan1(dhcp_document()))),
                       env=env)  # fmt: skip
    assert dhcp.udhcpc() is not None
    archive = tmp_path / "edge-01.tar"
    made = router.trueup("backup", "create", "--out", str(archive))
    assert made.returncode == 0, made.stdout + made.stderr
    other = router.write("other.yaml", _with_lan1(dhcp_document(lifetimes={"valid": 1800})))
    applied = router.trueup("apply", str(other))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    waiting = router.trueup(
        "restore", "apply", str(archive), "--mode", "config-only", "--reboot", env=env
    )
    assert waiting.returncode == 0, waiting.stdout + waiting.stderr
    assert _record(router)["state"] == "awaiting_restart"

    # The reboot: every process gone, the namespace rebuilt with mgmt0 and lan0 (its peer
    # in the client namespace again); lan1 comes late.
    router.stop_agents(signal.SIGKILL)
    kea = dhcp.kea_pid()
    assert kea is not None
    os.kill(kea, signal.SIGKILL)
    router.wait_for(lambda: dhcp.kea_pid() is None, what="Kea gone with the reboot")
    _rebuild_without_lan0(dhcp)
    _add_lan0(dhcp)
    sh("ip", "-n", dhcp.clientns, "addr", "add", CLIENT, "dev", "lan0p")
    boot.write_text("22222222-2222-2222-2222-222222222222\n")
    router.start_agent(env=env, wait_started=False)

    def waits_for_lan1() -> bool:
        restore = router.api("/v1/status").get("restore") or {}
        return (restore.get("waiting") or {}).get("links") == ["lan1"]

    router.wait_for(waits_for_lan1, what="the restore waiting for lan1")
    assert _fence(router) is not None
    flooder = Flooder(dhcp, tmp_path / "flood.json")
    try:
        flooder.wait_sent(PER_KEA, "DISCOVERs while the restore waits for lan1")
        assert flooder.answered() == 0, ("served while fenced", flooder.counts())
        # The agent killed in the middle of the wait: the Kea it left (if any) drops still.
        router.stop_agents(signal.SIGKILL)
        flooder.wait_sent(PER_KEA, "DISCOVERs with the agent down")
        assert flooder.answered() == 0, ("served while fenced, agent down", flooder.counts())
        router.start_agent(env=env, wait_started=False)
        router.wait_for(waits_for_lan1, what="the restore waiting for lan1 again")
        flooder.wait_sent(PER_KEA, "DISCOVERs after the agent's restart")
        assert flooder.answered() == 0, ("served while fenced, restarted", flooder.counts())
        router.ip("link", "add", "lan1", "type", "veth", "peer", "name", "lan1p")
        router.wait_for(lambda: _record(router).get("state") == "completed", what="completed")
        router.wait_for(lambda: _fence(router) is None, what="the fence lifted")
        router.wait_for(lambda: flooder.answered() > 0, what="an OFFER after completed")
        result = flooder.finish()
    finally:
        flooder.kill()
    record = _record(router)
    completed = next(h for h in record["history"] if h["state"] == "completed" and "at" in h)
    at = datetime.fromisoformat(str(completed["at"])).timestamp()
    answers = [a for a in result["answers"] if a["type"] in (OFFER, ACK)]
    assert [a for a in answers if a["at"] < at] == [], "answered before `completed`"
    assert "rolled_back" not in [h["state"] for h in record["history"]], record


def _reboot_flush(dhcp: DhcpRouter) -> None:
    """What a reboot does: the agent and Kea SIGKILLed, addresses flushed, links down, nft."""
    router = dhcp.router
    router.stop_agents(signal.SIGKILL)
    kea = dhcp.kea_pid()
    if kea is not None:
        os.kill(kea, signal.SIGKILL)
    router.wait_for(lambda: dhcp.kea_pid() is None, what="Kea gone with the reboot")
    for link in ("lan0", "mgmt0"):
        router.ip("addr", "flush", "dev", link)
        router.ip("link", "set", link, "down")
    assert router.run("nft", "flush", "ruleset").returncode == 0


@pytest.mark.parametrize("confirmation", ["expired while down", "still running"])
def test_a_reboot_under_notify_with_an_unconfirmed_revision_comes_back_whole(
    dhcp_router: DhcpRouter,  # noqa: F811
    confirmation: str,
) -> None:
    dhcp = dhcp_router
    router = dhcp.router
    first = dhcp_document()
    first["spec"]["convergence"] = {"default": "notify"}
    router.start_agent("--config", str(router.write("doc.yaml", first)))
    assert dhcp.udhcpc() is not None
    within = 5 if confirmation == "expired while down" else 40
    second = with_address(first, "203.0.113.5/24")
    applied = router.trueup(
        "apply", str(router.write("v2.yaml", second)), "--confirm-within", str(within)
    )
    assert applied.returncode == 0, applied.stdout + applied.stderr
    deadline = time.monotonic() + within
    assert "203.0.113.5/24" in router.addresses("lan0")
    _reboot_flush(dhcp)
    if confirmation == "expired while down":
        router.wait_for(lambda: time.monotonic() > deadline + 1, what="the deadline passed")
    router.start_agent()
    if confirmation == "still running":
        # The unconfirmed revision comes back whole until its deadline.
        router.wait_for(
            lambda: "203.0.113.5/24" in router.addresses("lan0"), what="v2's address back"
        )
    router.wait_for(
        lambda: router.addresses("lan0") == ["203.0.113.1/24"],
        what="the confirmed revision's addresses only",
    )
    assert router.link("lan0")["up"]
    router.wait_for(lambda: dhcp.udhcpc() is not None, what="a lease after the reboot")
    subsystems = router.api("/v1/status")["subsystems"]
    for name in ("links", "addresses", "dhcp"):
        assert subsystems[name]["health"] == "ok", (name, subsystems[name])
    assert router.api("/v1/status").get("pending_confirmation") in (None, {}), "rolled back"
