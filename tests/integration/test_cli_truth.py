"""The CLI tells the truth, against a real agent in a namespace.

A state directory that does not exist (and `apply --init`), `status` with and
without an agent, drift with who changed it, plan's old → new values, `ack
--for 0` and `ack --clear` (audited), a refused `--expect-version` that the
next successful apply answers, `--version` naming the agent.
"""

from __future__ import annotations

import json
import os

import pytest

import trueup
from tests.routers import Router, base_document

pytestmark = pytest.mark.root

LAN = "203.0.113.1/24"


def test_apply_needs_an_existing_state_directory_or_init(router: Router) -> None:
    fresh = router.workdir / "fresh-state"
    path = str(router.write("desired.yaml", base_document()))
    refused = router.trueup("apply", path, "--state-dir", str(fresh), state=False)
    assert refused.returncode == 1
    assert f"state directory {fresh} does not exist" in refused.stderr
    assert "trueup apply --init" in refused.stderr
    assert not fresh.exists() and router.addresses("lan0") == []
    created = router.trueup("apply", path, "--init", "--state-dir", str(fresh), state=False)
    assert created.returncode == 0, created.stderr
    assert "version 1: committed" in created.stdout
    assert fresh.is_dir() and LAN in router.addresses("lan0")


def test_the_cli_with_a_running_agent(router: Router) -> None:
    document = base_document(convergence={"default": "notify"})
    assert router.trueup("apply", str(router.write("v1.yaml", document))).returncode == 0
    # Without an agent: status says so, exit 0.
    alone = router.trueup("status")
    assert alone.returncode == 0 and alone.stdout.startswith("WARNING: no agent is running")
    proc = router.start_agent()

    shown = router.trueup("status")
    assert shown.returncode == 0 and "WARNING" not in shown.stdout
    version = router.trueup(
        "--version", env={"TRUEUP_STATE_DIR": str(router.state_dir)}, state=False
    )
    assert version.returncode == 0, version.stderr
    assert version.stdout.splitlines() == [
        f"trueup {trueup.__version__}",
        f"agent {trueup.__version__} (pid {proc.pid}, {router.state_dir})",
    ]

    # Drift under notify: the status table shows the record and who made the change.
    router.ip("addr", "del", LAN, "dev", "lan0")
    router.wait_for(
        lambda: "drift" in router.api("/v1/status")["subsystems"]["addresses"],
        what="a drift record",
    )
    table = router.trueup("status").stdout
    assert "drift:" in table and "addresses since " in table
    assert "changed by: " in table, table
    assert "{'" not in table

    # Plan: old → new.
    lower = base_document(
        interfaces=[{"name": "lan0", "mtu": 1300, "addresses": [LAN, "2001:db8:1::1/64"]}],
        convergence={"default": "notify"},
    )
    planned = router.trueup("plan", str(router.write("lower.yaml", lower)))
    assert planned.returncode == 2, planned.stderr
    assert "~ links: set-mtu lan0: 1400 → 1300" in planned.stdout

    # ack: a duration that is not positive is refused; --clear withdraws (audited).
    zero = router.trueup("ack", "addresses", "--for", "0", "--reason", "x")
    assert zero.returncode == 1 and "positive duration" in zero.stderr
    acked = router.trueup("ack", "addresses", "--for", "10m", "--reason", "maintenance")
    assert acked.returncode == 0, acked.stderr
    table = router.trueup("status").stdout
    assert "acknowledged:" in table and "addresses: healing paused until " in table
    assert f"by cli:{os.getuid()}: maintenance; drift is still detected" in table, table
    assert "(withdraw: trueup ack addresses --clear)" in table
    cleared = router.trueup("ack", "addresses", "--clear")
    assert cleared.returncode == 0 and "withdrawn" in cleared.stdout, cleared.stderr
    status = json.loads(router.trueup("status", "-o", "json").stdout)
    assert status["subsystems"]["addresses"]["acknowledged_until"] is None
    audit = [
        json.loads(line) for line in (router.state_dir / "audit.jsonl").read_text().splitlines()
    ]
    assert [r["event"] for r in audit].count("ack_cleared") == 1

    # A refused --expect-version is listed until a later apply succeeds.
    stale = router.trueup("apply", str(router.write("v1b.yaml", document)), "--expect-version", "0")
    assert stale.returncode == 3
    codes = {
        f["code"] for f in json.loads(router.trueup("status", "-o", "json").stdout)["reason_codes"]
    }
    assert "STATE_CONCURRENT_MODIFICATION" in codes
    again = router.trueup("apply", str(router.write("lower.yaml", lower)))
    assert again.returncode == 0, again.stderr
    codes = {
        f["code"] for f in json.loads(router.trueup("status", "-o", "json").stdout)["reason_codes"]
    }
    assert "STATE_CONCURRENT_MODIFICATION" not in codes

    # The agent stops: status says it does not run.
    router.stop_agents()
    after = router.trueup("status")
    assert after.returncode == 0 and after.stdout.startswith("WARNING: no agent is running")


def test_demo_stop_finds_a_restarted_agent_by_its_state_directory_lock(router: Router) -> None:
    from scripts.stop_agent import stop_agent

    assert router.trueup("apply", str(router.write("v1.yaml", base_document()))).returncode == 0
    proc = router.start_agent()
    assert stop_agent(router.state_dir) == [proc.pid]
    assert proc.wait(timeout=15) is not None
    assert stop_agent(router.state_dir) == []  # nothing holds it any more
    router.agents.clear()


def test_a_healed_drift_stays_in_text_status_and_drift_naming_ip_and_trueups_heal(
    router: Router,
) -> None:
    import subprocess

    path = router.write("desired.yaml", base_document())
    assert router.trueup("apply", str(path)).returncode == 0
    router.start_agent(env={"TRUEUP_RESYNC_SECONDS": "1"})

    def healed_by(other_than: str | None = None) -> str | None:
        entry = router.api("/v1/status")["subsystems"]["addresses"]
        txn = ((entry.get("last_drift") or {}).get("healed_by") or {}).get("txn")
        return str(txn) if txn and txn != other_than else None

    # `ip` stays running between its commands, so the agent can name it from its port.
    ip = subprocess.Popen(
        ["ip", "-n", router.name, "-batch", "-"], stdin=subprocess.PIPE, text=True
    )
    assert ip.stdin is not None
    try:
        ip.stdin.write(f"addr del {LAN} dev lan0\n")
        ip.stdin.flush()
        router.wait_for(lambda: healed_by() is not None, what="the first heal")
        first = healed_by()
        # Again: the new drift record also shows the first heal's own write before it.
        ip.stdin.write(f"addr del {LAN} dev lan0\n")
        ip.stdin.flush()
        router.wait_for(lambda: healed_by(first) is not None, what="the second heal")
        second = healed_by(first)
    finally:
        ip.stdin.close()
        ip.wait(timeout=30)
    assert LAN in router.addresses("lan0")

    status = router.trueup("status")
    drift = router.trueup("drift")
    assert status.returncode == 0 and drift.returncode == 0, status.stderr + drift.stderr
    assert drift.stdout.startswith("in sync with version 1")
    for shown in (status.stdout, drift.stdout):
        section = shown.split("last drift (ended):", 1)[1]
        line = next(x for x in section.splitlines() if x.startswith("  addresses: healed "))
        assert f"by trueup heal {second}" in line, shown
        assert "path:       spec.interfaces[lan0].addresses" in section
        assert f"changed by: RTM_DELADDR lan0 {LAN} from ip (netlink port " in section, shown
        assert f"changed by: RTM_NEWADDR lan0 {LAN} from trueup heal {first} " in section, shown
        assert "unknown" not in section, shown
