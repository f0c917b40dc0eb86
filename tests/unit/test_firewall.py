"""The firewall subsystem on fake nftables: section, canonical facts, plan, guard, rollback, status."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.routers import base_document
from trueup.journal.state import StateDir
from trueup.model.document import DocumentError, parse_document
from trueup.reconcile.changes import NeedsConfirmation
from trueup.reconcile.engine import Engine
from trueup.reconcile.status import gather
from trueup.subsystems.firewall import FirewallError, FirewallSubsystem
from trueup.subsystems.firewall.canonical import batch, facts_from_objects
from trueup.subsystems.firewall.risks import management_findings
from trueup.subsystems.registry import default_subsystems, scope_for
from trueup.system.fake import FakeNetlink, FakeNftables
from trueup.system.sources import Sources
from trueup.system.watches import event_source_for

# Canonical expressions as nft 1.0 lists them (`nft -j list table`).
EST = [
    {"match": {"op": "in", "left": {"ct": {"key": "state"}}, "right": ["established", "related"]}},
    {"accept": None},
]
IIF_MGMT = {"match": {"op": "==", "left": {"meta": {"key": "iifname"}}, "right": "mgmt0"}}


def _dport(port: Any) -> dict[str, Any]:
    left = {"payload": {"protocol": "tcp", "field": "dport"}}
    return {"match": {"op": "==", "left": left, "right": port}}


CANONICAL = {
    "ct state established,related accept": EST,
    'iifname "mgmt0" tcp dport 7443 accept': [IIF_MGMT, _dport(7443), {"accept": None}],
    "tcp dport 7443 drop": [_dport(7443), {"drop": None}],
    "tcp dport 22 accept": [_dport(22), {"accept": None}],
    "jump admin": [{"jump": {"target": "admin"}}],
}


def _firewall(*rules: str, policy: str = "drop", admin: tuple[str, ...] = ()) -> dict[str, Any]:
    chains: list[dict[str, Any]] = [
        {"name": "input", "type": "filter", "hook": "input", "policy": policy, "rules": list(rules)}
    ]
    if admin:
        chains.append({"name": "admin", "rules": list(admin)})
    return {
        "sets": [{"name": "ops", "type": "ipv4_addr", "elements": ["192.0.2.7"]}],
        "chains": chains,
    }


def _only_trueup(commands: list[dict[str, Any]]) -> bool:
    """Every command of a batch names table inet trueup, and nothing else."""
    for command in commands:
        ((kind, body),) = next(iter(command.values())).items()
        table = body["name"] if kind == "table" else body["table"]
        if (body["family"], table) != ("inet", "trueup"):
            return False
    return True


SAFE = _firewall("ct state established,related accept", 'iifname "mgmt0" tcp dport 7443 accept')


@pytest.fixture
def nft() -> FakeNftables:
    fake = FakeNftables()
    fake.canonical.update(CANONICAL)
    fake.ruleset[("ip", "nat")] = [{"table": {"family": "ip", "name": "nat"}}]
    return fake


@pytest.fixture
def engine(tmp_path: Path, nft: FakeNftables) -> Engine:
    state = StateDir(tmp_path / "state")
    state.ensure()
    kernel = FakeNetlink({"mgmt0": 1500, "lan0": 1500})
    subsystems = [
        FirewallSubsystem(nft) if s.name == "firewall" else s for s in default_subsystems()
    ]
    return Engine(state, subsystems, netlink_factory=lambda: kernel, nft=nft)


def _doc(firewall: dict[str, Any] | None = None, **spec: Any) -> Any:
    extra = {"firewall": firewall} if firewall is not None else {}
    return parse_document(base_document(routes=[], **extra, **spec))


def test_the_section_names_problems_at_their_document_paths() -> None:
    with pytest.raises(DocumentError) as bad:
        _doc(_firewall("tcp dport 22 accept", "accept; flush ruleset", "drop\nflush ruleset"))
    problems = bad.value.problems
    assert any(
        p.startswith("spec.firewall.chains[input].rules[1]: a rule is one line") for p in problems
    )
    assert any(p.startswith("spec.firewall.chains[input].rules[2]") for p in problems), problems
    with pytest.raises(DocumentError) as bad:
        _doc({"chains": [{"name": "input", "hook": "input"}, {"name": "x", "policy": "dorp"}]})
    text = "\n".join(bad.value.problems)
    assert "base chain has both type and hook" in text and "spec.firewall.chains[1].policy" in text
    section = _doc(_firewall("tcp   dport 22  accept")).spec.section("firewall")
    assert section.chains[0].rules == ["tcp dport 22 accept"]  # whitespace normalised


def test_facts_are_nft_canonical_and_plan_is_one_step(nft: FakeNftables) -> None:
    sub = FirewallSubsystem(nft)
    document = _doc(SAFE)
    scope = scope_for(document)
    assert scope.keys_for("firewall") == {"inet trueup"}
    desired = sub.desired(document, scope)
    assert desired["spec.firewall"] == "inet trueup"
    assert desired["spec.firewall.chains[input]"] == {
        "type": "filter", "hook": "input", "prio": 0, "policy": "drop"
    }  # fmt: skip
    assert desired["spec.firewall.chains[input].rules[0]"] == {"expr": EST}
    assert desired["spec.firewall.sets[ops]"]["elem"] == ["192.0.2.7"]
    sources = Sources(FakeNetlink(), nft=nft)
    observed = sub.observe(sources, scope)
    assert observed == {"spec.firewall": None}
    plan = sub.plan(desired, observed, scope)
    assert [s.action for s in plan.steps] == ["load-ruleset"]
    assert plan.steps[0].args["rules"] == 2 and "target" in plan.steps[0].describe()
    sub.execute(sources, plan.steps[0])
    # Exactly one commit since the last look: the loaded facts are reused, not listed again.
    listings = nft.listings
    assert sub.observe(sources, scope) == desired
    assert nft.listings == listings
    assert not sub.plan(desired, sub.observe(sources, scope), scope).changes
    # Someone adds a rule: the generation moves, the table is listed, the rule is drift.
    nft.add_rule("inet", "trueup", "input", [_dport(23), {"accept": None}])
    observed = sub.observe(sources, scope)
    assert nft.listings == listings + 1
    diffs = sub.diff(desired, observed)
    assert [d.path for d in diffs] == ["spec.firewall.chains[input].rules[2]"]
    assert diffs[0].desired is None
    # Reordering is drift too (rules are not sets).
    swapped = dict(desired)
    swapped["spec.firewall.chains[input].rules[0]"] = desired[
        "spec.firewall.chains[input].rules[1]"
    ]
    swapped["spec.firewall.chains[input].rules[1]"] = desired[
        "spec.firewall.chains[input].rules[0]"
    ]
    assert len(sub.diff(desired, swapped)) == 2


def test_canonical_facts_normalise_handles_counters_and_load_back() -> None:
    listed = [
        {"table": {"family": "inet", "name": "trueup", "handle": 4}},
        {"set": {"family": "inet", "name": "s", "table": "trueup", "type": "ipv4_addr",
                 "handle": 2, "elem": ["198.51.100.9", "192.0.2.1"]}},
        {"chain": {"family": "inet", "table": "trueup", "name": "input", "handle": 1,
                   "type": "filter", "hook": "input", "prio": 0, "policy": "drop"}},
        {"rule": {"family": "inet", "table": "trueup", "chain": "input", "handle": 9,
                  "expr": [_dport(22), {"counter": {"packets": 7, "bytes": 420}}, {"accept": None}]}},
    ]  # fmt: skip
    facts = facts_from_objects(listed)
    assert facts["spec.firewall.sets[s]"]["elem"] == ["192.0.2.1", "198.51.100.9"]
    rule = facts["spec.firewall.chains[input].rules[0]"]
    assert rule["expr"][1] == {"counter": {"packets": 0, "bytes": 0}}
    assert "handle" not in json.dumps(facts)
    commands = json.loads(batch(facts))["nftables"]
    assert [next(iter(c)) for c in commands[:3]] == ["add", "delete", "add"]
    kinds = [next(iter(next(iter(c.values())))) for c in commands[3:]]
    assert kinds == ["set", "chain", "rule"]  # sets and chains before the rules naming them
    assert _only_trueup(commands)
    removal = json.loads(batch({"spec.firewall": None}))["nftables"]
    assert [next(iter(c)) for c in removal] == ["add", "delete"]


def test_a_bad_rule_is_refused_at_preparation_naming_its_path(
    engine: Engine, nft: FakeNftables
) -> None:
    assert engine.apply_document(_doc(SAFE)).ok
    before = json.dumps(sorted(nft.ruleset.items()), sort_keys=True)
    nft.refuse["tcp dport 22 acept"] = "Error: syntax error, unexpected newline"
    bad = _firewall(*SAFE["chains"][0]["rules"], "tcp dport 22 acept")
    result = engine.apply_document(_doc(bad))
    assert not result.ok
    message = result.failed["firewall"]
    assert "spec.firewall.chains[input].rules[2]: Error: syntax error" in message
    assert "tcp dport 22 acept" in message
    assert json.dumps(sorted(nft.ruleset.items()), sort_keys=True) == before


def test_plan_reports_a_rule_nft_refuses_instead_of_a_step(
    engine: Engine, nft: FakeNftables, capsys: pytest.CaptureFixture[str]
) -> None:
    from trueup.cli.output import print_plan

    assert engine.apply_document(_doc(SAFE)).ok
    nft.refuse["tcp dport 22 acept"] = "Error: syntax error, unexpected newline"
    bad = _firewall(*SAFE["chains"][0]["rules"], "tcp dport 22 acept")
    plans = {p.subsystem: p for p in engine.plan(_doc(bad))}
    firewall = plans["firewall"]
    assert firewall.steps == [] and not firewall.changes
    assert firewall.error.startswith("preparation failed: spec.firewall.chains[input].rules[2]")
    assert "tcp dport 22 acept" in firewall.error
    body = {
        "plans": [
            {"subsystem": p.subsystem, "steps": [], "noop": p.noop_reasons, "error": p.error}
            for p in plans.values()
        ],
        "failed": {p.subsystem: p.error for p in plans.values() if p.error},
        "observed_by": {"agent_pid": 1, "state_dir": "/s", "applied_version": 1},
    }
    assert print_plan(body, "table", source="bad.yaml") == 1
    err = capsys.readouterr().err
    assert "! firewall: preparation failed: spec.firewall.chains[input].rules[2]" in err
    assert "bad.yaml: refused by firewall: applying it would fail and change nothing" in err
    assert print_plan(body, "json") == 1


def test_a_refused_load_rolls_the_transaction_back(engine: Engine, nft: FakeNftables) -> None:
    assert engine.apply_document(_doc(SAFE)).ok
    before = json.dumps(sorted(nft.ruleset.items()), sort_keys=True)
    nft.fail_next = "Error: Could not process rule: No such file or directory"
    result = engine.apply_document(
        _doc(_firewall(*SAFE["chains"][0]["rules"], "tcp dport 22 accept"))
    )
    assert result.outcome == "rolled_back"
    assert "nft refused the ruleset, nothing changed" in result.failed["firewall"]
    assert json.dumps(sorted(nft.ruleset.items()), sort_keys=True) == before


def test_removing_the_section_removes_the_table_and_rollback_restores_it(
    engine: Engine, nft: FakeNftables
) -> None:
    assert engine.apply_document(_doc(SAFE)).ok
    applied = json.dumps(nft.ruleset[("inet", "trueup")], sort_keys=True)
    assert engine.apply_document(_doc()).ok
    assert ("inet", "trueup") not in nft.ruleset
    assert ("ip", "nat") in nft.ruleset  # never touched
    assert engine.rollback_to(1).ok
    assert json.dumps(nft.ruleset[("inet", "trueup")], sort_keys=True) == applied
    assert all(_only_trueup(b["nftables"]) for b in nft.batches)


def test_management_findings_are_precise_and_conservative() -> None:
    sub = FirewallSubsystem(FakeNftables())
    sub.nft.canonical.update(CANONICAL)  # type: ignore[attr-defined]

    def findings(firewall: dict[str, Any], port: int | None = None) -> list[str]:
        return sub.management_risks(_doc(firewall), port)

    assert findings(SAFE) == []
    assert findings(_firewall(policy="accept")) == []
    only_port = findings(_firewall('iifname "mgmt0" tcp dport 7443 accept'))
    assert len(only_port) == 2 and all("return traffic" in f for f in only_port)
    no_api = findings(_firewall("ct state established,related accept", "tcp dport 22 accept"))
    assert no_api == [
        "spec.firewall.chains[input] has policy drop and no earlier rule that certainly accepts "
        "new connections to the management API (tcp port 7443 on mgmt0)"
    ]
    dropped = findings(
        _firewall("tcp dport 7443 drop", *SAFE["chains"][0]["rules"], policy="accept")
    )
    assert dropped == [
        "spec.firewall.chains[input].rules[0] drops new connections to the management API "
        "(tcp port 7443 on mgmt0)"
    ]
    # A jump to a chain that accepts counts; the agent's own port overrides the document's.
    via_jump = _firewall("ct state established,related accept", "jump admin",
                         admin=('iifname "mgmt0" tcp dport 7443 accept',))  # fmt: skip
    assert findings(via_jump) == []
    assert len(findings(via_jump, port=9443)) == 1


def test_unknown_matches_never_count_as_accepting() -> None:
    src = {"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "saddr"}},
                     "right": {"prefix": {"addr": "192.0.2.0", "len": 24}}}}  # fmt: skip
    facts = {
        "spec.firewall.chains[input]": {
            "type": "filter",
            "hook": "input",
            "prio": 0,
            "policy": "drop",
        },
        "spec.firewall.chains[input].rules[0]": {"expr": EST},
        "spec.firewall.chains[input].rules[1]": {"expr": [src, _dport(7443), {"accept": None}]},
        "spec.firewall.chains[input].rules[2]": {
            "expr": [_dport({"set": [22, {"range": [7000, 7999]}]}), {"accept": None}]
        },
    }
    assert management_findings(facts, "mgmt0", 7443) == []  # the range certainly covers it
    del facts["spec.firewall.chains[input].rules[2]"]
    assert len(management_findings(facts, "mgmt0", 7443)) == 1  # only some sources: blocked
    other_if = {"match": {"op": "!=", "left": {"meta": {"key": "iifname"}}, "right": "mgmt0"}}
    facts["spec.firewall.chains[input].rules[1]"] = {"expr": [other_if, {"drop": None}]}
    assert len(management_findings(facts, "mgmt0", 7443)) == 1  # still only the policy


def test_the_engine_refuses_a_blocking_ruleset_without_confirmation(
    engine: Engine, nft: FakeNftables
) -> None:
    assert engine.apply_document(_doc(SAFE)).ok
    blocking = _doc(_firewall("ct state established,related accept", "tcp dport 22 accept"))
    with pytest.raises(NeedsConfirmation) as refused:
        engine.apply_document(blocking)
    assert "no earlier rule that certainly accepts new connections" in str(refused.value)
    assert "spec.firewall.chains[input]" in refused.value.changes[0]
    rules = [o["rule"]["expr"] for o in nft.ruleset[("inet", "trueup")] if "rule" in o]
    assert rules == [EST, CANONICAL['iifname "mgmt0" tcp dport 7443 accept']]  # unchanged
    assert engine.apply_document(blocking, management_confirmed=True).ok
    # Already applied (and confirmed): asking again for the same finding would be noise.
    same_finding = _firewall("ct state established,related accept", "tcp dport 22 accept",
                             "tcp dport 7443 drop")  # fmt: skip
    with pytest.raises(NeedsConfirmation) as again:
        engine.apply_document(_doc(same_finding))
    assert "rules[2] drops" in str(again.value) and "policy drop" not in str(again.value)


def test_status_lists_unmanaged_tables_and_a_failure_is_the_firewalls_alone(
    engine: Engine, nft: FakeNftables
) -> None:
    assert engine.apply_document(_doc(SAFE)).ok
    status = gather(engine)
    firewall = status["subsystems"]["firewall"]
    assert firewall["tier"] == "network" and firewall["health"] == "ok"
    assert firewall["system"] == {"table": "inet trueup", "unmanaged_tables": ["ip nat"]}
    nft.add_rule("inet", "trueup", "input", [_dport(23), {"accept": None}])
    status = gather(engine)
    assert status["subsystems"]["firewall"]["health"] == "degraded"
    assert status["subsystems"]["addresses"]["health"] == "ok"


def test_the_watch_is_nft_monitor() -> None:
    sub = FirewallSubsystem(FakeNftables())
    assert [w.argv for w in sub.watches] == [("nft", "monitor")]
    source = event_source_for(sub.watches)
    assert source.name == "nft monitor"


def test_only_rules_not_seen_before_are_canonicalised(nft: FakeNftables) -> None:
    sub = FirewallSubsystem(nft)
    scripts: list[str] = []
    listing = nft.scratch_list

    def recorded(script: str, family: str, name: str) -> list[dict[str, Any]]:
        scripts.append(script)
        return listing(script, family, name)

    nft.scratch_list = recorded  # type: ignore[method-assign]
    first = _doc(SAFE)
    scope = scope_for(first)
    sub.desired(first, scope)
    edited = _doc(_firewall("ct state established,related accept", "tcp dport 22 accept",
                            'iifname "mgmt0" tcp dport 7443 accept'))  # fmt: skip
    facts = sub.desired(edited, scope)
    # The second scratch load holds the table's skeleton and the one new rule only.
    assert [line for line in scripts[1].splitlines() if line.startswith("add rule")] == [
        "add rule inet trueup input tcp dport 22 accept"
    ]
    # The facts are the same as canonicalising the whole document afresh.
    assert facts == FirewallSubsystem(nft).desired(edited, scope)
    # A refused new rule is still named at its document path.
    nft.refuse["tcp dport 23 acept"] = "Error: syntax error"
    bad = _doc(_firewall("ct state established,related accept", "tcp dport 22 accept",
                         "tcp dport 23 acept"))  # fmt: skip
    with pytest.raises(FirewallError, match=r"chains\[input\]\.rules\[2\]"):
        sub.canonical(bad.spec.section("firewall"))
