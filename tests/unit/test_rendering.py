"""What operators read: nft rules as nft rule text, addresses and paths in natural order."""

from __future__ import annotations

from typing import Any

from trueup.model.order import natural_sorted
from trueup.subsystems.base import diff_facts
from trueup.subsystems.firewall import FirewallSubsystem
from trueup.subsystems.firewall.ruletext import rule_text

SSH = {
    "match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 22}
}


def rule(*expr: Any, **extra: Any) -> dict[str, Any]:
    return {"expr": list(expr), **extra}


def test_a_rule_fact_reads_as_nft_rule_text() -> None:
    assert rule_text(rule(SSH, {"accept": None})) == "tcp dport 22 accept"
    assert rule_text(rule(SSH, {"drop": None})) == "tcp dport 22 drop"
    established = {
        "match": {"op": "in", "left": {"ct": {"key": "state"}}, "right": ["established", "related"]}
    }
    lan = {"match": {"op": "==", "left": {"meta": {"key": "iifname"}}, "right": "lan0"}}
    web = {
        "match": {
            "op": "==",
            "left": {"payload": {"protocol": "tcp", "field": "dport"}},
            "right": {"set": [80, 443]},
        }
    }
    source = {
        "match": {
            "op": "!=",
            "left": {"payload": {"protocol": "ip", "field": "saddr"}},
            "right": {"prefix": {"addr": "192.0.2.0", "len": 24}},
        }
    }
    assert rule_text(rule(established, {"accept": None})) == "ct state established,related accept"
    assert (
        rule_text(rule(lan, web, {"counter": {"packets": 0, "bytes": 0}}, {"accept": None}))
        == 'iifname "lan0" tcp dport { 80, 443 } counter accept'
    )
    assert rule_text(rule(source, {"jump": {"target": "wan"}}, comment="not ours")) == (
        'ip saddr != 192.0.2.0/24 jump wan comment "not ours"'
    )
    assert rule_text(None) is None  # absent stays absent


def test_a_changed_verdict_shows_both_rule_texts_in_the_difference() -> None:
    path = "spec.firewall.chains[input].rules[0]"
    desired = {"spec.firewall": "inet trueup", path: rule(SSH, {"accept": None})}
    observed = {"spec.firewall": "inet trueup", path: rule(SSH, {"drop": None})}
    (difference,) = FirewallSubsystem().diff(desired, observed)
    assert (difference.path, difference.desired, difference.observed) == (
        path,
        "tcp dport 22 accept",
        "tcp dport 22 drop",
    )


def test_addresses_sort_by_value_and_paths_by_index() -> None:
    assert natural_sorted(["203.0.113.100", "203.0.113.20", "203.0.113.3"]) == [
        "203.0.113.3",
        "203.0.113.20",
        "203.0.113.100",
    ]
    assert natural_sorted(["2001:db8::10", "2001:db8::9"]) == ["2001:db8::9", "2001:db8::10"]
    assert natural_sorted(["spec.routes[10].via", "spec.routes[2].via", "spec.routes[1]"]) == [
        "spec.routes[1]",
        "spec.routes[2].via",
        "spec.routes[10].via",
    ]


def test_drift_paths_come_in_natural_order() -> None:
    desired = {f"spec.routes[{i}]": "192.0.2.0/24" for i in (1, 2, 10)}
    paths = [d.path for d in diff_facts("routes", desired, {}, observed_only_matters=False)]
    assert paths == ["spec.routes[1]", "spec.routes[2]", "spec.routes[10]"]
    rules = {
        f"spec.firewall.chains[input].rules[{i}]": rule(SSH, {"accept": None}) for i in (2, 10)
    }
    found = [d.path for d in FirewallSubsystem().diff(rules, {})]
    assert found == [
        "spec.firewall.chains[input].rules[2]",
        "spec.firewall.chains[input].rules[10]",
    ]
