"""Gateway failover without a kernel: the section's refusals (each at its path), the
hysteresis state machine and the decision (failover, balance, all down); the board, the
routes and the monitor are tests/unit/test_gateway_monitor.py."""

from __future__ import annotations

from typing import Any

import pytest

from tests.routers import base_document
from trueup.model.document import DocumentError, parse_document
from trueup.subsystems.gateways.health import (
    Choice,
    Decision,
    GatewayState,
    Member,
    RoundResult,
    Thresholds,
    Tracker,
    decide,
)
from trueup.subsystems.gateways.section import GatewaysSection

UP = GatewayState.UP
DOWN = GatewayState.DOWN
PENDING = GatewayState.PENDING
GOOD = RoundResult((5.0,))
LOST = RoundResult((None,))


def uplink(name: str, interface: str, gateway: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "interface": interface,
        "gateway": gateway,
        "probes": {"icmp": ["203.0.113.100"]},
        **extra,
    }


def document(gateways: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "interfaces": [
            {"name": "lan0", "state": "down", "addresses": ["203.0.113.1/26"]},
            {"name": "wan0", "addresses": ["192.0.2.2/28"]},
            {"name": "wan1", "addresses": ["192.0.2.18/28"]},
        ],
        "tables": {"wan": 100},
        "routes": [],
        "gateways": gateways
        if gateways is not None
        else {
            "tables": ["wan"],
            "uplinks": [
                uplink("isp-a", "wan0", "192.0.2.1", priority=1),
                uplink("isp-b", "wan1", "192.0.2.17", priority=2),
            ],
        },
    }
    base.update(spec)
    return base_document(**base)


def problems_of(body: dict[str, Any]) -> list[str]:
    with pytest.raises(DocumentError) as bad:
        parse_document(body, "edge.yaml")
    assert str(bad.value).startswith("edge.yaml: invalid document")
    return bad.value.problems


def test_a_valid_section_is_typed() -> None:
    section = parse_document(document()).spec.section("gateways", GatewaysSection)
    assert section is not None
    assert [u.name for u in section.uplinks] == ["isp-a", "isp-b"]
    assert section.table_numbers({"wan": 100}) == [100]
    assert section.uplinks[0].timeout_seconds == 1.0


@pytest.mark.parametrize(
    ("change", "path", "words"),
    [
        (
            lambda g: g["uplinks"][1].update(interface="wan9"),
            "spec.gateways.uplinks[1].interface",
            "not in spec.interfaces",
        ),
        (
            lambda g: g["uplinks"][0].update(gateway="192.0.2.33"),
            "spec.gateways.uplinks[0].gateway",
            "not on a subnet of wan0",
        ),
        (
            lambda g: g["uplinks"][1].update(name="isp-a"),
            "spec.gateways.uplinks[1].name",
            "duplicate name",
        ),
        (
            lambda g: g["uplinks"][0].update(down_after=0),
            "spec.gateways.uplinks[0].down_after",
            "greater than or equal to 1",
        ),
        (
            lambda g: g["uplinks"][0].update(max_loss_percent=120),
            "spec.gateways.uplinks[0].max_loss_percent",
            "less than or equal to 100",
        ),
        (
            lambda g: g["uplinks"][0].update(interval_ms=50),
            "spec.gateways.uplinks[0].interval_ms",
            "greater than or equal to 100",
        ),
        (
            lambda g: g["uplinks"][0].update(timeout_ms=2000),
            "spec.gateways.uplinks[0].timeout_ms",
            "longer than interval_ms",
        ),
        (
            lambda g: g["uplinks"][0].update(reliability=2),
            "spec.gateways.uplinks[0].reliability",
            "only 1 given",
        ),
        (
            lambda g: g["uplinks"][0].update(probes={"tcp": ["203.0.113.100"]}),
            "spec.gateways.uplinks[0].probes.tcp[0]",
            "not HOST:PORT",
        ),
        (
            lambda g: g["uplinks"][0].update(probes={}),
            "spec.gateways.uplinks[0].probes.icmp",
            "at least one probe target",
        ),
        (
            lambda g: g["uplinks"][0].update(probes={"icmp": ["2001:db8::1"]}),
            "spec.gateways.uplinks[0].probes.icmp[0]",
            "IPv6 target for an IPv4 gateway",
        ),
        (
            lambda g: g["uplinks"][0].update(interface="mgmt0", gateway="198.51.100.1"),
            "spec.gateways.uplinks[0].interface",
            "management interface",
        ),
        (
            lambda g: g["uplinks"][0].update(interface="lan0", gateway="203.0.113.9"),
            "spec.gateways.uplinks[0].interface",
            "lan0 is down in spec.interfaces",
        ),
        (
            lambda g: g.update(tables=["main"]),
            "spec.gateways.tables[0]",
            "management route",
        ),
        (
            lambda g: g.update(tables=["isp"]),
            "spec.gateways.tables[0]",
            "unknown table",
        ),
        (
            lambda g: g.update(tables=["wan", 100]),
            "spec.gateways.tables[1]",
            "listed twice",
        ),
        (
            lambda g: g["uplinks"][1].update(interface="wan0", gateway="192.0.2.5"),
            "spec.gateways.uplinks[1].interface",
            "wan0 is also uplinks[0]'s interface for IPv4",
        ),
        (
            lambda g: g.update(tables=[4000250]),
            "spec.gateways.tables[0]",
            "table 4000250 is the probe routes' table",
        ),
        (
            lambda g: g["uplinks"][0].update(gateway="192.0.2.2"),
            "spec.gateways.uplinks[0].gateway",
            "192.0.2.2 is wan0's own address",
        ),
        (
            lambda g: g["uplinks"][0].update(gateway="192.0.2.0"),
            "spec.gateways.uplinks[0].gateway",
            "192.0.2.0 is the network address of 192.0.2.0/28",
        ),
        (
            lambda g: g["uplinks"][0].update(gateway="192.0.2.15"),
            "spec.gateways.uplinks[0].gateway",
            "192.0.2.15 is the broadcast address of 192.0.2.0/28",
        ),
        (
            lambda g: g.update(policy="random"),
            "spec.gateways.policy",
            "failover",
        ),
    ],
)
def test_each_refusal_names_its_path(change: Any, path: str, words: str) -> None:
    body = document()
    change(body["spec"]["gateways"])
    problems = problems_of(body)
    assert any(p.startswith(path + ":") and words in p for p in problems), problems


def test_an_ipv6_gateway_may_be_link_local_beside_the_ipv4_one_on_its_interface() -> None:
    body = document()
    body["spec"]["interfaces"][1]["addresses"].append("2001:db8:a::2/64")
    body["spec"]["gateways"]["uplinks"].append(
        {**uplink("isp-a6", "wan0", "fe80::1"), "probes": {"icmp": ["2001:db8:ff::1"]}}
    )
    section = parse_document(body).spec.section("gateways", GatewaysSection)
    assert section is not None and section.families() == [4, 6]


def test_a_static_default_route_in_an_owned_table_is_refused() -> None:
    body = document(routes=[{"to": "0.0.0.0/0", "via": "192.0.2.1", "table": "wan"}])
    problems = problems_of(body)
    assert any(p.startswith("spec.routes[0]:") and "two owners" in p for p in problems), problems


def test_the_main_table_is_the_gateways_when_management_has_no_gateway() -> None:
    body = document()
    body["spec"]["management"].pop("gateway")
    body["spec"]["gateways"]["tables"] = ["main"]
    section = parse_document(body).spec.section("gateways", GatewaysSection)
    assert section is not None and section.table_numbers({}) == [254]


# -- the state machine ----------------------------------------------------------------


def tracker(**thresholds: Any) -> Tracker:
    settings = {"down_after": 3, "up_after": 2, "window": 10, "max_loss_percent": 100.0}
    settings.update(thresholds)
    return Tracker(Thresholds(**settings))


def feed(t: Tracker, rounds: str, start: float = 0.0) -> list[tuple[float, str, str]]:
    """Feed rounds ('g' good, 'l' lost); the transitions as (time, before, after)."""
    changes = []
    for i, letter in enumerate(rounds):
        now = start + i
        before = t.observe(GOOD if letter == "g" else LOST, now)
        if before is not None:
            changes.append((now, before.value, t.state.value))
    return changes


def test_pending_until_the_counts_say_up_or_down() -> None:
    t = tracker()
    assert feed(t, "g") == [] and t.state is PENDING
    assert feed(t, "g", 1) == [(1, "pending", "up")]
    t = tracker()
    assert feed(t, "lll") == [(2, "pending", "down")]


def test_down_after_n_consecutive_failures_and_up_after_m_successes() -> None:
    t = tracker()
    feed(t, "gg")
    assert feed(t, "llgll", 2) == []  # the good round in between resets the failures
    assert t.state is UP
    assert feed(t, "l", 7) == [(7, "up", "down")]
    assert t.since == 7
    assert feed(t, "glg", 8) == []
    assert feed(t, "g", 11) == [(11, "down", "up")]


def test_an_upstream_flapping_faster_than_the_hysteresis_never_changes_the_state() -> None:
    t = tracker()
    feed(t, "gg")
    assert feed(t, "llg" * 20, 2) == []
    assert t.state is UP
    t = tracker(up_after=3)
    feed(t, "lll")
    assert feed(t, "ggl" * 20, 3) == []
    assert t.state is DOWN


def test_loss_and_latency_over_the_window() -> None:
    t = tracker(window=4, max_loss_percent=25.0, down_after=2, up_after=1)
    feed(t, "g")
    assert feed(t, "l", 1) == []  # 1 of 2 rounds lost: 50% > 25%, one failed round
    assert t.loss_percent() == 50.0
    assert feed(t, "g", 2) == [(2, "up", "down")]  # answered, but the window's loss is 33%
    t = tracker(max_latency_ms=50.0, down_after=2, up_after=1)
    assert t.observe(RoundResult((10.0,)), 0) is PENDING
    t.observe(RoundResult((200.0,)), 1)
    assert t.latency_ms() == 105.0 and t.state is UP
    t.observe(RoundResult((200.0,)), 2)
    assert t.state is DOWN


def test_reliability_counts_answering_targets() -> None:
    t = tracker(reliability=2, down_after=1, up_after=1)
    t.observe(RoundResult((5.0, None, 7.0)), 0)
    assert t.state is UP
    t.observe(RoundResult((5.0, None, None)), 1)
    assert t.state is DOWN


# -- the decision ---------------------------------------------------------------------

A = Member("a", 4, 1, 1, 0)
B = Member("b", 4, 2, 3, 1)
C = Member("c", 4, 2, 1, 2)
V6 = Member("v6", 6, 1, 1, 3)


def test_failover_takes_the_up_gateway_of_lowest_priority() -> None:
    assert decide("failover", [A, B, C], {"a": UP, "b": UP, "c": UP}).choices[4] == Choice(("a",))
    assert decide("failover", [A, B, C], {"a": DOWN, "b": UP, "c": UP}).choices[4] == Choice(("b",))
    assert decide("failover", [A, B, C], {"a": PENDING, "c": UP}).choices[4] == Choice(("c",))


def test_balance_takes_every_up_gateway() -> None:
    decision = decide("balance", [A, B, C], {"a": UP, "b": DOWN, "c": UP})
    assert decision.choices[4] == Choice(("a", "c"))


def test_all_down_keeps_the_last_route_or_the_first() -> None:
    last = decide("failover", [A, B], {"a": DOWN, "b": UP})
    kept = decide("failover", [A, B], {"a": DOWN, "b": DOWN}, last)
    assert kept.choices[4] == Choice(("b",), all_down=True, kept=True)
    fresh = decide("failover", [A, B], {"a": DOWN, "b": DOWN})
    assert fresh.choices[4] == Choice(("a",), all_down=True)
    starting = decide("failover", [A, B], {})
    assert starting.choices[4] == Choice(("a",), all_down=False)
    gone = Decision("failover", {4: Choice(("z",))})
    assert decide("failover", [A, B], {"a": DOWN, "b": DOWN}, gone).choices[4].members == ("a",)


def test_each_family_is_decided_on_its_own() -> None:
    decision = decide("failover", [A, V6], {"a": DOWN, "v6": UP})
    assert decision.choices[4].all_down and decision.choices[6] == Choice(("v6",))
    assert decision.active() == ["a", "v6"]
