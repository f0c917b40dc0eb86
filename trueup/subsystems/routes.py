"""Routes in the main table and in numbered tables the document names.

In a numbered table trueup manages, every route is trueup's: a route nobody
asked for is drift. In the main table only routes through managed interfaces
are considered, and the management default route belongs to the management
subsystem. Connected, redirect and router-advertisement routes are the
kernel's and never observed.

Routes a routing daemon installs (FRR's zebra for BGP, OSPF, IS-IS, RIP,
EIGRP, Babel) and the default routes the gateway monitor installs are theirs:
they come and go with the network, so they are never observed here as
drift. A route an operator adds by hand (`ip route add`, proto boot) still is.
"""

from __future__ import annotations

from trueup.model.document import DeviceState
from trueup.model.health import Tier
from trueup.model.order import natural_sorted
from trueup.model.types import family_of
from trueup.subsystems.base import Facts, Plan, Scope, Sources, Step, Subsystem
from trueup.system.netlink import RouteInfo
from trueup.system.watches import rtnetlink

__all__ = ["FOREIGN_PROTOCOLS", "RoutesSubsystem", "kernel_metric", "route_path"]

MAIN = 254
# rtm_protocol of routes others own: zebra 11, babel 42, bgp 186, isis 187,
# ospf 188, rip 189, eigrp 192 (FRR's), and the gateway monitor's 250.
FOREIGN_PROTOCOLS = frozenset({11, 42, 186, 187, 188, 189, 192, 250})


def route_path(table: int, to: str, metric: int) -> str:
    name = "main" if table == MAIN else str(table)
    return f"spec.routes[table={name},to={to},metric={metric}]"


def _parse_path(path: str) -> tuple[int, str, int]:
    body = path.split("[", 1)[1].rstrip("]")
    fields = dict(part.split("=", 1) for part in body.split(","))
    table = MAIN if fields["table"] == "main" else int(fields["table"])
    return table, fields["to"], int(fields["metric"])


def kernel_metric(to: str, metric: int) -> int:
    """The kernel stores IPv6 routes asked for with metric 0 at 1024."""
    return 1024 if metric == 0 and family_of(to) == 6 else metric


class RoutesSubsystem(Subsystem):
    name = "routes"
    tier = Tier.NETWORK
    may_block = False
    watches = (rtnetlink("route", "link", "address"),)
    depends_on = ("links", "addresses")
    observed_only_matters = True

    def desired(self, document: DeviceState, scope: Scope) -> Facts:
        facts: Facts = {}
        for route in document.spec.routes:
            table = document.spec.table_number(route.table)
            metric = kernel_metric(route.to, route.metric)
            if (table, route.to, metric) in scope.management_default_routes:
                continue  # the same route as spec.management.gateway: management owns it
            value: dict[str, str | None] = {"via": route.via, "dev": route.dev}
            facts[route_path(table, route.to, metric)] = value
        return facts

    def observe(self, sources: Sources, scope: Scope) -> Facts:
        netlink = sources.netlink
        facts: Facts = {}
        for route in netlink.routes(set(scope.tables)):
            if route.proto in FOREIGN_PROTOCOLS:
                continue
            if route.key in scope.management_default_routes:
                continue
            if route.table == MAIN and route.dev not in scope.interfaces:
                continue
            facts[route_path(*route.key)] = {"via": route.via, "dev": route.dev}
        return facts

    def plan(self, desired: Facts, observed: Facts, scope: Scope) -> Plan:
        removals: list[Step] = []
        additions: list[Step] = []
        for key in natural_sorted(set(desired) | set(observed)):
            want, have = desired.get(key), observed.get(key)
            if (
                want is not None
                and have is not None
                and all(have.get(k) == v for k, v in want.items() if v is not None)
            ):
                continue
            table, to, metric = _parse_path(key)
            base = {"to": to, "table": table, "metric": metric, "family": family_of(to)}
            if have is not None:
                removals.append(Step(self.name, "del-route", key, base))
            if want is not None:
                additions.append(
                    Step(
                        self.name,
                        "add-route",
                        key,
                        {**base, "via": want.get("via"), "dev": want.get("dev")},
                    )
                )
        steps = removals + additions
        return Plan(self.name, steps, [] if steps else ["every managed route is in place"])

    def execute(self, sources: Sources, step: Step) -> None:
        netlink = sources.netlink
        a = step.args
        route = RouteInfo(a["table"], a["to"], a.get("via"), a.get("dev"), a["metric"], a["family"])
        if step.action == "add-route":
            self.run_step(step, lambda: netlink.add_route(route))
        elif step.action == "del-route":
            self.run_step(step, lambda: netlink.del_route(route))
        else:
            raise ValueError(f"unknown routes step {step.action}")
