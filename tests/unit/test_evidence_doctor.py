"""Evidence bundles, doctor findings on prepared states, and known limitations (FakeNetlink)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from tests.routers import base_document
from trueup.backup.evidence import collect_evidence
from trueup.journal.atomic import read_json, write_json
from trueup.journal.limitations import (
    LimitationError,
    add_limitation,
    list_limitations,
    withdraw_limitation,
)
from trueup.journal.state import StateDir
from trueup.model.document import parse_document
from trueup.reconcile.attribution import DriftBook
from trueup.reconcile.changes import Change, Refused
from trueup.reconcile.doctor import AgentPresence, DoctorFinding, run_checks, stop_conditions
from trueup.reconcile.engine import Engine
from trueup.reconcile.healing import Governor, HealingOptions
from trueup.reconcile.status import build_status, gather
from trueup.reconcile.view import LoopActivity, build_view
from trueup.system.fake import FakeNetlink, FakeRunner
from trueup.system.hostinfo import agent_log_lines, unit_of_cgroup
from trueup.system.runner import Completed
from trueup.system.secretstore import write_secret

RUNNING = AgentPresence(running=True, answering=True, pid=4242)
STOPPED = AgentPresence(running=False, answering=False, pid=None)
PLANTED = "s3cr3t-Planted-Value-0123456789"


@pytest.fixture
def kernel() -> FakeNetlink:
    return FakeNetlink({"mgmt0": 1500, "lan0": 1500})


@pytest.fixture
def engine(tmp_path: Path, kernel: FakeNetlink) -> Engine:
    state = StateDir(tmp_path / "state")
    state.ensure()
    engine = Engine(state, netlink_factory=lambda: kernel)
    assert engine.transact(Change(parse_document(base_document()), actor="test")).ok
    return engine


def _failing(findings: list[DoctorFinding]) -> dict[str, DoctorFinding]:
    return {f.code: f for f in findings if not f.ok and f.code}


def _bundle(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return {
            m.name.removeprefix("evidence/"): tar.extractfile(m).read()  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.isfile()
        }


# -- doctor on prepared states ---------------------------------------------------
def test_a_healthy_device_with_a_running_agent_passes_every_check(engine: Engine) -> None:
    findings = run_checks(gather(engine), RUNNING, log_lines=[], log_source="x", audit_problems=[])
    assert [f for f in findings if not f.ok] == []
    assert stop_conditions(gather(engine), RUNNING)["desired equals observed"][0] is True


def test_agent_stopped_fails_with_its_code_and_action(engine: Engine) -> None:
    failing = _failing(run_checks(gather(engine), STOPPED))
    assert "AGENT_NOT_RUNNING" in failing
    assert "trueup agent run" in failing["AGENT_NOT_RUNNING"].action
    hung = AgentPresence(running=True, answering=False, pid=7)
    assert "AGENT_NOT_ANSWERING" in _failing(run_checks(gather(engine), hung))
    met, seen = stop_conditions(gather(engine), STOPPED)["agent running"]
    assert not met and "no agent" in seen


def test_drift_reports_its_code_paths_and_action(engine: Engine, kernel: FakeNetlink) -> None:
    kernel.set_link("lan0", mtu=1500)
    failing = _failing(run_checks(gather(engine), RUNNING))
    finding = failing["STATE_DRIFT_DETECTED"]
    assert any("mtu" in p for p in finding.paths)
    assert "trueup reconcile" in finding.action
    met, seen = stop_conditions(gather(engine), RUNNING)["desired equals observed"]
    assert not met and "mtu" in seen


def test_version_skew_reports_its_code_and_action(engine: Engine) -> None:
    status = gather(engine, control_plane_version=7)
    failing = _failing(run_checks(status, RUNNING))
    assert "STATE_VERSION_SKEW" in failing
    assert "Apply the desired revision" in failing["STATE_VERSION_SKEW"].action
    assert stop_conditions(status, RUNNING)["versions aligned"][0] is False


def test_open_transaction_reports_apply_not_completed(engine: Engine) -> None:
    txn = engine.state.journal.begin(kind="apply", version=2)
    engine.state.journal.record(txn, "applied", subsystem="links")
    status = gather(engine)
    failing = _failing(run_checks(status, RUNNING))
    assert "STATE_APPLY_NOT_COMPLETED" in failing
    assert "re-run `trueup apply FILE`" in failing["STATE_APPLY_NOT_COMPLETED"].action
    assert stop_conditions(status, RUNNING)["no reconciliation error"][0] is False


def test_partial_update_reports_its_code_and_action(engine: Engine) -> None:
    applied = read_json(engine.state.root / "applied.json")
    write_json(
        engine.state.root / "applied.json",
        {**applied, "outcome": "partial", "failed": {"addresses": "EPERM"}},
    )
    failing = _failing(run_checks(gather(engine), RUNNING))
    assert "STATE_PARTIAL_UPDATE" in failing
    assert "re-apply the full document" in failing["STATE_PARTIAL_UPDATE"].action


def test_breaker_open_reports_reconciliation_failed(engine: Engine) -> None:
    options = HealingOptions(jitter=0.0, breaker_threshold=2, retry_budget=10, retry_window=60)
    governor = Governor(options)
    now = 1_800_000_000.0
    for at in (now - 20, now - 10):
        governor.record_attempt("addresses", at)
        governor.record_failure("addresses", at, "No such device", ["p"])
    view = build_view(
        ["management", "links", "addresses", "routes"],
        document=parse_document(base_document()),
        governor=governor,
        options=options,
        drift=DriftBook(),
        waiting={},
        pending_confirmation=None,
        activity=LoopActivity(event_source="fake", counters={}),
        now=now,
    )
    status = build_status(engine, loop=view).to_json()
    failing = _failing(run_checks(status, RUNNING))
    assert "STATE_RECONCILIATION_FAILED" in failing
    assert "trueup reconcile --subsystem" in failing["STATE_RECONCILIATION_FAILED"].action
    met, seen = stop_conditions(status, RUNNING)["no reconciliation error"]
    assert not met and "addresses failed" in seen


def test_concurrent_write_refused_reports_its_code_and_action(engine: Engine) -> None:
    with pytest.raises(Refused):
        engine.transact(Change(parse_document(base_document()), actor="late", expect_version=99))
    failing = _failing(run_checks(gather(engine), RUNNING))
    assert "STATE_CONCURRENT_MODIFICATION" in failing
    assert "--expect-version" in failing["STATE_CONCURRENT_MODIFICATION"].action


def test_recent_errors_in_the_agent_log_fail_older_ones_do_not(engine: Engine) -> None:
    recent = ["2099-01-01T00:00:00Z ERROR trueup.loop: heal failed: EPERM"]
    failing = _failing(run_checks(gather(engine), RUNNING, log_lines=recent, log_source="f"))
    assert "AGENT_LOG_ERRORS" in failing and "EPERM" in failing["AGENT_LOG_ERRORS"].message
    old = ["2001-01-01T00:00:00Z ERROR trueup.loop: heal failed: EPERM"]
    assert "AGENT_LOG_ERRORS" not in _failing(
        run_checks(gather(engine), RUNNING, log_lines=old, log_source="f")
    )


def test_a_disconnected_control_plane_and_a_stale_heartbeat(engine: Engine) -> None:
    status = gather(engine)
    status["control_plane"] = {"url": "https://cp", "connected": False, "last_error": "refused"}
    assert "CONTROL_PLANE_DISCONNECTED" in _failing(run_checks(status, RUNNING))
    status["control_plane"] = {"url": "https://cp", "connected": True, "last_report_at": 1.0}
    assert "HEARTBEAT_STALE" in _failing(run_checks(status, RUNNING))


# -- known limitations -------------------------------------------------------------
def test_a_limitation_classifies_its_difference_as_accepted(
    engine: Engine, kernel: FakeNetlink
) -> None:
    kernel.set_link("lan0", mtu=1500)
    drifted = gather(engine)
    path = drifted["subsystems"]["links"]["differences"][0]["path"]
    record = add_limitation(
        engine.state.root,
        "links",
        path,
        reason="NIC firmware caps the MTU",
        reviewed_by="alice",
        ticket="CHG-1",
        actor="test",
        known_subsystems=list(engine.by_name),
    )
    status = gather(engine)
    assert status["subsystems"]["links"]["differences"] == []
    accepted = status["subsystems"]["links"]["accepted"]
    assert accepted[0]["path"] == path and accepted[0]["limitation"] == record.id
    assert "STATE_DRIFT_DETECTED" not in {f["code"] for f in status["reason_codes"]}
    assert status["limitations"][0]["reviewed_by"] == "alice"
    assert [f for f in run_checks(status, RUNNING) if not f.ok] == []
    events = [r["event"] for r in engine.state.audit.records()]
    assert "limitation_added" in events

    withdrawn = withdraw_limitation(engine.state.root, record.id, reason="NIC replaced")
    assert withdrawn.withdrawn_at
    assert list_limitations(engine.state.root) == []
    assert len(list_limitations(engine.state.root, include_withdrawn=True)) == 1
    assert "STATE_DRIFT_DETECTED" in {f["code"] for f in gather(engine)["reason_codes"]}
    assert engine.state.audit.records()[-1]["event"] == "limitation_withdrawn"
    assert not engine.state.audit.verify()


def test_limitation_input_errors_name_the_field(engine: Engine) -> None:
    root = engine.state.root
    with pytest.raises(LimitationError, match="--reviewed-by"):
        add_limitation(root, "links", "p", reason="r", reviewed_by=" ")
    with pytest.raises(LimitationError, match="subsystem: 'nope'"):
        add_limitation(root, "nope", "p", reason="r", reviewed_by="b", known_subsystems=["links"])
    with pytest.raises(KeyError):
        withdraw_limitation(root, "L99", reason="r")
    assert not (root / "limitations.json").exists()


# -- evidence --------------------------------------------------------------------------
def test_evidence_without_an_agent_hashes_check_and_secrets_are_redacted(
    engine: Engine, kernel: FakeNetlink
) -> None:
    root = engine.state.root
    write_secret(root, "wg-key", PLANTED)
    # planted where a careless component might leak it: the log, a state file, a key
    (root / "agent.log").write_text(
        f"2026-11-30T17:02:52Z INFO x: started\n2026-11-30T17:02:53Z ERROR x: bad key {PLANTED}\n"
        "2026-11-30T17:02:54Z INFO x: Authorization: Bearer abcdefTOKEN123\n"
    )
    write_json(root / "control-plane.json", {"url": "https://cp", "token": "tok-" + PLANTED[:8]})
    kernel.set_link("lan0", mtu=1500)
    data = collect_evidence(engine, source="state directory", missing={"live agent view": "down"})
    files = _bundle(data)
    manifest: dict[str, Any] = json.loads(files.pop("manifest.json"))
    assert manifest["source"] == "state directory"
    assert manifest["missing"]["live agent view"] == "down"
    assert set(manifest["entries"]) == set(files)
    for name, data_ in files.items():
        assert hashlib.sha256(data_).hexdigest() == manifest["entries"][name]["sha256"], name
        assert PLANTED.encode() not in data_, name
        assert b"tok-" + PLANTED[:8].encode() not in data_, name
        assert b"abcdefTOKEN123" not in data_, name
    for part in (
        "status.json",
        "desired.json",
        "observed.json",
        "diff.json",
        "versions.json",
        "reason-codes.json",
        "agent.log",
        "history.json",
        "audit-excerpt.jsonl",
        "audit-proof.json",
        "concurrency.json",
        "environment.json",
        "limitations.json",
        "state/applied.json",
    ):
        assert part in files, (part, manifest["missing"])
    assert b"[REDACTED]" in files["agent.log"]
    assert json.loads(files["audit-proof.json"])["chain_intact"] is True
    diff = json.loads(files["diff.json"])
    assert not diff["in_sync"] and any("mtu" in d["path"] for d in diff["differences"])
    reasons = json.loads(files["reason-codes.json"])
    assert "STATE_DRIFT_DETECTED" in {f["code"] for f in reasons["findings"]}
    assert all(f["action"] for f in reasons["findings"])
    assert json.loads(files["versions.json"])["applied"] == 1
    assert json.loads(files["environment.json"])["kernel"]["release"]


def test_evidence_without_an_agent_compares_with_the_control_plane_s_last_revision(
    engine: Engine,
) -> None:
    write_json(engine.state.root / "control-plane.json", {"url": "https://cp", "version": 5})
    files = _bundle(collect_evidence(engine, source="state directory"))
    versions = json.loads(files["versions.json"])
    assert versions["control_plane_last_fetched"] == 5 and versions["aligned"] is False
    status = json.loads(files["status.json"])
    assert "STATE_VERSION_SKEW" in {f["code"] for f in status["reason_codes"]}


# -- the agent's log ----------------------------------------------------------------------
def test_the_log_comes_from_journald_under_systemd_else_from_the_state_directory(
    tmp_path: Path,
) -> None:
    assert unit_of_cgroup("0::/system.slice/trueup-agent.service\n") == "trueup-agent.service"
    assert unit_of_cgroup("0::/user.slice/user-0.slice/session-3.scope\n") is None
    argv = ("journalctl", "-u", "trueup-agent.service", "-n", "2", "--no-pager", "-o", "short-iso")
    runner = FakeRunner({argv: Completed(argv, 0, "a\nb\nc\n", "")})
    lines, where = agent_log_lines(tmp_path, None, 2, runner, unit="trueup-agent.service")
    assert lines == ["b", "c"] and where["source"] == "journald unit trueup-agent.service"
    (tmp_path / "agent.log.1").write_text("old-1\nold-2\n")
    (tmp_path / "agent.log").write_text("new-1\n")
    empty = FakeRunner()  # journald has nothing: the file is the fallback
    lines, where = agent_log_lines(tmp_path, None, 2, empty, unit="trueup-agent.service")
    assert lines == ["old-2", "new-1"] and where["source"] == str(tmp_path / "agent.log")
    (tmp_path / "agent.log").unlink()
    (tmp_path / "agent.log.1").unlink()
    lines, where = agent_log_lines(tmp_path, None, 2, empty)
    assert lines == [] and "does not exist" in where["missing"]


def test_evidence_never_copies_a_host_file_through_a_link(engine: Engine, tmp_path: Path) -> None:
    victim = tmp_path / "shadow"
    victim.write_text(f"root:{PLANTED}:19000:0:99999:7:::\n")
    (engine.state.root / "config.json").symlink_to(victim)
    (engine.state.root / "agent.log").symlink_to(victim)
    data = collect_evidence(engine, source="state directory")
    files = _bundle(data)
    assert PLANTED.encode() not in b"".join(files.values())
    assert b"symbolic link" in files["state/config.json"]
