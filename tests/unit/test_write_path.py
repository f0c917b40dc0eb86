"""The one write path over a FakeNetlink: guard, identity, verification, recovery, I/O errors."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import pytest

from tests.routers import base_document
from trueup.agent.wiring import already_applied
from trueup.journal.state import StateDir
from trueup.model.document import document_digest, parse_document
from trueup.model.reasons import ReasonCode
from trueup.reconcile import faults
from trueup.reconcile.changes import (
    CONTROL_PLANE_FILE,
    Change,
    NeedsConfirmation,
    Refused,
    StorageError,
)
from trueup.reconcile.engine import Engine
from trueup.reconcile.engine import observe as observing
from trueup.reconcile.status import gather
from trueup.subsystems.base import Scope
from trueup.system.fake import FakeNetlink

MGMT = ["198.51.100.2/24", "198.51.100.3/24"]


@pytest.fixture
def kernel() -> FakeNetlink:
    return FakeNetlink({"mgmt0": 1500, "lan0": 1500})


@pytest.fixture
def engine(tmp_path: Path, kernel: FakeNetlink) -> Engine:
    state = StateDir(tmp_path / "state")
    state.ensure()
    return Engine(state, netlink_factory=lambda: kernel)


def _doc(**spec: Any) -> Any:
    return parse_document(base_document(**spec))


def _mgmt(addresses: list[str]) -> dict[str, Any]:
    return {"interface": "mgmt0", "addresses": addresses, "gateway": "198.51.100.1"}


def _kernel_image(kernel: FakeNetlink) -> tuple[Any, ...]:
    return (
        sorted(kernel.addrs, key=str),
        sorted(kernel.route_table, key=str),
        dict(kernel.link_state),
    )


# -- one guard for every writer ----------------------------------------------------
def test_rollback_that_drops_a_management_address_needs_a_confirmation(
    engine: Engine, kernel: FakeNetlink
) -> None:
    assert engine.apply_document(_doc(management=_mgmt(MGMT[:1]))).ok
    assert engine.apply_document(_doc(management=_mgmt(MGMT))).ok
    before = _kernel_image(kernel)
    with pytest.raises(NeedsConfirmation) as refused:
        engine.rollback_to(None)
    assert "removes management address 198.51.100.3/24" in str(refused.value)
    assert _kernel_image(kernel) == before
    assert engine.state.applied().version == 2
    # With a confirmation arranged, the same rollback is applied.
    result = engine.rollback_to(None, management_confirmed=True)
    assert result.ok and result.version == 3 and result.origin == "rollback"
    assert {a.prefix for a in kernel.addrs if a.ifname == "mgmt0"} == {MGMT[0]}


def test_the_guard_is_in_the_engine_for_plain_applies_too(engine: Engine) -> None:
    assert engine.apply_document(_doc(management=_mgmt(MGMT))).ok
    with pytest.raises(NeedsConfirmation):
        engine.apply_document(_doc(management=_mgmt(MGMT[:1])))
    refusals = [r for r in engine.state.audit.records() if r["event"] == "apply_refused"]
    assert refusals and refusals[-1]["details"]["kind"] == "apply"


# -- verified commits ----------------------------------------------------------------
def test_an_address_change_that_flushes_a_route_commits_only_with_the_route_back(
    engine: Engine, kernel: FakeNetlink
) -> None:
    routes = [{"to": "192.0.2.0/24", "via": "203.0.113.254"}]
    assert engine.apply_document(_doc(routes=routes)).ok
    moved = [{"name": "lan0", "mtu": 1400, "addresses": ["203.0.113.7/24"]}]
    result = engine.apply_document(_doc(interfaces=moved, routes=routes))
    assert result.ok and result.outcome == "committed"
    assert any(r.to == "192.0.2.0/24" for r in kernel.route_table)
    with engine.sources() as net:
        differences = observing.differences(engine, engine.applied_document(), net)  # type: ignore[arg-type]
    assert not any(differences.values()), differences
    verified = [
        r for r in engine.state.journal.transactions()[-1].records if r["type"] == "verified"
    ]
    assert verified and verified[0]["subsystem"] == "routes"


def test_a_document_the_kernel_cannot_hold_fails_atomically(
    engine: Engine, kernel: FakeNetlink
) -> None:
    assert engine.apply_document(_doc()).ok
    before = _kernel_image(kernel)
    # No address on lan0 leaves the routes' gateways unreachable: it cannot commit.
    result = engine.apply_document(_doc(interfaces=[{"name": "lan0", "mtu": 1400}]))
    assert not result.ok and result.outcome == "rolled_back"
    assert "routes" in result.failed
    assert _kernel_image(kernel) == before
    assert engine.state.applied().version == 1


# -- revisions have an identity -------------------------------------------------------
def test_local_apply_on_a_managed_device_is_an_explicit_reported_override(
    engine: Engine,
) -> None:
    state = engine.state
    cp_doc = _doc().with_version(1)
    assert engine.transact(Change(cp_doc, origin="control-plane", actor="control-plane")).ok
    state.write(CONTROL_PLANE_FILE, {"url": "https://cp.invalid", "version": 1})
    assert state.applied().cp_version == 1 and state.applied().origin == "control-plane"

    local = _doc(routes=[])
    with pytest.raises(Refused) as refused:
        engine.apply_document(local)
    assert refused.value.code is ReasonCode.VERSION_SKEW
    assert "--override" in str(refused.value) and "https://cp.invalid" in str(refused.value)

    result = engine.apply_document(local, actor="cli:0", override="hotfix for ticket 42")
    assert result.ok and result.version == 2
    applied = state.applied().to_json()
    assert applied["origin"] == "local-cli" and applied["cp_version"] == 1
    assert applied["override"]["reason"] == "hotfix for ticket 42"
    assert applied["override"]["actor"] == "cli:0"
    status = gather(engine, control_plane_version=1)
    assert status["versions"]["override"]["version"] == 2
    skew = [f for f in status["reason_codes"] if f["code"] == ReasonCode.VERSION_SKEW.value]
    assert skew and "local override" in skew[0]["detail"]

    # The control plane publishes its revision 2: same number as the override, other content.
    cp_two = _doc(routes=[{"to": "192.0.2.0/24", "via": "203.0.113.254"}]).with_version(2)
    assert not already_applied(state.applied(), 2, document_digest(cp_two))
    result = engine.transact(Change(cp_two, origin="control-plane", actor="control-plane"))
    assert result.ok and result.version == 2
    applied = state.applied().to_json()
    assert applied["origin"] == "control-plane" and applied["override"] is None
    assert applied["digest"] == document_digest(cp_two)
    assert already_applied(state.applied(), 2, document_digest(cp_two))
    assert state.revision(2)["document"]["spec"]["routes"]  # type: ignore[index]
    aside = list((state.root / "revisions" / "superseded").glob("00000002-*.json"))
    assert len(aside) == 1 and json.loads(aside[0].read_text())["origin"] == "local-cli"
    status = gather(engine, control_plane_version=2)
    assert not [f for f in status["reason_codes"] if f["code"] == ReasonCode.VERSION_SKEW.value]


def test_a_control_plane_revision_is_never_skipped_for_a_local_number(engine: Engine) -> None:
    for routes in ([], None, []):  # local history before enrolment: versions 1..3
        engine.apply_document(_doc(routes=routes) if routes is not None else _doc())
    assert engine.state.applied().version == 3
    cp_one = _doc(routes=[]).with_version(1)
    assert not already_applied(engine.state.applied(), 1, document_digest(cp_one))
    result = engine.transact(Change(cp_one, origin="control-plane"))
    assert result.ok and result.version == 1
    # Older than the last control-plane revision applied: refused.
    with pytest.raises(Refused) as older:
        engine.transact(Change(_doc().with_version(0), origin="control-plane"))
    assert older.value.code is ReasonCode.VERSION_SKEW


# -- exact recovery ---------------------------------------------------------------------
def test_recovering_an_interrupted_heal_goes_forward_never_to_the_drifted_image(
    engine: Engine, kernel: FakeNetlink
) -> None:
    many = [f"198.51.100.{n}/24" for n in range(2, 40)]
    assert engine.apply_document(_doc(management=_mgmt(many))).ok
    # Out of band: management flushed. A heal begins (its before-image is the
    # flushed state), re-adds one address, and the agent dies.
    for address in many:
        kernel.del_address("mgmt0", address)
    applied = engine.state.applied().to_json()
    scope = json.loads(json.dumps(engine.state.journal.transactions()[-1].begin["scope"]))
    with engine.sources() as net:
        flushed = observing.observe(engine, net, Scope.from_json(scope))
    engine.state.journal.begin(
        kind="reconcile",
        version=applied["version"],
        subsystems=["management"],
        all_subsystems=["management"],
        scope=scope,
        before=flushed,
        previous_applied=applied,
    )
    kernel.add_address("mgmt0", many[0])
    recovered = Engine(engine.state, netlink_factory=lambda: kernel).recover(actor="startup")
    assert recovered is not None
    assert {a.prefix for a in kernel.addrs if a.ifname == "mgmt0"} == set(many)
    closed = engine.state.journal.transactions()[-1]
    types = [r["type"] for r in closed.records]
    assert [t for t in types if t != "recovered"][-2:] == ["recovering", "rolled_back"]
    # One `recovered` line per subsystem brought forward, in tier order.
    recovered_names = [r["subsystem"] for r in closed.records if r["type"] == "recovered"]
    assert recovered_names[0] == "management"
    assert closed.terminal is not None and closed.terminal["to_version"] == applied["version"]


def test_a_crash_right_after_commit_keeps_its_audit_line(
    engine: Engine, kernel: FakeNetlink, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Crash(BaseException):
        pass

    def crash_after_commit(point: str) -> None:
        if point == "after-commit":
            raise Crash

    monkeypatch.setattr(faults, "hit", crash_after_commit)
    with pytest.raises(Crash):
        engine.apply_document(_doc())
    monkeypatch.undo()
    txn = engine.state.journal.transactions()[-1]
    assert txn.terminal is not None and txn.terminal["type"] == "commit"
    assert not [r for r in engine.state.audit.records() if r["event"] == "apply"]
    # The next process's first write completes the audit from the journal.
    restarted = Engine(engine.state, netlink_factory=lambda: kernel)
    restarted.recover()
    written = [r for r in engine.state.audit.records() if r["event"] == "apply"]
    assert len(written) == 1 and written[0]["details"]["txn"] == txn.txn
    assert written[0]["details"]["written_after_restart"] is True
    assert engine.state.audit.verify() == []
    restarted.recover()  # only once
    assert len([r for r in engine.state.audit.records() if r["event"] == "apply"]) == 1


# -- I/O errors never strand the device -----------------------------------------------------
def test_a_full_disk_at_begin_changes_nothing_and_the_lock_survives(
    engine: Engine, kernel: FakeNetlink, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert engine.apply_document(_doc()).ok
    before = _kernel_image(kernel)
    journal_type = type(engine.state.journal)

    def full(self: Any, **fields: Any) -> str:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(journal_type, "begin", full)
    with pytest.raises(StorageError) as failed:
        engine.apply_document(_doc(routes=[]))
    assert "No space left on device" in str(failed.value)
    assert "nothing was changed" in str(failed.value)
    assert _kernel_image(kernel) == before
    monkeypatch.undo()
    assert not engine.active
    result = engine.apply_document(_doc(routes=[]))
    assert result.ok and result.version == 2


def test_a_full_disk_at_commit_puts_the_system_back(
    engine: Engine, kernel: FakeNetlink, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert engine.apply_document(_doc()).ok
    before = _kernel_image(kernel)

    def full(self: Any, version: int, document: Any, **meta: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(StateDir, "save_revision", full)
    with pytest.raises(StorageError) as failed:
        engine.apply_document(_doc(routes=[]))
    assert "put back" in str(failed.value)
    assert _kernel_image(kernel) == before
    assert engine.state.applied().version == 1
    assert engine.state.journal.open_transaction() is None
    monkeypatch.undo()
    assert engine.apply_document(_doc(routes=[])).ok


def test_an_uncommitted_revision_file_never_becomes_the_applied_document(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = engine.state
    state.write(CONTROL_PLANE_FILE, {"url": "https://cp.invalid"})
    assert engine.transact(Change(_doc().with_version(1), origin="control-plane")).ok
    local = engine.apply_document(_doc(routes=[]), override="hotfix")
    assert local.ok and local.version == 2
    # The control plane's revision 2 dies between its revision file and its commit.
    monkeypatch.setattr(
        StateDir,
        "set_applied",
        lambda self, record: (_ for _ in ()).throw(
            OSError(errno.ENOSPC, "No space left on device")
        ),
    )
    cp_two = _doc(routes=[{"to": "192.0.2.0/24", "via": "203.0.113.254"}]).with_version(2)
    with pytest.raises(StorageError):
        engine.transact(Change(cp_two, origin="control-plane"))
    monkeypatch.undo()
    applied = engine.applied_document()
    assert applied is not None and applied.spec.routes == []  # the override, not the refused one


def test_the_applied_revision_is_never_pruned_when_numbers_go_back(engine: Engine) -> None:
    from trueup.journal import state as state_module

    state_module._KEEP_REVISIONS = 3  # type: ignore[attr-defined]
    try:
        for routes in ([], None, [], None, []):
            engine.apply_document(_doc(routes=routes) if routes is not None else _doc())
        engine.state.write(CONTROL_PLANE_FILE, {"url": "https://cp.invalid"})
        assert engine.transact(Change(_doc().with_version(1), origin="control-plane")).ok
        assert engine.applied_document() is not None
        assert 1 in engine.state.revision_versions()
    finally:
        state_module._KEEP_REVISIONS = 100  # type: ignore[attr-defined]


def test_a_changed_config_file_on_a_managed_device_is_not_applied_at_start(
    engine: Engine, tmp_path: Path
) -> None:
    import yaml

    from trueup.startup.orchestrator import Orchestrator

    engine.state.write(CONTROL_PLANE_FILE, {"url": "https://cp.invalid"})
    assert engine.transact(Change(_doc().with_version(4), origin="control-plane")).ok
    config = tmp_path / "desired.yaml"
    config.write_text(yaml.safe_dump(base_document(routes=[])))
    orchestrator = Orchestrator(engine, config_path=str(config))
    orchestrator.load()
    orchestrator.subsystems()
    applied = engine.state.applied().to_json()
    assert applied["version"] == 4 and applied["origin"] == "control-plane"
    assert "managed by the control plane" in str(orchestrator.config_error)


def test_the_committed_revision_is_kept_as_its_file_would_parse(engine: Engine) -> None:
    assert engine.apply_document(_doc(routes=[])).ok
    kept = engine.applied_revision()
    version = int(engine.state.applied().version)
    record = engine.state.revision(version)
    assert kept is not None and record is not None
    assert kept == parse_document(record["document"])
    assert engine.applied_revision() is kept  # no second parse while the file is unchanged


def test_a_transaction_left_open_by_a_full_disk_is_closed_by_the_loop_once_space_returns(
    engine: Engine, kernel: FakeNetlink, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trueup.journal import journal as journal_module
    from trueup.reconcile.loop import ReconcileLoop

    assert engine.apply_document(_doc(routes=[])).ok
    before = _kernel_image(kernel)
    real_append = journal_module.append_line
    begun: list[str] = []

    def full_after_begin(path: Path, line: str) -> None:
        if begun:
            raise OSError(errno.ENOSPC, f"{path}: No space left on device")
        real_append(path, line)
        if '"type":"begin"' in line:
            begun.append(line)

    monkeypatch.setattr(journal_module, "append_line", full_after_begin)
    monkeypatch.setattr(StateDir, "set_applied", lambda self, record: full_after_begin(Path(), ""))
    with pytest.raises(StorageError) as failed:
        engine.apply_document(_doc())
    assert "stays open until the directory takes writes again" in str(failed.value)
    assert _kernel_image(kernel) == before
    assert engine.state.journal.open_transaction() is not None
    codes = [f["code"] for f in gather(engine)["reason_codes"]]
    assert ReasonCode.APPLY_NOT_COMPLETED.value in codes

    loop = ReconcileLoop(engine, clock=lambda: 1000.0)
    loop.run_pass()  # still full: it stays open, and a retry is due soon
    assert engine.state.journal.open_transaction() is not None
    assert loop._retry_after is not None and loop._retry_after <= 1000.0 + 2.0
    monkeypatch.undo()
    loop.run_pass()  # space is back: no write needed, the loop closes it
    assert engine.state.journal.open_transaction() is None
    last = engine.state.journal.last()
    assert last is not None and last.terminal is not None
    assert last.terminal["type"] == "rolled_back" and last.terminal["recovered"] is True
    assert engine.state.applied().version == 1
    assert _kernel_image(kernel) == before


# -- what recovery leaves reported, and what answers it -------------------------------------
def test_apply_not_completed_speaks_in_the_tense_of_what_happened_and_an_unchanged_apply_clears_it(
    engine: Engine, kernel: FakeNetlink, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Crash(BaseException):
        pass

    def crash_at_begin(point: str) -> None:
        if point == "begin":
            raise Crash

    assert engine.apply_document(_doc()).ok
    monkeypatch.setattr(faults, "hit", crash_at_begin)
    with pytest.raises(Crash):
        engine.apply_document(_doc(routes=[]))
    monkeypatch.undo()

    def not_completed() -> list[dict[str, Any]]:
        codes = gather(engine)["reason_codes"]
        return [f for f in codes if f["code"] == ReasonCode.APPLY_NOT_COMPLETED.value]

    # Before recovery: nothing is rolled back yet, and the text says so.
    (before,) = not_completed()
    assert "was not completed" in before["detail"] and "rolled back" not in before["detail"]
    assert (
        "rolled back" not in before["action"] and "Recovery will roll it back" in before["action"]
    )

    restarted = Engine(engine.state, netlink_factory=lambda: kernel)
    assert restarted.recover(actor="startup") is not None
    (after,) = not_completed()
    assert "rolled back at recovery" in after["detail"]
    assert after["action"].startswith("Recovery rolled the interrupted transaction back")

    # The corrective action: re-apply the document the system holds. Unchanged, and cleared.
    again = restarted.apply_document(_doc())
    assert again.ok and again.outcome == "unchanged"
    assert again.cleared and again.cleared[0].startswith("STATE_APPLY_NOT_COMPLETED cleared")
    assert again.to_json()["cleared"] == again.cleared
    assert not_completed() == []
    settled = [r for r in engine.state.audit.records() if r["details"].get("settles")]
    assert len(settled) == 1 and settled[0]["details"]["outcome"] == "unchanged"
    assert engine.state.applied().version == 1
    # Nothing left to clear: the next unchanged apply writes no transaction.
    count = len(engine.state.journal.transactions())
    assert restarted.apply_document(_doc()).cleared == []
    assert len(engine.state.journal.transactions()) == count


def test_a_restored_revision_replaces_a_local_override_even_with_the_same_document(
    engine: Engine,
) -> None:
    state = engine.state
    assert engine.transact(Change(_doc().with_version(1), origin="control-plane")).ok
    state.write(CONTROL_PLANE_FILE, {"url": "https://cp.invalid", "version": 1})
    local = _doc(routes=[])
    assert engine.apply_document(local, actor="cli:0", override="lab test").ok
    assert state.applied().override.reason == "lab test"
    restored = engine.transact(
        Change(local, kind="restore", origin="restore", actor="test", replaces_override=True)
    )
    assert restored.ok and restored.outcome == "committed"
    applied = state.applied().to_json()
    assert applied["origin"] == "restore" and applied["override"] is None
    assert gather(engine, control_plane_version=1)["versions"]["override"] is None
