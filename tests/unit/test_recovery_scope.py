"""Crash recovery's scope: one total union of every field, and what recovery puts back with it.

The engine is driven over fakes at the `system/` seam (netlink, files,
nftables); a crash is a journal `begin` with no terminal record, as a
SIGKILL leaves it.
"""

from __future__ import annotations

import json
import threading
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from tests.routers import base_document
from trueup.journal.state import StateDir
from trueup.model.document import DeviceState, parse_document
from trueup.model.reasons import ReasonCode
from trueup.reconcile.engine import Engine
from trueup.reconcile.engine import observe as observing
from trueup.reconcile.engine.converge import Policy, converge
from trueup.reconcile.status import drift_report, gather, last_reported_transaction
from trueup.subsystems.base import Scope
from trueup.subsystems.firewall import FirewallSubsystem
from trueup.subsystems.registry import default_subsystems, scope_for
from trueup.system.fake import FakeFiles, FakeNetlink, FakeNftables
from trueup.system.resolve import ResolveError

FORWARD = "/proc/sys/net/ipv4/ip_forward"

# One side of a union per field: a value unlike the default, and one unlike that.
# A field added to `Scope` and missing here fails the first test.
SIDES: dict[str, tuple[Any, Any]] = {
    "interfaces": (frozenset({"lan0"}), frozenset({"lan1"})),
    "tables": (frozenset({254}), frozenset({100})),
    "management_interface": ("mgmt0", "mgmt0"),
    "management_owned": (frozenset({"198.51.100.2/24"}), frozenset({"198.51.100.3/24"})),
    "management_default_routes": (
        frozenset({(254, "0.0.0.0/0", 0)}),
        frozenset({(254, "::/0", 1024)}),
    ),
    "exact": (False, True),
    "owned": (
        (("firewall", ("inet trueup",)), ("sysctl", ("net.ipv4.ip_forward",))),
        (("sysctl", ("net.ipv6.conf.all.forwarding",)), ("wireguard", ("wg0",))),
    ),
    "virtual_addresses": (frozenset({"203.0.113.254/24"}), frozenset({"203.0.113.253/24"})),
}


def _covers(merged: Any, part: Any) -> bool:
    if isinstance(part, frozenset):
        return part <= merged
    if isinstance(part, bool):  # exact: never widened (see the test below)
        return True
    if isinstance(part, tuple):  # owned: every subsystem's keys
        keys = {name: set(k) for name, k in merged}
        return all(set(k) <= keys.get(name, set()) for name, k in part)
    return bool(merged == part)


def test_every_scope_field_is_merged_by_the_union() -> None:
    names = {f.name for f in fields(Scope)}
    assert names == set(SIDES), f"Scope fields without a union case here: {names ^ set(SIDES)}"
    mine = Scope(**{name: a for name, (a, _) in SIDES.items()})
    theirs = Scope(**{name: b for name, (_, b) in SIDES.items()})
    merged = mine.union(theirs)
    for name, (a, b) in SIDES.items():
        value = getattr(merged, name)
        assert _covers(value, a) and _covers(value, b), (name, value)
    assert merged.keys_for("sysctl") == {"net.ipv4.ip_forward", "net.ipv6.conf.all.forwarding"}
    assert merged.keys_for("firewall") == {"inet trueup"}
    assert merged.keys_for("wireguard") == {"wg0"}
    # The union survives the journal's JSON.
    assert Scope.from_json(merged.to_json()) == merged
    # Exactness is this scope's: a journaled scope never makes a recovery remove what
    # trueup did not assign (a foreign address on the management interface).
    assert merged.exact is False and theirs.union(mine).exact is True


def test_management_addresses_on_another_interface_are_not_owned() -> None:
    mine = Scope(management_interface="mgmt0", management_owned=frozenset({"198.51.100.2/24"}))
    theirs = Scope(management_interface="mgmt1", management_owned=frozenset({"198.51.100.9/24"}))
    merged = mine.union(theirs)
    assert merged.management_interface == "mgmt0"
    assert merged.management_owned == {"198.51.100.2/24"}


# -- recovery over fakes --------------------------------------------------------

RULES = {
    "chains": [
        {
            "name": "input",
            "type": "filter",
            "hook": "input",
            "policy": "accept",
            "rules": ['iifname "mgmt0" tcp dport 7443 accept'],
        }
    ]
}


@pytest.fixture
def files() -> FakeFiles:
    return FakeFiles({FORWARD: "0\n"})


@pytest.fixture
def nft() -> FakeNftables:
    return FakeNftables()


@pytest.fixture
def kernel() -> FakeNetlink:
    return FakeNetlink({"mgmt0": 1500, "lan0": 1500})


@pytest.fixture
def engine(tmp_path: Path, files: FakeFiles, nft: FakeNftables, kernel: FakeNetlink) -> Engine:
    state = StateDir(tmp_path / "state")
    state.ensure()
    subsystems = [
        FirewallSubsystem(nft) if s.name == "firewall" else s for s in default_subsystems()
    ]
    return Engine(state, subsystems, netlink_factory=lambda: kernel, files=files, nft=nft)


def _doc(**spec: Any) -> DeviceState:
    return parse_document(base_document(routes=[], **spec))


def _crash_during(engine: Engine, document: DeviceState, kind: str = "apply") -> str:
    """A `begin` for `document` as `transact` writes it, and no terminal record."""
    previous = engine.applied_document()
    scope = scope_for(document, previous)
    with engine.sources() as net:
        before = observing.observe(engine, net, scope)
    return engine.state.journal.begin(
        kind=kind,
        version=document.metadata.version or 2,
        subsystems=[s.name for s in engine.subsystems],
        all_subsystems=[s.name for s in engine.subsystems],
        scope=scope.to_json(),
        before=before,
        previous_applied=engine.state.applied().to_json(),
    )


def _apply_partly(engine: Engine, document: DeviceState, names: set[str]) -> None:
    """What the killed transaction did before the kill: `names` converged to `document`."""
    scope = scope_for(document, engine.applied_document())
    with engine.sources() as net:
        for sub in engine.subsystems:
            if sub.name in names:
                converge(net, sub, sub.desired(document, scope), scope, policy=Policy.JOURNALED)


def test_recovery_removes_the_firewall_and_restores_a_sysctl_the_crash_added(
    engine: Engine, files: FakeFiles, nft: FakeNftables
) -> None:
    assert engine.apply_document(_doc()).ok
    new = _doc(firewall=RULES, sysctl={"net.ipv4.ip_forward": 1})
    _crash_during(engine, new)
    _apply_partly(engine, new, {"firewall", "sysctl"})
    assert ("inet", "trueup") in nft.ruleset and files.files[FORWARD] == "1\n"
    assert engine.recover() is not None
    assert ("inet", "trueup") not in nft.ruleset
    assert files.files[FORWARD] == "0\n"
    status = gather(engine)
    (finding,) = status["reason_codes"]
    assert finding["code"] == ReasonCode.APPLY_NOT_COMPLETED.value
    assert "incomplete" not in finding["detail"], finding["detail"]
    # Everything was converged back: in sync, so `drift` exits 0.
    assert drift_report(status)["in_sync"], drift_report(status)


def test_recovery_of_an_mtu_change_keeps_the_committed_firewall_without_blame(
    engine: Engine, nft: FakeNftables, kernel: FakeNetlink
) -> None:
    committed = _doc(firewall=RULES)
    assert engine.apply_document(committed).ok
    table = nft.ruleset[("inet", "trueup")]
    mtu = base_document(routes=[], firewall=RULES)
    mtu["spec"]["interfaces"][0]["mtu"] = 1300
    changed = parse_document(mtu)
    _crash_during(engine, changed)
    _apply_partly(engine, changed, {"links"})
    assert kernel.link_state["lan0"].mtu == 1300
    assert engine.recover() is not None
    assert kernel.link_state["lan0"].mtu == 1400
    assert nft.ruleset[("inet", "trueup")] == table
    history = engine.state.journal.transactions()[-1].summary()["history"]
    (closed,) = [r for r in history if r["type"] == "rolled_back"]
    assert closed["errors"] == [], closed["errors"]


def test_an_interrupted_heal_is_reported_until_a_heal_commits(
    engine: Engine, kernel: FakeNetlink
) -> None:
    document = _doc()
    assert engine.apply_document(document).ok
    applied = engine.applied_document()
    assert applied is not None
    kernel.del_address("lan0", "203.0.113.1/24")
    _crash_during(engine, applied, kind="reconcile")
    assert engine.recover() is not None
    assert "203.0.113.1/24" in {a.prefix for a in kernel.addrs if a.ifname == "lan0"}
    findings = gather(engine)["reason_codes"]
    assert [f["code"] for f in findings] == [ReasonCode.APPLY_NOT_COMPLETED.value]
    assert "heal" in findings[0]["detail"] and "was interrupted" in findings[0]["detail"]
    # An ordinary heal that commits afterwards closes the report.
    kernel.del_address("lan0", "203.0.113.1/24")
    healed = engine.apply_document(applied, kind="reconcile", origin="reconcile")
    assert healed.ok and healed.outcome == "committed"
    assert last_reported_transaction(engine.state.journal.transactions()) is not None
    assert gather(engine)["reason_codes"] == []


class _PreparingFirewall(FirewallSubsystem):
    """A firewall whose preparation can be made to fail (an unanswered lookup) or hang."""

    failure: Exception | None = None
    hold: threading.Event | None = None

    def prepare(self, document: DeviceState) -> None:
        if self.hold is not None:
            self.hold.wait(60.0)
        if self.failure is not None:
            raise self.failure
        super().prepare(document)


def _engine_with(
    tmp_path: Path, files: FakeFiles, nft: FakeNftables, kernel: FakeNetlink
) -> tuple[Engine, _PreparingFirewall]:
    state = StateDir(tmp_path / "state")
    state.ensure()
    firewall = _PreparingFirewall(nft)
    subsystems = [firewall if s.name == "firewall" else s for s in default_subsystems()]
    engine = Engine(state, subsystems, netlink_factory=lambda: kernel, files=files, nft=nft)
    return engine, firewall


def _crash_mtu_change(engine: Engine, kernel: FakeNetlink, **spec: Any) -> None:
    assert engine.apply_document(_doc(firewall=RULES, **spec)).ok
    mtu = base_document(routes=[], firewall=RULES, **spec)
    mtu["spec"]["interfaces"][0]["mtu"] = 1300
    changed = parse_document(mtu)
    _crash_during(engine, changed)
    _apply_partly(engine, changed, {"links"})
    assert kernel.link_state["lan0"].mtu == 1300


def test_a_preparation_that_raises_fails_its_subsystem_and_recovery_still_closes(
    tmp_path: Path, files: FakeFiles, nft: FakeNftables, kernel: FakeNetlink
) -> None:
    engine, firewall = _engine_with(tmp_path, files, nft, kernel)
    _crash_mtu_change(engine, kernel)
    # A lookup that does not answer raises a RuntimeError (`ResolveError`), not a step error.
    firewall.failure = ResolveError("cannot resolve peer.example.test: no answer")
    closed = engine.recover()
    assert closed is not None
    assert kernel.link_state["lan0"].mtu == 1400
    assert engine.state.journal.open_transaction() is None
    history = engine.state.journal.transactions()[-1].summary()["history"]
    (rolled_back,) = [r for r in history if r["type"] == "rolled_back"]
    assert any("firewall" in e and "no answer" in e for e in rolled_back["errors"]), rolled_back


def test_a_hanging_preparation_is_bounded_by_its_deadline_in_recovery(
    tmp_path: Path, files: FakeFiles, nft: FakeNftables, kernel: FakeNetlink
) -> None:
    engine, firewall = _engine_with(tmp_path, files, nft, kernel)
    _crash_mtu_change(engine, kernel, convergence={"deadlines": {"firewall": 0.5}})
    firewall.hold = threading.Event()
    try:
        closed = engine.recover()
    finally:
        firewall.hold.set()
    assert closed is not None
    assert kernel.link_state["lan0"].mtu == 1400
    history = engine.state.journal.transactions()[-1].summary()["history"]
    (rolled_back,) = [r for r in history if r["type"] == "rolled_back"]
    assert any("firewall" in e and "deadline" in e for e in rolled_back["errors"]), rolled_back


def test_recovery_never_removes_a_foreign_management_address_whatever_the_journal_says(
    engine: Engine, kernel: FakeNetlink
) -> None:
    assert engine.apply_document(_doc()).ok
    kernel.add_address("mgmt0", "192.0.2.77/24")  # the console's, not trueup's
    changed = base_document(routes=[])
    changed["spec"]["interfaces"][0]["mtu"] = 1300
    txn = _crash_during(engine, parse_document(changed))
    # A journal whose scope says exact (a rollback's), hand-edited or from another version.
    records = [json.loads(line) for line in engine.state.journal.path.read_text().splitlines()]
    for record in records:
        if record.get("txn") == txn and record.get("type") == "begin":
            record["scope"]["exact"] = True
    engine.state.journal.path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert engine.recover() is not None
    assert "192.0.2.77/24" in {a.prefix for a in kernel.addrs if a.ifname == "mgmt0"}
