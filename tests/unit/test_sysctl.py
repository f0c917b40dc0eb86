"""The worked example subsystem (sysctl) on fake sources: section, facts, plan, steps, rollback."""

from __future__ import annotations

import errno
import re
from pathlib import Path

import pytest

from tests.routers import base_document
from trueup.journal.state import StateDir
from trueup.model.document import DocumentError, json_schema, parse_document
from trueup.reconcile.engine import Engine
from trueup.subsystems.registry import default_subsystems, scope_for
from trueup.subsystems.sysctl import SysctlSubsystem
from trueup.system.fake import FakeFiles, FakeNetlink
from trueup.system.sources import Sources

FORWARD = "/proc/sys/net/ipv4/ip_forward"
RP_FILTER = "/proc/sys/net/ipv4/conf/all/rp_filter"


@pytest.fixture
def files() -> FakeFiles:
    return FakeFiles({FORWARD: "0\n", RP_FILTER: "2\n"})


@pytest.fixture
def engine(tmp_path: Path, files: FakeFiles) -> Engine:
    state = StateDir(tmp_path / "state")
    state.ensure()
    kernel = FakeNetlink({"mgmt0": 1500, "lan0": 1500})
    return Engine(state, netlink_factory=lambda: kernel, files=files)


def test_the_section_is_registered_validated_and_in_the_schema() -> None:
    document = parse_document(base_document(sysctl={"net.ipv4.ip_forward": 1}))
    assert document.spec.section("sysctl").root == {"net.ipv4.ip_forward": "1"}
    assert document.canonical()["spec"]["sysctl"] == {"net.ipv4.ip_forward": "1"}
    with pytest.raises(DocumentError) as bad:
        parse_document(
            base_document(sysctl={"net/ipv4": 1, "net.ipv4.ip_forward": ""}, interfaces=[{}])
        )
    problems = bad.value.problems
    assert any(p.startswith("spec.sysctl.net/ipv4") and "not a sysctl name" in p for p in problems)
    assert any("empty sysctl value" in p for p in problems)
    assert any(p.startswith("spec.interfaces[0].name") for p in problems), problems
    schema = json_schema()
    assert "sysctl" in schema["$defs"]["DeviceSpec"]["properties"]
    assert schema["$defs"]["DeviceSpec"]["additionalProperties"] is False


def test_facts_plan_and_steps_on_fake_files(files: FakeFiles) -> None:
    sub = SysctlSubsystem()
    document = parse_document(
        base_document(sysctl={"net.ipv4.ip_forward": 1, "net.ipv4.conf.all.rp_filter": "2"})
    )
    scope = scope_for(document)
    assert scope.keys_for("sysctl") == {"net.ipv4.ip_forward", "net.ipv4.conf.all.rp_filter"}
    sources = Sources(FakeNetlink(), files)
    desired = sub.desired(document, scope)
    observed = sub.observe(sources, scope)
    assert observed == {
        "spec.sysctl[net.ipv4.ip_forward]": "0",
        "spec.sysctl[net.ipv4.conf.all.rp_filter]": "2",
    }
    plan = sub.plan(desired, observed, scope)
    assert [s.describe() for s in plan.steps] == [
        "sysctl: set-sysctl name=net.ipv4.ip_forward value=1 (spec.sysctl[net.ipv4.ip_forward])"
    ]
    sub.execute(sources, plan.steps[0])
    assert files.writes == [(FORWARD, "1\n")]
    assert not sub.plan(desired, sub.observe(sources, scope), scope).changes


def test_apply_rollback_and_an_unknown_name(engine: Engine, files: FakeFiles) -> None:
    assert engine.apply_document(parse_document(base_document(routes=[]))).ok
    result = engine.apply_document(
        parse_document(base_document(routes=[], sysctl={"net.ipv4.ip_forward": 1}))
    )
    assert result.ok and files.files[FORWARD] == "1\n"
    # Dropping the section releases the name: it is left as it is.
    assert engine.apply_document(parse_document(base_document(routes=[]))).ok
    assert files.files[FORWARD] == "1\n"
    # A name this kernel lacks fails the transaction atomically, naming it; the
    # value already written is put back from the before-image.
    bad = base_document(routes=[], sysctl={"net.ipv4.ip_forward": 0, "net.no.such": 1})
    result = engine.apply_document(parse_document(bad))
    assert not result.ok and result.outcome == "rolled_back"
    assert "no sysctl net.no.such on this kernel" in result.failed["sysctl"]
    assert (FORWARD, "0\n") in files.writes
    assert files.files[FORWARD] == "1\n"
    # A write the kernel refuses is a step error with the path, not a crash.
    files.fail_on[FORWARD] = OSError(errno.EACCES, f"{FORWARD}: Permission denied")
    refused = engine.apply_document(
        parse_document(base_document(routes=[], sysctl={"net.ipv4.ip_forward": 0}))
    )
    assert not refused.ok and "Permission denied" in refused.failed["sysctl"]


def test_every_registered_subsystem_is_in_the_independence_contract() -> None:
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    contract = pyproject.split('name = "Subsystems never import each other"', 1)[1]
    listed = re.findall(r'"(trueup\.subsystems\.[\w.]+)"', contract.split("]", 1)[0])
    for sub in default_subsystems():
        module = type(sub).__module__  # a module, or a module of a listed package
        assert any(module == m or module.startswith(m + ".") for m in listed), (
            f"{module} missing from the independence contract"
        )


def test_one_subsystem_that_cannot_be_observed_stops_nothing_else(
    engine: Engine, files: FakeFiles
) -> None:
    """A file the kernel refuses to show fails sysctl alone: the others apply and report."""
    from trueup.reconcile.status import gather

    class Unreadable(FakeFiles):
        def read(self, path: str) -> str | None:
            if path == FORWARD:
                raise PermissionError(13, f"{path}: Permission denied")
            return super().read(path)

    engine.files = Unreadable(files.files)
    document = base_document(sysctl={"net.ipv4.ip_forward": 1})
    result = engine.apply_document(parse_document(document), mode="best-effort")
    assert result.outcome == "partial"
    assert "cannot observe sysctl" in result.failed["sysctl"]
    assert "addresses" not in result.failed
    status = gather(engine)
    assert status["subsystems"]["sysctl"]["health"] == "failed"
    assert "Permission denied" in status["subsystems"]["sysctl"]["reason"]
    assert status["subsystems"]["addresses"]["health"] == "ok"
    plans = {p.subsystem: p for p in engine.plan(parse_document(document))}
    assert "cannot observe sysctl" in plans["sysctl"].noop_reasons[0]
