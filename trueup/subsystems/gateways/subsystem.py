"""The gateways' default routes (`spec.gateways`): what the monitor's decision implies.

Facts, each a route of protocol `GATEWAY_PROTO` (250, rtproto "trueup-gw"):

* `spec.gateways.tables[T].ipv4` (and `.ipv6`): the default route of each
  owned table, through the uplinks the decision chose (`health.decide`): one
  nexthop under failover, a multipath route weighted by `weight` under
  balance;
* `spec.gateways.uplinks[NAME].probe_route`: one default route per uplink
  through its gateway in the probe table (`PROBE_TABLE`, at `PROBE_METRIC`
  plus the uplink's index), and `...probe_rule`: the rule `oif DEV lookup
  PROBE_TABLE` after the main table's (`PROBE_RULE_PRIORITY`). Only a socket
  bound to the uplink (SO_BINDTODEVICE: the monitor's probes, `ping -I wan1`)
  has an output interface a rule can match, and the main table gives such a
  socket only routes through that interface: a probe of the standby uplink
  finds no route in main and takes its gateway from the probe table. Forwarded
  and unbound traffic never reach that table, so no host leaves through an
  uplink the decision did not choose, even when no other default route exists.

The management default route is never one of these (the section refuses
gateways owning its table; the keys here never equal it). A route someone
else put at one of these keys (a replaced default route) differs by its
protocol and is healed; one deleted is put back. The switch itself on a
probe transition is the monitor's (`trueup.agent.gateways`), at once, through
`converge_gateways`; the reconcile loop heals drift from the same facts.
"""

from __future__ import annotations

import errno
from collections.abc import Mapping

from trueup.model.document import DeviceState
from trueup.model.health import SubsystemHealth, Tier
from trueup.model.order import natural_sorted
from trueup.subsystems.base import (
    Facts,
    Plan,
    Scope,
    Sources,
    Step,
    StepError,
    StepWaits,
    Subsystem,
)
from trueup.subsystems.gateways.board import Board
from trueup.subsystems.gateways.health import Choice, Decision
from trueup.subsystems.gateways.section import (
    MAIN_TABLE,
    PROBE_TABLE,
    SECTION,
    GatewaysSection,
    default_route,
)
from trueup.system.netlink import NetlinkError, Nexthop, RouteInfo, RuleInfo
from trueup.system.watches import every, rtnetlink

__all__ = [
    "GATEWAY_PROTO",
    "PROBE_METRIC",
    "PROBE_RULE_PRIORITY",
    "PROBE_TABLE",
    "GatewaysSubsystem",
    "installed_decision",
    "route_keys",
]

GATEWAY_PROTO = 250  # rtproto "trueup-gw": the routes spec.routes' subsystem leaves alone
PROBE_METRIC = 4_000_000  # probe routes: PROBE_METRIC + the uplink's index
PROBE_RULE_PRIORITY = 32_800  # after main (32766) and default (32767)
_RULE = "rule"  # the destination part of a probe rule's key


def _table_name(table: int) -> str:
    return "main" if table == MAIN_TABLE else str(table)


def route_keys(document: DeviceState) -> dict[str, tuple[int, str, int]]:
    """Fact path → (table, destination, metric) of every route `document`'s gateways own."""
    section = document.spec.section("gateways", GatewaysSection)
    if section is None:
        return {}
    out: dict[str, tuple[int, str, int]] = {}
    for table in section.table_numbers(document.spec.tables):
        for family in section.families():
            to, metric = default_route(family)
            out[f"spec.gateways.tables[{_table_name(table)}].ipv{family}"] = (table, to, metric)
    for index, uplink in enumerate(section.uplinks):
        to, _ = default_route(uplink.family)
        out[f"spec.gateways.uplinks[{uplink.name}].probe_route"] = (
            PROBE_TABLE,
            to,
            PROBE_METRIC + index,
        )
        out[f"spec.gateways.uplinks[{uplink.name}].probe_rule"] = (
            PROBE_TABLE,
            f"{_RULE}{uplink.family}:{uplink.interface}",
            PROBE_RULE_PRIORITY,
        )
    return out


def _rule_of(key: tuple[int, str, int]) -> RuleInfo | None:
    """The probe rule a key stands for; None for a route's key."""
    table, to, priority = key
    if not to.startswith(_RULE):
        return None
    family, oif = to[len(_RULE) :].split(":", 1)
    return RuleInfo(int(family), priority, oif, table)


def _rule_value(rule: RuleInfo) -> dict[str, object]:
    return {"oif": rule.oif, "table": rule.table, "priority": rule.priority}


def _key_text(path: str, key: tuple[int, str, int]) -> str:
    return f"{path}|{key[0]}|{key[1]}|{key[2]}"


def _key_of(text: str) -> tuple[str, tuple[int, str, int]]:
    path, table, to, metric = text.rsplit("|", 3)
    return path, (int(table), to, int(metric))


def _route_value(nexthops: list[tuple[str, str, int]], proto: int) -> dict[str, object]:
    return {
        "proto": proto,
        "nexthops": [{"via": v, "dev": d, "weight": w} for v, d, w in sorted(nexthops)],
    }


def installed_decision(document: DeviceState, observed: Facts) -> Decision | None:
    """The decision the routes `observed` hold (ours, through known uplinks), per family; None
    when they hold none. An agent that restarts mid-failover keeps it until the first verdicts."""
    section = document.spec.section("gateways", GatewaysSection)
    if section is None:
        return None
    by_hop = {(u.gateway, u.interface): u.name for u in section.uplinks}
    order = {u.name: i for i, u in enumerate(section.uplinks)}
    choices: dict[int, Choice] = {}
    for table in section.table_numbers(document.spec.tables):
        for family in section.families():
            value = observed.get(f"spec.gateways.tables[{_table_name(table)}].ipv{family}")
            if family in choices or not value or value.get("proto") != GATEWAY_PROTO:
                continue
            names = [by_hop.get((h["via"], h["dev"])) for h in value["nexthops"]]
            if names and all(n is not None for n in names):
                members = sorted({str(n) for n in names}, key=order.__getitem__)
                choices[family] = Choice(tuple(members))
    return Decision(section.policy, choices) if choices else None


class GatewaysSubsystem(Subsystem):
    name = "gateways"
    tier = Tier.ROUTING
    section = SECTION
    may_block = False
    depends_on = ("links", "addresses")
    # Rules have no netlink watch here: the periodic look sees a probe rule deleted.
    watches = (rtnetlink("route", "link", "address"), every(10.0))
    observed_only_matters = True

    def __init__(self) -> None:
        # The agent's monitor feeds it; without one (the CLI alone) every uplink is pending.
        self.board = Board()

    @classmethod
    def scope_keys(cls, document: DeviceState) -> frozenset[str]:
        return frozenset(_key_text(p, k) for p, k in route_keys(document).items())

    def configured(self, document: DeviceState) -> bool:
        return document.spec.section("gateways", GatewaysSection) is not None

    def desired(self, document: DeviceState, scope: Scope) -> Facts:
        facts: Facts = {path: None for path, _ in map(_key_of, scope.keys_for(self.name))}
        section = document.spec.section("gateways", GatewaysSection)
        if section is None:
            return facts
        decision = self.board.decision_for(section)
        uplinks = {u.name: u for u in section.uplinks}
        for table in section.table_numbers(document.spec.tables):
            for family, choice in decision.choices.items():
                weights = section.policy == "balance"
                hops = [
                    (uplinks[n].gateway, uplinks[n].interface, uplinks[n].weight if weights else 1)
                    for n in choice.members
                ]
                path = f"spec.gateways.tables[{_table_name(table)}].ipv{family}"
                facts[path] = _route_value(hops, GATEWAY_PROTO)
        for path, key in route_keys(document).items():
            rule = _rule_of(key)
            if rule is not None:
                facts[path] = _rule_value(rule)
        for uplink in section.uplinks:
            facts[f"spec.gateways.uplinks[{uplink.name}].probe_route"] = _route_value(
                [(uplink.gateway, uplink.interface, 1)], GATEWAY_PROTO
            )
        return facts

    def observe(self, sources: Sources, scope: Scope) -> Facts:
        keys = dict(_key_of(text) for text in scope.keys_for(self.name))
        if not keys:
            return {}
        by_key = {key: path for path, key in keys.items()}
        facts: Facts = {path: None for path in keys}
        wanted = {rule: path for path, key in keys.items() if (rule := _rule_of(key)) is not None}
        if wanted:
            for rule in sources.netlink.rules():
                if rule in wanted:
                    facts[wanted[rule]] = _rule_value(rule)
        for route in sources.netlink.routes({key[0] for key in by_key}):
            path = by_key.get(route.key)
            if path is None:
                continue
            if route.nexthops:
                hops = [(h.via or "", h.dev or "", h.weight) for h in route.nexthops]
            else:
                hops = [(route.via or "", route.dev or "", 1)]
            facts[path] = _route_value(hops, route.proto)
        return facts

    def plan(self, desired: Facts, observed: Facts, scope: Scope) -> Plan:
        keys = dict(_key_of(text) for text in scope.keys_for(self.name))
        steps: list[Step] = []
        for path in natural_sorted(set(desired) | set(observed)):
            want, have = desired.get(path), observed.get(path)
            if want == have or path not in keys:
                continue
            rule = _rule_of(keys[path])
            if rule is not None:
                action = "del-rule" if want is None else "set-rule"
                args = {"family": rule.family, "priority": rule.priority, "oif": rule.oif}
                steps.append(Step(self.name, action, path, {**args, "table": rule.table}))
                continue
            table, to, metric = keys[path]
            base = {"table": table, "to": to, "metric": metric, "family": 6 if ":" in to else 4}
            if want is None:
                steps.append(Step(self.name, "del-route", path, base))
            else:
                # One replace, never a delete first: the default route is never missing.
                steps.append(
                    Step(self.name, "set-route", path, {**base, "nexthops": want["nexthops"]})
                )
        return Plan(self.name, steps, [] if steps else ["every gateway route is in place"])

    def execute(self, sources: Sources, step: Step) -> None:
        a = step.args
        netlink = sources.netlink
        if step.action == "set-route":
            hops = [Nexthop(h["via"], h["dev"], h["weight"]) for h in a["nexthops"]]
            if len(hops) == 1:
                route = RouteInfo(
                    a["table"],
                    a["to"],
                    hops[0].via,
                    hops[0].dev,
                    a["metric"],
                    a["family"],
                    proto=GATEWAY_PROTO,
                )
            else:
                route = RouteInfo(
                    a["table"],
                    a["to"],
                    None,
                    None,
                    a["metric"],
                    a["family"],
                    proto=GATEWAY_PROTO,
                    nexthops=tuple(hops),
                )
            self._install(sources, step, route)
        elif step.action in ("set-rule", "del-rule"):
            rule = RuleInfo(a["family"], a["priority"], a["oif"], a["table"])
            write = netlink.add_rule if step.action == "set-rule" else netlink.del_rule
            self.run_step(step, lambda: write(rule))
        elif step.action == "del-route":
            route = RouteInfo(a["table"], a["to"], None, None, a["metric"], a["family"])
            self.run_step(step, lambda: netlink.del_route(route))
        else:
            raise ValueError(f"unknown gateways step {step.action}")

    def _install(self, sources: Sources, step: Step, route: RouteInfo) -> None:
        """Replace the route; through a link that is gone or down, wait for the link."""
        try:
            sources.netlink.add_route(route)
        except NetlinkError as exc:
            if exc.errno in (errno.ENODEV, errno.ENETUNREACH, errno.ENETDOWN):
                devs = {h.dev for h in route.nexthops} | {route.dev}
                names = ", ".join(sorted(d for d in devs if d is not None))
                raise StepWaits(step, f"waiting on link {names}") from exc
            raise StepError(step, str(exc)) from exc

    def condition(
        self, sources: Sources, document: DeviceState
    ) -> tuple[SubsystemHealth, str] | None:
        del sources
        section = document.spec.section("gateways", GatewaysSection)
        if section is None or not self.board.monitoring:
            return None
        decision = self.board.decision_for(section)
        down = [
            f"every IPv{family} gateway is down: keeping the default route via "
            + ", ".join(choice.members)
            for family, choice in sorted(decision.choices.items())
            if choice.all_down
        ]
        return (SubsystemHealth.DEGRADED, "; ".join(down)) if down else None

    def report(self, sources: Sources, scope: Scope) -> Mapping[str, object]:
        del sources, scope
        section = self.board.section
        return self.board.report(section) if section is not None else {}
