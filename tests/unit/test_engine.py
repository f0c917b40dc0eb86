"""Transactions over a FakeNetlink: journal records, rollback, recovery, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.routers import base_document
from trueup.journal.state import StateDir
from trueup.model.document import parse_document
from trueup.model.reasons import ReasonCode
from trueup.reconcile.changes import Refused, UnknownRevision
from trueup.reconcile.engine import Engine
from trueup.reconcile.engine import observe as observing
from trueup.reconcile.status import gather
from trueup.subsystems.base import Scope
from trueup.system.fake import FakeNetlink
from trueup.system.netlink import NetlinkError


@pytest.fixture
def kernel() -> FakeNetlink:
    return FakeNetlink({"mgmt0": 1500, "lan0": 1500})


@pytest.fixture
def engine(tmp_path: Path, kernel: FakeNetlink) -> Engine:
    state = StateDir(tmp_path / "state")
    state.ensure()
    return Engine(state, netlink_factory=lambda: kernel)


def _journal(engine: Engine) -> list[str]:
    return [t.summary()["state"] for t in engine.state.journal.transactions()]


def test_apply_records_begin_applied_commit(engine: Engine, kernel: FakeNetlink) -> None:
    result = engine.apply_document(parse_document(base_document()))
    assert result.ok and result.version == 1 and result.outcome == "committed"
    records = [r["type"] for r in engine.state.journal.transactions()[0].records]
    assert records == ["begin", "applied", "applied", "applied", "applied", "commit"]
    begin = engine.state.journal.transactions()[0].begin
    assert begin["before"]["addresses"] == {"spec.interfaces[lan0].addresses": []}
    assert {a.prefix for a in kernel.addrs} >= {"198.51.100.2/24", "203.0.113.1/24"}
    again = engine.apply_document(parse_document(base_document()))
    assert again.outcome == "unchanged" and len(_journal(engine)) == 1


def test_atomic_failure_restores_before_images(engine: Engine, kernel: FakeNetlink) -> None:
    engine.apply_document(parse_document(base_document()))
    before = (
        sorted(kernel.addrs, key=str),
        sorted(kernel.route_table, key=str),
        dict(kernel.link_state),
    )
    kernel.fail_on["add route to 192.0.2.128/25"] = NetlinkError("add route", "Network is down")
    bad = base_document(
        interfaces=[{"name": "lan0", "mtu": 1300, "addresses": ["203.0.113.5/24"]}],
        routes=[{"to": "192.0.2.128/25", "via": "203.0.113.254"}],
    )
    result = engine.apply_document(parse_document(bad))
    assert not result.ok and result.outcome == "rolled_back"
    assert "Network is down" in result.failed["routes"]
    assert (
        sorted(kernel.addrs, key=str),
        sorted(kernel.route_table, key=str),
        dict(kernel.link_state),
    ) == before
    assert engine.state.applied().version == 1


def test_best_effort_keeps_successes_and_reports_partial(
    engine: Engine, kernel: FakeNetlink
) -> None:
    kernel.fail_on["add route"] = NetlinkError("add route", "Network is down")
    result = engine.apply_document(parse_document(base_document()), mode="best-effort")
    assert result.outcome == "partial" and set(result.failed) == {"routes", "management"}
    status = gather(engine)
    codes = {(f["code"], f["subsystem"]) for f in status["reason_codes"]}
    assert (ReasonCode.PARTIAL_UPDATE.value, "routes") in codes


def test_refusals_change_nothing_and_are_audited(engine: Engine, kernel: FakeNetlink) -> None:
    engine.apply_document(parse_document(base_document()))
    calls = len(kernel.calls)
    with pytest.raises(Refused) as stale:
        engine.apply_document(parse_document(base_document(routes=[])), expect_version=0)
    assert stale.value.code is ReasonCode.CONCURRENT_MODIFICATION
    old = base_document()
    old["metadata"]["version"] = 1
    changed = base_document(routes=[])
    changed["metadata"]["version"] = 1
    with pytest.raises(Refused) as same_version:
        engine.apply_document(parse_document(changed))
    assert same_version.value.code is ReasonCode.VERSION_SKEW
    assert len(kernel.calls) == calls
    events = [r["event"] for r in engine.state.audit.records()]
    assert events.count("refused") == 2
    with engine.state.writer_lock("test"), pytest.raises(Refused) as busy:
        engine.apply_document(parse_document(base_document(routes=[])))
    assert busy.value.code is ReasonCode.CONCURRENT_MODIFICATION


def test_recovery_rolls_back_an_open_transaction(engine: Engine, kernel: FakeNetlink) -> None:
    engine.apply_document(parse_document(base_document()))
    snapshot = sorted(kernel.addrs, key=str)
    # Simulate a crash: a begin with a before-image, some changes, no terminal record.
    scope_json = json.loads(json.dumps(engine.state.journal.transactions()[0].begin["scope"]))
    before = engine.state.journal.transactions()[0].begin["before"]
    with engine.sources() as net:
        current = observing.observe(engine, net, Scope.from_json(scope_json))
    txn = engine.state.journal.begin(
        kind="apply",
        version=2,
        subsystems=["addresses"],
        scope=scope_json,
        before=current,
        previous_applied=engine.state.applied().to_json(),
    )
    kernel.add_address("lan0", "203.0.113.99/24")
    assert before  # the first transaction's image exists too
    assert gather(engine)["reason_codes"][0]["code"] == ReasonCode.APPLY_NOT_COMPLETED.value
    recovered = engine.recover()
    assert recovered is not None and recovered.txn == txn
    assert sorted(kernel.addrs, key=str) == snapshot
    findings = gather(engine)["reason_codes"]
    assert [f["code"] for f in findings] == [ReasonCode.APPLY_NOT_COMPLETED.value]
    assert "rolled back" in findings[0]["detail"]


def test_rollback_to_previous_revision(engine: Engine, kernel: FakeNetlink) -> None:
    engine.apply_document(parse_document(base_document()))
    engine.apply_document(parse_document(base_document(interfaces=[{"name": "lan0"}], routes=[])))
    assert not [a for a in kernel.addrs if a.ifname == "lan0"]
    result = engine.rollback_to(None)
    assert result.ok and result.version == 3
    assert {a.prefix for a in kernel.addrs if a.ifname == "lan0"} == {
        "203.0.113.1/24",
        "2001:db8:1::1/64",
    }
    with pytest.raises(UnknownRevision, match="no accepted revision 42"):
        engine.rollback_to(42)
    assert engine.state.applied().version == 3


def test_agent_refuses_an_unsafe_apply_before_its_loop_runs(engine: Engine) -> None:
    from trueup.agent.process import Agent

    engine.apply_document(parse_document(base_document()))
    agent = Agent(engine.state.root)
    moved = base_document()
    moved["spec"]["management"]["addresses"] = ["198.51.100.9/24"]
    result = agent.requests.apply(parse_document(moved))
    assert result["ok"] is False and result["outcome"] == "refused"
    assert "removes management address 198.51.100.2/24" in result["message"]
    assert engine.state.applied().version == 1
    assert [r["event"] for r in engine.state.audit.records()][-1] == "apply_refused"


def test_kinds_and_outcomes_are_written_as_their_strings(engine: Engine) -> None:
    from trueup.reconcile.changes import Change, Kind, Outcome

    change = Change(parse_document(base_document()), kind="apply")  # type: ignore[arg-type]
    assert change.kind is Kind.APPLY  # a string read from a file becomes the enum
    result = engine.transact(change)
    assert result.outcome is Outcome.COMMITTED
    (txn,) = engine.state.journal.transactions()
    assert txn.begin["kind"] == "apply" and txn.terminal is not None
    assert txn.terminal["outcome"] == "committed"
    raw = engine.state.journal.path.read_text()
    assert '"kind": "apply"' in raw or '"kind":"apply"' in raw
    assert [r["event"] for r in engine.state.audit.records()][-1] == "apply"


def test_an_apply_result_reads_back_what_its_wire_form_says(engine: Engine) -> None:
    from trueup.reconcile.changes import ApplyResult

    result = engine.apply_document(parse_document(base_document()))
    body = result.to_json()
    back = ApplyResult.from_json(json.loads(json.dumps(body)))
    assert back.to_json() == body
    assert back.ok and back.outcome == result.outcome and back.steps == result.steps
    assert back.steps and all(isinstance(s, str) for s in back.steps)


def test_the_management_only_policy_converges_nothing_but_management(
    engine: Engine, kernel: FakeNetlink
) -> None:
    from trueup.reconcile.engine.converge import Policy, converge, converge_management
    from trueup.subsystems.registry import scope_for

    document = parse_document(base_document())
    scope = scope_for(document)
    addresses = engine.by_name["addresses"]
    with engine.sources() as net, pytest.raises(ValueError, match="only management"):
        converge(
            net, addresses, addresses.desired(document, scope), scope,
            policy=Policy.MANAGEMENT_ONLY,
        )  # fmt: skip
    assert not any(a.ifname == "lan0" for a in kernel.addrs)
    done = converge_management(engine, document, actor="startup", source="test")
    assert done.steps and done.audit_problem is None
    assert {a.prefix for a in kernel.addrs if a.ifname == "mgmt0"} == {"198.51.100.2/24"}
    assert not any(a.ifname == "lan0" for a in kernel.addrs)
    (line,) = [r for r in engine.state.audit.records() if r["event"] == "management_restored"]
    assert line["details"]["source"] == "test" and line["details"]["steps"] == done.described()
    again = converge_management(engine, document, actor="startup")
    assert again.steps == []  # already there: nothing run, nothing audited
    assert (
        len([r for r in engine.state.audit.records() if r["event"] == "management_restored"]) == 1
    )


def test_the_engine_is_functions_over_a_run_value_not_a_class_hierarchy() -> None:
    import ast

    import trueup.reconcile.engine as package

    assert Engine.__bases__ == (object,)  # no mixins
    root = Path(package.__file__).parent
    too_long: list[str] = []
    for path in sorted(root.glob("*.py")):
        text = path.read_text()
        if text.count("\n") > 600:
            too_long.append(f"{path.name} ({text.count(chr(10))} lines)")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                lines = node.end_lineno - node.lineno + 1
                if lines > 100:
                    too_long.append(f"{path.name}:{node.name} ({lines} lines)")
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                # Imports only: no method stubs re-declared for a type checker.
                assert all(isinstance(n, ast.Import | ast.ImportFrom) for n in node.body), path
    assert not too_long, too_long


def _agent_answers(engine: Engine) -> list[dict[str, object]]:
    """Every answer the agent gives where an `ApplyResult` is expected, beside `to_json`'s."""
    from trueup.reconcile.confirmwait import refusal
    from trueup.reconcile.healer import PassReport

    return [
        refusal(engine.state, "management would be lost"),
        {"ok": True, "outcome": "nothing applied"},  # `Requests.reconcile_now` before any apply
        PassReport(skipped="nothing applied").reconcile_answer([], 0, breakers_closed=[]),
        PassReport(healed={"addresses": ["add"]}).reconcile_answer(
            ["addresses"], 1, breakers_closed=[]
        ),
        PassReport().reconcile_answer(["addresses"], 1, breakers_closed=[]),
        PassReport(failed={"addresses": "no"}).reconcile_answer(
            ["addresses"], 1, breakers_closed=[]
        ),
    ]


def test_an_apply_result_reads_every_outcome_the_agent_answers(engine: Engine) -> None:
    from trueup.reconcile.changes import ApplyResult, Outcome

    for outcome in Outcome:
        back = ApplyResult.from_json({"ok": True, "version": 3, "outcome": outcome.value})
        assert back.outcome is outcome and back.to_json()["outcome"] == outcome.value
    answers = _agent_answers(engine)
    read = [ApplyResult.from_json(json.loads(json.dumps(a))) for a in answers]
    assert [r.outcome.value for r in read] == [a["outcome"] for a in answers]
    assert {r.outcome for r in read} >= {
        Outcome.REFUSED,
        Outcome.NOTHING_APPLIED,
        Outcome.RECONCILED,
        Outcome.IN_SYNC,
        Outcome.FAILED,
    }


def test_a_mode_is_one_of_its_strings_and_nothing_else(engine: Engine) -> None:
    from trueup.reconcile.changes import Change, Mode

    document = parse_document(base_document())
    assert Change.apply(document, mode="best-effort").mode is Mode.BEST_EFFORT
    assert Change.apply(document, mode="atomic").mode is Mode.ATOMIC
    assert Change.apply(document).mode is Mode.ATOMIC
    with pytest.raises(ValueError, match="mode 'best_effort': expected atomic or best-effort"):
        Change.apply(document, mode="best_effort")
    with pytest.raises(ValueError, match="expected atomic or best-effort"):
        Change(document, mode="atomc")  # type: ignore[arg-type]
    assert not engine.state.journal.transactions()  # refused before anything was written
    result = engine.transact(Change.apply(document, mode="best-effort"))
    assert engine.state.journal.transactions()[0].begin["mode"] == "best-effort"
    assert result.ok


def test_apply_document_builds_applies_and_heals_only(engine: Engine) -> None:
    from trueup.reconcile.changes import Kind

    document = parse_document(base_document())
    assert engine.apply_document(document).ok
    healed = engine.apply_document(document, kind=Kind.RECONCILE)
    assert healed.ok
    with pytest.raises(ValueError, match="kind rollback: build it with its Change constructor"):
        engine.apply_document(document, kind=Kind.ROLLBACK)
