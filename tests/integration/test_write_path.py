"""The one write path on the real kernel: guarded rollback, verified commits, plan via the agent,
dependencies, a full or read-only state directory, and an audit log that is ordinary data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.routers import REPO, TRUEUP, Router, base_document, sh
from trueup.journal.state import StateDir

pytestmark = pytest.mark.root

LAN = "203.0.113.1/24"
FAST = {"TRUEUP_RESYNC_SECONDS": "1"}
MGMT2 = ["198.51.100.2/24", "198.51.100.3/24"]


def _mgmt(addresses: list[str]) -> dict[str, Any]:
    return {"interface": "mgmt0", "addresses": addresses, "gateway": "198.51.100.1"}


def _apply(router: Router, name: str, document: dict[str, Any], *args: str) -> Any:
    return router.trueup("apply", str(router.write(name, document)), *args)


def test_rollback_dropping_a_management_address_needs_confirmation_then_times_out(
    router: Router,
) -> None:
    assert _apply(router, "v1.yaml", base_document(management=_mgmt(MGMT2[:1]))).returncode == 0
    assert _apply(router, "v2.yaml", base_document(management=_mgmt(MGMT2))).returncode == 0
    # Without an agent: the CLI's engine refuses it the same way.
    refused = router.trueup("rollback")
    assert refused.returncode == 1, refused.stderr
    assert "removes management address 198.51.100.3/24" in refused.stderr
    assert router.addresses("mgmt0") == MGMT2

    router.start_agent(env=FAST)
    before = router.snapshot()
    refused = router.trueup("rollback")
    assert refused.returncode == 1 and "--confirm-within" in refused.stderr, refused.stderr
    assert router.snapshot() == before
    assert router.api("/v1/status")["versions"]["applied"] == 2

    guarded = router.trueup("rollback", "--confirm-within", "2")
    assert guarded.returncode == 0, guarded.stderr
    assert "pending confirmation" in guarded.stdout
    assert router.addresses("mgmt0") == MGMT2[:1]
    # Nobody confirms: the confirmed revision comes back as a new version.
    router.wait_for(lambda: router.addresses("mgmt0") == MGMT2, what="rolled back at deadline")
    router.wait_for(
        lambda: router.api("/v1/status")["versions"]["applied"] == 4, what="version 4 applied"
    )
    router.wait_for(
        lambda: router.api("/v1/status")["pending_confirmation"] is None,
        what="the pending confirmation cleared",
    )
    assert router.api("/v1/status")["versions"]["origin"] == "confirm-timeout"


def test_an_address_change_commits_only_with_its_routes_back(router: Router) -> None:
    assert _apply(router, "v1.yaml", base_document()).returncode == 0
    moved = base_document(
        interfaces=[{"name": "lan0", "mtu": 1400, "addresses": ["203.0.113.7/24"]}]
    )
    applied = _apply(router, "v2.yaml", moved)
    assert applied.returncode == 0, applied.stderr
    assert "192.0.2.0/24 via 203.0.113.254" in router.routes("main")
    assert "192.0.2.0/25 via 203.0.113.253" in router.routes("100")
    drift = router.trueup("drift")
    assert drift.returncode == 0, drift.stdout + drift.stderr


def test_plan_observes_where_the_agent_runs(router: Router) -> None:
    assert _apply(router, "v1.yaml", base_document()).returncode == 0
    path = router.write("v1.yaml", base_document())
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    state = ["--state-dir", str(router.state_dir)]
    # From the host's namespace with no agent: it says which namespace it observed.
    local = subprocess.run(
        [*TRUEUP, "plan", str(path), *state], capture_output=True, text=True, env=env, check=False
    )
    assert "observed by this process" in local.stdout
    assert os.readlink("/proc/self/ns/net") in local.stdout

    router.start_agent()
    remote = subprocess.run(
        [*TRUEUP, "plan", str(path), *state], capture_output=True, text=True, env=env, check=False
    )
    assert remote.returncode == 0, remote.stdout + remote.stderr
    assert "observed by the agent" in remote.stdout and "no changes" in remote.stdout
    assert "del-route" not in remote.stdout
    changed = base_document(management=_mgmt(["198.51.100.9/24"]))
    plan = subprocess.run(
        [*TRUEUP, "plan", str(router.write("v2.yaml", changed)), *state, "-o", "json"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert plan.returncode == 2, plan.stderr
    body = json.loads(plan.stdout)
    assert body["needs_confirmation"] is True
    assert body["observed_by"]["agent_pid"] and body["observed_by"]["state_dir"] == str(
        router.state_dir
    )


def test_acknowledged_addresses_make_routes_wait_not_fail(router: Router) -> None:
    assert _apply(router, "v1.yaml", base_document()).returncode == 0
    router.start_agent(env={**FAST, "TRUEUP_BREAKER_THRESHOLD": "2", "TRUEUP_BACKOFF_BASE": "0.05"})
    acked = router.trueup("ack", "addresses", "--for", "1h", "--reason", "rewiring")
    assert acked.returncode == 0, acked.stderr
    router.ip("addr", "del", LAN, "dev", "lan0")  # the kernel flushes the routes through it

    def routes_waiting() -> bool:
        entry = router.api("/v1/status")["subsystems"]["routes"]
        return "waiting on addresses" in str(entry.get("healing"))

    router.wait_for(routes_waiting, what="routes waiting on addresses")
    passes = router.api("/v1/status")["reconcile_loop"]["passes"]
    router.wait_for(
        lambda: router.api("/v1/status")["reconcile_loop"]["passes"] >= passes + 3,
        what="three more passes",
    )
    status = router.api("/v1/status")
    assert status["subsystems"]["routes"]["breaker"] == "closed"
    # A pass that ran between the address's removal and the kernel's route flush may
    # count one real failure; waiting never adds more (threshold 2: it stays closed).
    assert status["subsystems"]["routes"]["consecutive_failures"] < 2
    assert not [f for f in status["reason_codes"] if f["code"] == "STATE_RECONCILIATION_FAILED"], (
        status["reason_codes"]
    )
    healed = router.trueup("reconcile", "--subsystem", "addresses")
    assert healed.returncode == 0, healed.stderr
    router.wait_for(
        lambda: "192.0.2.0/24 via 203.0.113.254" in router.routes("main"), what="routes healed"
    )
    assert LAN in router.addresses("lan0")


@pytest.fixture
def small_state(tmp_path: Path) -> Any:
    """A 2 MiB tmpfs as the state directory, so it can be filled and made read-only."""
    mount = tmp_path / "small"
    mount.mkdir()
    sh("mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "trueup-test", str(mount))
    try:
        yield mount
    finally:
        sh("umount", "-l", str(mount), check=False)


def _fill(mount: Path) -> Path:
    filler = mount / "filler"
    with filler.open("wb") as handle:
        try:
            while True:
                handle.write(b"\0" * 65536)
                handle.flush()
        except OSError:
            pass
    return filler


def test_full_and_read_only_state_directory_then_normal_service(
    router: Router, small_state: Path
) -> None:
    router.state_dir = small_state / "state"
    router.state_dir.mkdir(mode=0o700)
    StateDir(router.state_dir).ensure()  # as Router makes its own
    assert _apply(router, "v1.yaml", base_document(routes=[])).returncode == 0
    router.start_agent(env=FAST)
    before = router.snapshot()

    filler = _fill(small_state)
    full = _apply(router, "v2.yaml", base_document())
    assert full.returncode == 1, full.stdout + full.stderr
    assert "No space left on device" in full.stderr and "Traceback" not in full.stderr
    assert router.snapshot() == before
    # A heal while the disk is full is reported, and the agent keeps serving.
    router.ip("addr", "del", LAN, "dev", "lan0")
    assert router.api("/v1/health/management")["ready"] is True
    filler.unlink()
    router.wait_for(lambda: LAN in router.addresses("lan0"), what="healed once space returned")
    applied = _apply(router, "v2.yaml", base_document())
    assert applied.returncode == 0, applied.stderr
    assert "192.0.2.0/24 via 203.0.113.254" in router.routes("main")

    sh("mount", "-o", "remount,ro", str(small_state))
    try:
        readonly = _apply(router, "v3.yaml", base_document(routes=[]))
        assert readonly.returncode == 1, readonly.stdout + readonly.stderr
        assert "Read-only file system" in readonly.stderr
        assert "192.0.2.0/24 via 203.0.113.254" in router.routes("main")
    finally:
        sh("mount", "-o", "remount,rw", str(small_state))
    again = _apply(router, "v3.yaml", base_document(routes=[]))
    assert again.returncode == 0, again.stderr
    status = router.api("/v1/status")
    assert status["versions"]["applied"] == 3
    assert status["journal"]["open"] is None
    doctor = router.trueup("doctor")
    assert "no write in progress" in doctor.stdout, doctor.stdout


def test_a_huge_audit_line_and_a_torn_tail_are_ordinary_data(router: Router) -> None:
    assert _apply(router, "v1.yaml", base_document(routes=[])).returncode == 0
    router.start_agent(env=FAST)
    script = (
        "import sys\n"
        "from trueup.journal.state import StateDir\n"
        "StateDir(sys.argv[1]).audit.append('note', 'test', blob='x' * 1_048_576)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-c", script, str(router.state_dir)], check=True, env=env)
    with (router.state_dir / "audit.jsonl").open("ab") as handle:
        handle.write(b'{"seq": 99999, "event": "torn')  # a crash mid-write
    applied = _apply(router, "v2.yaml", base_document())
    assert applied.returncode == 0, applied.stderr
    for path in ("/v1/status", "/v1/drift", "/v1/health/services"):
        assert router.api(path), path
    verified = router.trueup("audit", "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_a_hung_agent_is_never_bypassed_by_a_local_write(router: Router) -> None:
    import signal

    assert _apply(router, "v1.yaml", base_document()).returncode == 0
    proc = router.start_agent()
    before = router.snapshot()
    proc.send_signal(signal.SIGSTOP)  # alive, holding its state directory, answering nothing
    try:
        refused = _apply(router, "v2.yaml", base_document(routes=[]))
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "does not answer" in refused.stderr and "nothing was changed" in refused.stderr
        assert router.snapshot() == before
    finally:
        proc.send_signal(signal.SIGCONT)
    applied = _apply(router, "v2.yaml", base_document(routes=[]))
    assert applied.returncode == 0, applied.stderr


def _journal_open(state_dir: Path) -> dict[str, Any] | None:
    """The last transaction's begin when it has no terminal record (read from the file)."""
    opened: dict[str, dict[str, Any]] = {}
    for line in (state_dir / "journal.jsonl").read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("type") == "begin":
            opened[record["txn"]] = record
        elif record.get("type") in ("commit", "rolled_back"):
            opened.pop(record["txn"], None)
    return list(opened.values())[-1] if opened else None


@pytest.mark.parametrize("fault", ["full", "read-only"])
def test_a_transaction_a_storage_fault_left_open_is_closed_when_writes_return(
    router: Router, small_state: Path, tmp_path: Path, fault: str, request: Any
) -> None:
    router.state_dir = small_state / "state"
    router.state_dir.mkdir(mode=0o700)
    StateDir(router.state_dir).ensure()  # as Router makes its own
    assert _apply(router, "v1.yaml", base_document(routes=[])).returncode == 0
    journal = router.state_dir / "journal.jsonl"
    if fault == "read-only":
        # A file system cannot be remounted read-only while a file on it is open for
        # writing (the writer lock is, all through the transaction): the journal gets a
        # mount of its own, a bind mount of a copy, which is made read-only instead — in
        # the agent's mount namespace (`ip netns exec` gives each process its own copy).
        copy = tmp_path / "journal.jsonl"
        copy.write_bytes(journal.read_bytes())
        sh("mount", "--bind", str(copy), str(journal))
        request.addfinalizer(lambda: sh("umount", str(journal), check=False))
    go = tmp_path / "go"
    # The apply stops right after its `begin` until `go` exists: the state directory
    # is then filled (or its journal made read-only) under it.
    agent = router.start_agent(env={**FAST, "TRUEUP_FAULT": f"apply/begin:wait={go}"})
    in_agent = ("nsenter", f"--mount=/proc/{agent.pid}/ns/mnt", "--")
    before = router.snapshot()
    applying = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            router.name,
            *TRUEUP,
            "apply",
            str(router.write("v2.yaml", base_document())),
            "--state-dir",
            str(router.state_dir),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    filler: Path | None = None
    remounted = False
    try:
        router.wait_for(
            lambda: (_journal_open(router.state_dir) or {}).get("kind") == "apply",
            what="the apply's begin journaled",
            timeout=60,
        )
        if fault == "full":
            filler = _fill(small_state)
        else:
            sh(*in_agent, "mount", "-o", "remount,bind,ro", str(journal))
            remounted = True
        go.touch()
        out, _ = applying.communicate(timeout=120)
        assert applying.returncode == 1, out
        words = "No space left on device" if fault == "full" else "Read-only file system"
        assert words in out and "Traceback" not in out, out
        assert "stays open" in out, out
        assert router.snapshot() == before
        txn = _journal_open(router.state_dir)
        assert txn is not None
        status = router.api("/v1/status")
        assert status["journal"]["open"] is not None, status["journal"]
        codes = [f["code"] for f in status["reason_codes"]]
        assert "STATE_APPLY_NOT_COMPLETED" in codes, codes
    finally:
        if applying.poll() is None:
            applying.kill()
            applying.wait()
        if filler is not None:
            filler.unlink()
        if remounted:
            sh(*in_agent, "mount", "-o", "remount,bind,rw", str(journal))
    # Space is back (or the directory writable): the agent closes the transaction by
    # itself, no write needed.
    router.wait_for(
        lambda: _journal_open(router.state_dir) is None,
        what="the interrupted transaction closed by the agent",
        timeout=60,
    )
    records = [
        json.loads(line)
        for line in (router.state_dir / "journal.jsonl").read_text().splitlines()
        if txn["txn"] in line
    ]
    assert records[-1]["type"] == "rolled_back" and records[-1]["recovered"] is True
    router.wait_for(
        lambda: router.api("/v1/status")["journal"]["open"] is None, what="status: no open txn"
    )
    assert router.api("/v1/status")["versions"]["applied"] == 1
    assert router.snapshot() == before
    doctor = router.trueup("doctor")
    assert "no write in progress" in doctor.stdout, doctor.stdout
    applied = _apply(router, "v2.yaml", base_document())
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "192.0.2.0/24 via 203.0.113.254" in router.routes("main")
