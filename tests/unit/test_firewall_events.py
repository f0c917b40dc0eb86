"""Firewall drift proven by `nft monitor` lines, before the pass lists the table (fake nftables)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from tests.routers import base_document
from tests.unit.test_firewall import CANONICAL, SAFE, _dport, _firewall
from trueup.journal.state import StateDir
from trueup.model.document import parse_document
from trueup.reconcile.engine import Engine
from trueup.reconcile.healing import HealingOptions
from trueup.reconcile.loop import ReconcileLoop
from trueup.reconcile.requests import Requests
from trueup.subsystems.firewall import FirewallSubsystem
from trueup.subsystems.firewall.monitor import prove
from trueup.subsystems.registry import default_subsystems
from trueup.system.events import FakeEventSource, NetlinkEvent
from trueup.system.fake import FakeNetlink, FakeNftables

ADD = "add rule inet trueup input tcp dport 23 accept"


def _gen(number: int) -> str:
    return f"# new generation {number} by process 4242 (nft)"


def test_only_rules_only_added_or_only_deleted_above_the_mark_prove_a_change() -> None:
    numbered = list(enumerate([ADD, _gen(8)], start=1))
    assert prove(7, numbered).chains == ("input",) and prove(7, numbered).seqs == (1,)
    assert prove(8, numbered).chains == ()  # already in the listing the mark names
    deleted = list(enumerate(["delete rule inet trueup input handle 9", _gen(8)], start=1))
    assert prove(7, deleted).chains == ("input",)
    # trueup's own load: the table is deleted and re-created, which proves nothing.
    own = ["add table inet trueup", "delete table inet trueup", "add table inet trueup",
           "add chain inet trueup input { type filter hook input priority filter; }",
           ADD, _gen(8)]  # fmt: skip
    assert prove(7, list(enumerate(own, start=1))) == prove(7, [])
    # A replaced rule (deleted and added with its handle) may be the same rule again.
    replaced = ["delete rule inet trueup input handle 9", ADD, _gen(8)]
    assert not prove(7, list(enumerate(replaced, start=1))).chains
    # Added then deleted by someone: mixed, the pass decides.
    mixed = [ADD, _gen(8), "delete rule inet trueup input handle 12", _gen(9)]
    assert not prove(7, list(enumerate(mixed, start=1))).chains
    # Other tables and similar names are not trueup's.
    other = ["add rule inet trueupx input drop", "add rule ip nat post masquerade", _gen(8)]
    assert not prove(7, list(enumerate(other, start=1))).chains
    # The transaction's closing line has not arrived yet: pending, not proven.
    assert prove(7, [(1, ADD)]).pending and not prove(7, [(1, ADD)]).chains


class Rig:
    def __init__(self, tmp_path: Path) -> None:
        self.nft = FakeNftables()
        self.nft.canonical.update(CANONICAL)
        state = StateDir(tmp_path / "state")
        state.ensure()
        kernel = FakeNetlink({"mgmt0": 1500, "lan0": 1500})
        subsystems = [
            FirewallSubsystem(self.nft) if s.name == "firewall" else s for s in default_subsystems()
        ]
        self.engine = Engine(state, subsystems, netlink_factory=lambda: kernel, nft=self.nft)
        self.events = FakeEventSource()
        self.loop = ReconcileLoop(
            self.engine,
            options=HealingOptions(jitter=0.0),
            events=self.events,
            rng=random.Random(4),
        )
        self.events.start(self.loop._on_event)

    def apply(self, firewall: dict[str, Any], policy: str = "notify") -> None:
        spec: dict[str, Any] = {"firewall": firewall, "convergence": {"default": policy}}
        document = parse_document(base_document(routes=[], **spec))
        assert Requests(self.engine, lambda: self.loop).apply(document, actor="test")["ok"]

    def monitor(self, *lines: str) -> None:
        for line in lines:
            self.events.emit(NetlinkEvent("command", "nft", 0.0, detail={"line": line}))

    def drift(self) -> dict[str, Any] | None:
        record = self.loop.drifts.book.get("firewall")
        return None if record is None else record.to_json()


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    rig = Rig(tmp_path)
    rig.apply(SAFE)
    assert not rig.loop.run_pass().drift.get("firewall")  # in sync, at an exact generation
    return rig


def test_a_rule_someone_adds_is_recorded_from_the_monitor_and_is_real(rig: Rig) -> None:
    listings = rig.nft.listings
    rig.nft.add_rule("inet", "trueup", "input", [_dport(23), {"accept": None}])
    rig.monitor(ADD, _gen(rig.nft.gen))
    rig.loop._record_proven_drift()
    record = rig.drift()
    assert record is not None and record["detected_by"] == "event"
    assert record["paths"] == ["spec.firewall.chains[input].rules"]
    assert record["attribution"][0]["line"] == ADD
    assert rig.nft.listings == listings  # recorded without listing the table
    # The pass confirms it: the table really differs, and the record keeps its origin.
    report = rig.loop.run_pass()
    assert report.drift["firewall"] == ["spec.firewall.chains[input].rules[2]"]
    confirmed = rig.drift()
    assert confirmed is not None and confirmed["detected_by"] == "event"
    assert confirmed["since"] == record["since"]


def test_trueups_own_apply_and_heal_record_no_drift(rig: Rig) -> None:
    # A new document: trueup's load deletes and re-creates the table.
    rig.apply(_firewall("ct state established,related accept",
                        'iifname "mgmt0" tcp dport 7443 accept', "tcp dport 22 accept"))  # fmt: skip
    rig.monitor("add table inet trueup", "delete table inet trueup", "add table inet trueup",
                "add rule inet trueup input tcp dport 22 accept", _gen(rig.nft.gen))  # fmt: skip
    rig.loop._record_proven_drift()
    assert rig.drift() is None
    assert not rig.loop.run_pass().drift["firewall"]
    # Even lines that arrive late, after the pass that saw trueup's load, prove nothing.
    rig.monitor("delete table inet trueup", "add table inet trueup", ADD, _gen(rig.nft.gen))
    rig.loop._record_proven_drift()
    assert rig.drift() is None


def test_a_heal_under_auto_is_not_drift_again(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.apply(SAFE, policy="auto")
    assert not rig.loop.run_pass().drift["firewall"]
    rig.nft.add_rule("inet", "trueup", "input", [_dport(23), {"accept": None}])
    rig.monitor(ADD, _gen(rig.nft.gen))
    rig.loop._record_proven_drift()
    assert rig.drift() is not None
    report = rig.loop.run_pass()  # confirms and heals: trueup reloads the table
    assert report.healed.get("firewall") or report.drift["firewall"]
    rig.monitor("delete table inet trueup", "add table inet trueup", _gen(rig.nft.gen))
    assert not rig.loop.run_pass().drift["firewall"]
    assert rig.drift() is None
    rig.loop._record_proven_drift()
    assert rig.drift() is None
