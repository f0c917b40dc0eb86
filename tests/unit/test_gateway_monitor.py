"""Gateway failover without a kernel: the board, the routes on the fake netlink, the monitor
over the real engine with a fake prober and clock, and what status, the report and the
metrics show of it."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.test_gateways import DOWN, GOOD, LOST, PENDING, UP, document
from trueup.model.document import parse_document
from trueup.model.health import SubsystemHealth
from trueup.subsystems.base import Scope
from trueup.subsystems.gateways.board import Board
from trueup.subsystems.gateways.health import RoundResult
from trueup.subsystems.gateways.section import GatewaysSection
from trueup.subsystems.gateways.subsystem import (
    GATEWAY_PROTO,
    PROBE_METRIC,
    PROBE_RULE_PRIORITY,
    PROBE_TABLE,
    GatewaysSubsystem,
)
from trueup.subsystems.registry import scope_for
from trueup.system.fake import FakeNetlink
from trueup.system.netlink import RouteInfo, RuleInfo
from trueup.system.sources import Sources

# -- the board and the routes ---------------------------------------------------------


def settle(board: Board, section: GatewaysSection, states: dict[str, str]) -> None:
    """Drive each uplink's tracker to `states` with probe rounds."""
    for u in section.uplinks:
        result = GOOD if states[u.name] == "up" else LOST
        for i in range(max(u.up_after, u.down_after)):
            board.observe(u.name, u.probe_settings(), result, float(i))
    with board.deciding():
        pass


def kernel() -> FakeNetlink:
    net = FakeNetlink({"mgmt0": 1500, "lan0": 1500, "wan0": 1500, "wan1": 1500})
    for ifname, prefix in (("wan0", "192.0.2.2/28"), ("wan1", "192.0.2.18/28")):
        net.add_address(ifname, prefix)
    return net


def converge(sub: GatewaysSubsystem, parsed: Any, net: FakeNetlink, scope: Scope) -> list[str]:
    sources = Sources(net)
    plan = sub.plan(sub.desired(parsed, scope), sub.observe(sources, scope), scope)
    for step in plan.steps:
        sub.execute(sources, step)
    assert not sub.plan(sub.desired(parsed, scope), sub.observe(sources, scope), scope).steps
    return [s.action for s in plan.steps]


def default_in(net: FakeNetlink, table: int) -> RouteInfo:
    (route,) = [r for r in net.route_table if r.table == table and r.metric == 0]
    return route


def test_the_routes_follow_the_decision_and_keep_the_state_across_documents() -> None:
    sub = GatewaysSubsystem()
    parsed = parse_document(document())
    section = parsed.spec.section("gateways", GatewaysSection)
    assert section is not None
    sub.board.sync(section)
    sub.board.monitoring = True
    scope = scope_for(parsed)
    net = kernel()
    settle(sub.board, section, {"isp-a": "up", "isp-b": "up"})
    assert sorted(converge(sub, parsed, net, scope)) == ["set-route"] * 3 + ["set-rule"] * 2
    route = default_in(net, 100)
    assert (route.via, route.dev, route.proto) == ("192.0.2.1", "wan0", GATEWAY_PROTO)
    probes = sorted((r.metric, r.dev) for r in net.route_table if r.table == PROBE_TABLE)
    assert probes == [(PROBE_METRIC, "wan0"), (PROBE_METRIC + 1, "wan1")]
    # Nothing in main: unbound and forwarded traffic never leaves through a probe route.
    assert not [r for r in net.route_table if r.table == 254]
    assert sorted(net.rule_table, key=lambda r: r.oif) == [
        RuleInfo(4, PROBE_RULE_PRIORITY, "wan0", PROBE_TABLE),
        RuleInfo(4, PROBE_RULE_PRIORITY, "wan1", PROBE_TABLE),
    ]
    settle(sub.board, section, {"isp-a": "down", "isp-b": "up"})
    assert converge(sub, parsed, net, scope) == ["set-route"]
    assert default_in(net, 100).via == "192.0.2.17"
    assert sub.condition(Sources(net), parsed) is None
    report = sub.report(Sources(net), scope)
    assert report["active"] == ["isp-b"]
    assert [g["state"] for g in report["gateways"]] == ["down", "up"]  # type: ignore[index]

    # A new document (isp-b's weight, a third table) keeps both trackers: no flap.
    body = document()
    body["spec"]["gateways"]["uplinks"][1]["weight"] = 5
    changed = parse_document(body)
    changed_section = changed.spec.section("gateways", GatewaysSection)
    assert changed_section is not None
    sub.board.sync(changed_section)
    assert sub.board.states_for(changed_section) == {"isp-a": DOWN, "isp-b": UP}
    assert converge(sub, changed, net, scope_for(changed, parsed)) == []

    # Changed probe settings start that uplink afresh.
    body["spec"]["gateways"]["uplinks"][1]["interval_ms"] = 500
    probed = parse_document(body).spec.section("gateways", GatewaysSection)
    assert probed is not None
    sub.board.sync(probed)
    assert sub.board.states_for(probed) == {"isp-a": DOWN, "isp-b": PENDING}


def test_all_down_keeps_the_route_and_says_so() -> None:
    sub = GatewaysSubsystem()
    parsed = parse_document(document())
    section = parsed.spec.section("gateways", GatewaysSection)
    assert section is not None
    sub.board.sync(section)
    sub.board.monitoring = True
    net = kernel()
    settle(sub.board, section, {"isp-a": "down", "isp-b": "up"})
    converge(sub, parsed, net, scope_for(parsed))
    settle(sub.board, section, {"isp-a": "down", "isp-b": "down"})
    assert converge(sub, parsed, net, scope_for(parsed)) == []
    assert default_in(net, 100).via == "192.0.2.17"
    condition = sub.condition(Sources(net), parsed)
    assert condition is not None and condition[0] is SubsystemHealth.DEGRADED
    assert "every IPv4 gateway is down: keeping the default route via isp-b" in condition[1]


def test_balance_installs_one_weighted_multipath_route() -> None:
    body = document()
    body["spec"]["gateways"]["policy"] = "balance"
    body["spec"]["gateways"]["uplinks"][1]["weight"] = 3
    parsed = parse_document(body)
    section = parsed.spec.section("gateways", GatewaysSection)
    assert section is not None
    sub = GatewaysSubsystem()
    sub.board.sync(section)
    settle(sub.board, section, {"isp-a": "up", "isp-b": "up"})
    net = kernel()
    converge(sub, parsed, net, scope_for(parsed))
    route = default_in(net, 100)
    assert sorted((h.via, h.dev, h.weight) for h in route.nexthops) == [
        ("192.0.2.1", "wan0", 1),
        ("192.0.2.17", "wan1", 3),
    ]


def test_drift_is_seen_and_the_management_route_never_touched() -> None:
    sub = GatewaysSubsystem()
    parsed = parse_document(document())
    scope = scope_for(parsed)
    net = kernel()
    net.add_address("mgmt0", "198.51.100.2/24")
    management = RouteInfo(254, "0.0.0.0/0", "198.51.100.1", "mgmt0", 0, 4)
    net.add_route(management)
    converge(sub, parsed, net, scope)
    # Someone replaces the gateways' default route: another protocol, healed back.
    net.add_route(RouteInfo(100, "0.0.0.0/0", "192.0.2.17", "wan1", 0, 4))
    diffs = sub.diff(sub.desired(parsed, scope), sub.observe(Sources(net), scope))
    assert [d.path for d in diffs] == ["spec.gateways.tables[100].ipv4"]
    converge(sub, parsed, net, scope)
    assert default_in(net, 100).proto == GATEWAY_PROTO
    net.del_route(default_in(net, 100))
    assert converge(sub, parsed, net, scope) == ["set-route"]
    assert default_in(net, 254) == management
    # Someone deletes a probe rule: missing, put back.
    net.del_rule(net.rule_table[0])
    assert converge(sub, parsed, net, scope) == ["set-rule"]


def test_a_document_without_gateways_removes_their_routes() -> None:
    sub = GatewaysSubsystem()
    parsed = parse_document(document())
    net = kernel()
    converge(sub, parsed, net, scope_for(parsed))
    body = document()
    del body["spec"]["gateways"]
    without = parse_document(body)
    assert sorted(converge(sub, without, net, scope_for(without, parsed))) == (
        ["del-route"] * 3 + ["del-rule"] * 2
    )
    assert not [r for r in net.route_table if r.proto == GATEWAY_PROTO]
    assert not net.rule_table


# -- the monitor: fake prober, fake clock, fake netlink, the real engine ----------------


def test_the_monitor_switches_at_once_audits_and_never_touches_management(
    tmp_path: Any,
) -> None:
    from trueup.agent.gateways import GatewayMonitor
    from trueup.journal.state import StateDir
    from trueup.reconcile.engine import Engine
    from trueup.subsystems.registry import default_subsystems

    state = StateDir(tmp_path / "state")
    state.ensure()
    net = FakeNetlink({"mgmt0": 1500, "lan0": 1500, "wan0": 1500, "wan1": 1500})
    # The routes subsystem leaves routes of protocol 250 to the gateways (spec.routes'
    # side of the contract, checked in tests/integration/test_gateways.py); left out here.
    subsystems = [s for s in default_subsystems() if s.name != "routes"]
    engine = Engine(state, subsystems, netlink_factory=lambda: net)
    body = document()
    body["spec"]["gateways"]["uplinks"][0].update(down_after=2, up_after=2, max_loss_percent=100)
    body["spec"]["gateways"]["uplinks"][1].update(down_after=2, up_after=2, max_loss_percent=100)
    parsed = parse_document(body)
    assert engine.apply_document(parsed).ok
    assert default_in(net, 100).via == "192.0.2.1"  # before any probe: the first priority
    management = default_in(net, 254)
    gateways = engine.by_name["gateways"]
    assert isinstance(gateways, GatewaysSubsystem)
    clock = iter(float(t) for t in range(1000, 2000))
    monitor = GatewayMonitor(engine, gateways.board, clock=lambda: next(clock))
    changes: list[str] = []
    monitor.on_change.append(lambda: changes.append("changed"))
    section = monitor.sync()
    assert section is not None
    a, b = section.uplinks

    def rounds(uplink: Any, result: RoundResult, count: int) -> None:
        for _ in range(count):
            monitor.round(uplink.name, uplink.probe_settings(), result)

    rounds(a, GOOD, 2)
    rounds(b, GOOD, 2)
    assert default_in(net, 100).via == "192.0.2.1"
    rounds(a, LOST, 1)
    assert default_in(net, 100).via == "192.0.2.1"  # one lost round: within the hysteresis
    rounds(a, LOST, 1)
    assert default_in(net, 100).via == "192.0.2.17"  # switched by the round itself
    rounds(a, GOOD, 1)
    assert default_in(net, 100).via == "192.0.2.17"
    rounds(a, GOOD, 1)
    assert default_in(net, 100).via == "192.0.2.1"
    assert default_in(net, 254) == management
    records = [(r["event"], r["details"]) for r in state.audit.records()]
    events = [(e, d.get("gateway"), d.get("state")) for e, d in records]
    assert [e for e in events if e[0] == "gateway_state"] == [
        ("gateway_state", "isp-a", "up"),
        ("gateway_state", "isp-b", "up"),
        ("gateway_state", "isp-a", "down"),
        ("gateway_state", "isp-a", "up"),
    ]
    switched = [d for e, d in records if e == "gateway_switched"]
    assert [(s["previous"], s["active"]) for s in switched] == [
        ({"ipv4": ["isp-a"]}, {"ipv4": ["isp-b"]}),
        ({"ipv4": ["isp-b"]}, {"ipv4": ["isp-a"]}),
    ]
    assert len(changes) == 4
    report = gateways.report(Sources(net), scope_for(parsed))
    assert report["active"] == ["isp-a"]
    assert report["gateways"][0]["since"] is not None  # type: ignore[index]

    # A new revision that keeps isp-a's probe settings keeps its state: no flap.
    body["spec"]["gateways"]["uplinks"][1]["priority"] = 0
    assert engine.apply_document(parse_document(body)).ok
    assert default_in(net, 100).via == "192.0.2.17"  # isp-b is up and now first
    monitor.sync()
    assert gateways.board.states_for(monitor.sync() or section) == {"isp-a": UP, "isp-b": UP}


def test_the_report_carries_the_gateways_and_notifications_open_on_them() -> None:
    from trueup.agent.cpreport import report_from_status
    from trueup.server.service.notify.events import KINDS, conditions_of

    def status(states: dict[str, str], all_down: bool) -> dict[str, Any]:
        gateways = [
            {"name": name, "state": state, "since": "2026-12-07T22:00:00Z", "active": i == 0}
            for i, (name, state) in enumerate(states.items())
        ]
        system = {"policy": "failover", "all_down": all_down, "gateways": gateways}
        return {"subsystems": {"gateways": {"health": "ok", "system": system}}}

    report = report_from_status(status({"isp-a": "down", "isp-b": "up"}, False))
    assert report["subsystems"]["gateways"]["gateways"][0] == {
        "name": "isp-a",
        "state": "down",
        "since": "2026-12-07T22:00:00Z",
        "active": True,
    }
    assert conditions_of(report) == {"gateway_down": ["isp-a"]}
    down = report_from_status(status({"isp-a": "down", "isp-b": "down"}, True))
    assert conditions_of(down) == {
        "gateway_down": ["isp-a", "isp-b"],
        "gateways_all_down": ["isp-a", "isp-b"],
    }
    assert conditions_of(report_from_status(status({"isp-a": "up"}, False))) == {}
    assert KINDS["gateway_down"] == "warning" and KINDS["gateways_all_down"] == "critical"


def test_an_agent_restarted_mid_outage_neither_heals_nor_reopens_its_notifications() -> None:
    from trueup.agent.cpreport import report_from_status
    from trueup.server.service.notify.events import conditions_of, keep_pending_gateways

    def report(states: dict[str, str], all_down: bool = False) -> Any:
        gateways = [
            {"name": n, "state": s, "since": None, "active": False} for n, s in states.items()
        ]
        system = {"policy": "failover", "all_down": all_down, "gateways": gateways}
        return report_from_status({"subsystems": {"gateways": {"health": "ok", "system": system}}})

    def judged(before: dict[str, list[str]], body: Any) -> dict[str, list[str]]:
        return keep_pending_gateways(before, conditions_of(body), body)

    one_down = {"gateway_down": ["isp-a"]}
    # Restarted: both pending. isp-a's outage is not healed by the lack of a verdict.
    assert judged(one_down, report({"isp-a": "pending", "isp-b": "pending"})) == one_down
    # Its probes say up: healed. Its probes say down: the same condition, nothing new.
    assert judged(one_down, report({"isp-a": "up", "isp-b": "up"})) == {}
    assert judged(one_down, report({"isp-a": "down", "isp-b": "pending"})) == one_down
    # Every uplink down, then a restart: the critical condition stays until one is up.
    every = {"gateway_down": ["isp-a", "isp-b"], "gateways_all_down": ["isp-a", "isp-b"]}
    assert judged(every, report({"isp-a": "pending", "isp-b": "pending"})) == every
    assert judged(every, report({"isp-a": "pending", "isp-b": "up"})) == one_down
    # A pending uplink that was never down opens nothing.
    assert judged({}, report({"isp-a": "pending", "isp-b": "up"})) == {}


def test_the_status_table_shows_each_gateway() -> None:
    from tests.unit.test_cli_truth import _rich_status
    from trueup.cli.output import render_status

    status = _rich_status()
    status["subsystems"]["gateways"] = {
        "tier": "routing",
        "health": "degraded",
        "reason": "every IPv4 gateway is down: keeping the default route via isp-b",
        "system": {
            "policy": "failover",
            "active": ["isp-b"],
            "all_down": True,
            "gateways": [
                {
                    "name": "isp-a",
                    "interface": "wan0",
                    "gateway": "192.0.2.1",
                    "state": "down",
                    "since": "2026-12-07T22:56:32.074Z",
                    "loss_percent": 100.0,
                    "latency_ms": None,
                    "active": False,
                },
                {
                    "name": "isp-b",
                    "interface": "wan1",
                    "gateway": "192.0.2.17",
                    "state": "down",
                    "since": "2026-12-07T22:57:01.500Z",
                    "loss_percent": 40.0,
                    "latency_ms": 0.41,
                    "active": True,
                },
            ],
        },
    }
    text = render_status(status)
    assert "gateways (failover): active isp-b" in text
    (row,) = [line for line in text.splitlines() if line.strip().startswith("isp-b")]
    assert "down" in row and "loss 40.0%" in row and "latency 0.41 ms" in row
    assert "no verdict" not in text and "not monitored" not in text

    # Every uplink pending (the agent just started): the active one is not a verdict.
    system = status["subsystems"]["gateways"]["system"]
    for g in system["gateways"]:
        g["state"] = "pending"
    system["monitoring"] = True
    assert "active isp-b (no verdict yet" in render_status(status)
    # No agent probes them (the CLI's own view): status says so.
    system["monitoring"] = False
    assert "active isp-b (not monitored" in render_status(status)
    assert row.endswith("ACTIVE")
    assert "its last default route is kept" in text


def test_a_restarted_monitor_keeps_the_installed_route_until_the_first_verdicts(
    tmp_path: Any,
) -> None:
    from trueup.agent.gateways import GatewayMonitor
    from trueup.journal.state import StateDir
    from trueup.reconcile.engine import Engine
    from trueup.subsystems.registry import default_subsystems

    state = StateDir(tmp_path / "state")
    state.ensure()
    net = FakeNetlink({"mgmt0": 1500, "lan0": 1500, "wan0": 1500, "wan1": 1500})

    def engine() -> Engine:
        subsystems = [s for s in default_subsystems() if s.name != "routes"]
        return Engine(state, subsystems, netlink_factory=lambda: net)

    first = engine()
    parsed = parse_document(document())
    assert first.apply_document(parsed).ok
    # The last agent had failed over to isp-b.
    net.add_route(RouteInfo(100, "0.0.0.0/0", "192.0.2.17", "wan1", 0, 4, proto=GATEWAY_PROTO))
    restarted = engine()
    gateways = restarted.by_name["gateways"]
    assert isinstance(gateways, GatewaysSubsystem)
    GatewayMonitor(restarted, gateways.board).seed()
    scope = scope_for(parsed)
    desired = gateways.desired(parsed, scope)
    hops = desired["spec.gateways.tables[100].ipv4"]["nexthops"]
    assert hops == [{"via": "192.0.2.17", "dev": "wan1", "weight": 1}]
    # A route that is not the gateways' (another protocol) seeds nothing.
    net.add_route(RouteInfo(100, "0.0.0.0/0", "192.0.2.17", "wan1", 0, 4))
    again = engine()
    fresh = again.by_name["gateways"]
    assert isinstance(fresh, GatewaysSubsystem)
    GatewayMonitor(again, fresh.board).seed()
    assert (
        fresh.desired(parsed, scope)["spec.gateways.tables[100].ipv4"]["nexthops"][0]["via"]
        == "192.0.2.1"
    )


def test_metrics_show_each_gateway() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from trueup.agent.metrics import AgentMetrics

    gateways = [
        {"name": "isp-a", "state": "down", "active": False, "loss_percent": 100.0},
        {"name": "isp-b", "state": "up", "active": True, "loss_percent": 0.0, "latency_ms": 0.4},
    ]
    status = {
        "versions": {"applied": 3},
        "management": {"ready": True},
        "subsystems": {"gateways": {"health": "ok", "system": {"gateways": gateways}}},
        "reason_codes": [],
    }
    text = AgentMetrics(lambda: status, lambda: None).render()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    up = {
        (s.labels["gateway"], s.labels["state"]): s.value
        for s in families["trueup_gateway_up"].samples
    }
    assert up[("isp-a", "down")] == 1.0 and up[("isp-a", "up")] == 0.0
    assert up[("isp-b", "up")] == 1.0
    active = {s.labels["gateway"]: s.value for s in families["trueup_gateway_active"].samples}
    assert active == {"isp-a": 0.0, "isp-b": 1.0}
    latency = {s.labels["gateway"]: s.value for s in families["trueup_gateway_latency_ms"].samples}
    assert latency == {"isp-b": 0.4}


def test_a_switch_with_a_probe_route_waiting_on_its_link_is_still_a_switch(
    tmp_path: Any,
) -> None:
    from trueup.agent.gateways import GatewayMonitor
    from trueup.journal.state import StateDir
    from trueup.reconcile.engine import Engine
    from trueup.subsystems.base import StepWaits
    from trueup.subsystems.registry import default_subsystems

    state = StateDir(tmp_path / "state")
    state.ensure()
    net = FakeNetlink({"mgmt0": 1500, "lan0": 1500, "wan0": 1500, "wan1": 1500})
    engine = Engine(
        state,
        [s for s in default_subsystems() if s.name != "routes"],
        netlink_factory=lambda: net,
    )
    body = document()
    for entry in body["spec"]["gateways"]["uplinks"]:
        entry.update(down_after=1, up_after=1, max_loss_percent=100)
    parsed = parse_document(body)
    assert engine.apply_document(parsed).ok
    gateways = engine.by_name["gateways"]
    assert isinstance(gateways, GatewaysSubsystem)
    monitor = GatewayMonitor(engine, gateways.board, clock=lambda: 1.0)
    section = monitor.sync()
    assert section is not None
    a, b = section.uplinks
    monitor.round(a.name, a.probe_settings(), GOOD)
    monitor.round(b.name, b.probe_settings(), GOOD)
    # wan0 loses its address: the kernel flushes every route through it.
    net.del_address("wan0", "192.0.2.2/28")
    scope = scope_for(parsed)
    plan = gateways.plan(
        gateways.desired(parsed, scope), gateways.observe(Sources(net), scope), scope
    )
    with pytest.raises(StepWaits, match="waiting on link wan0"):
        for step in plan.steps:
            gateways.execute(Sources(net), step)
    monitor.round(a.name, a.probe_settings(), LOST)
    assert default_in(net, 100).via == "192.0.2.17"
    switched = [r["details"] for r in state.audit.records() if r["event"] == "gateway_switched"]
    assert switched[-1]["active"] == {"ipv4": ["isp-b"]}
    assert "waiting on link wan0" in switched[-1]["problem"]
