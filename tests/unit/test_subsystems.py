"""Table-driven plans: {desired, observed} → steps or a no-op reason, no root needed."""

from __future__ import annotations

from typing import Any

import pytest

from tests.routers import base_document
from trueup.model.document import parse_document
from trueup.subsystems.addresses import AddressesSubsystem
from trueup.subsystems.base import Scope, Subsystem
from trueup.subsystems.links import LinksSubsystem
from trueup.subsystems.management import ManagementSubsystem
from trueup.subsystems.registry import default_subsystems, ordered, scope_for
from trueup.subsystems.routes import RoutesSubsystem

SCOPE = Scope(
    interfaces=frozenset({"mgmt0", "lan0"}),
    tables=frozenset({254, 100}),
    management_interface="mgmt0",
    management_owned=frozenset({"198.51.100.2/24"}),
    management_default_routes=frozenset({(254, "0.0.0.0/0", 0)}),
)
LAN = "spec.interfaces[lan0].addresses"
ROUTE = "spec.routes[table=100,to=192.0.2.0/25,metric=0]"

CASES: list[tuple[str, Subsystem, dict[str, Any], dict[str, Any], list[str], Scope]] = [
    (
        "addresses in place",
        AddressesSubsystem(),
        {LAN: ["203.0.113.1/24"]},
        {LAN: ["203.0.113.1/24"]},
        [],
        SCOPE,
    ),
    (
        "address missing",
        AddressesSubsystem(),
        {LAN: ["203.0.113.1/24"]},
        {LAN: []},
        ["add-address 203.0.113.1/24"],
        SCOPE,
    ),
    (
        "foreign address removed before additions",
        AddressesSubsystem(),
        {LAN: ["203.0.113.1/24"]},
        {LAN: ["203.0.113.9/24"]},
        ["del-address 203.0.113.9/24", "add-address 203.0.113.1/24"],
        SCOPE,
    ),
    (
        "mtu before state",
        LinksSubsystem(),
        {"spec.interfaces[lan0].state": "up", "spec.interfaces[lan0].mtu": 1400},
        {"spec.interfaces[lan0].state": "down", "spec.interfaces[lan0].mtu": 1500},
        ["set-mtu 1400", "set-state up"],
        SCOPE,
    ),
    (
        "mtu unspecified is left alone",
        LinksSubsystem(),
        {"spec.interfaces[lan0].state": "up"},
        {"spec.interfaces[lan0].state": "up", "spec.interfaces[lan0].mtu": 9000},
        [],
        SCOPE,
    ),
    (
        "a missing link is waited for (require-link waits)",
        LinksSubsystem(),
        {"spec.interfaces[lan0].state": "up"},
        {"spec.interfaces[lan0].state": "absent"},
        ["require-link lan0"],
        SCOPE,
    ),
    (
        "route missing",
        RoutesSubsystem(),
        {ROUTE: {"via": "203.0.113.253", "dev": None}},
        {},
        ["add-route 192.0.2.0/25"],
        SCOPE,
    ),
    (
        "foreign route in a managed table",
        RoutesSubsystem(),
        {},
        {ROUTE: {"via": "203.0.113.9", "dev": "lan0"}},
        ["del-route 192.0.2.0/25"],
        SCOPE,
    ),
    (
        "route with kernel-chosen dev matches",
        RoutesSubsystem(),
        {ROUTE: {"via": "203.0.113.253", "dev": None}},
        {ROUTE: {"via": "203.0.113.253", "dev": "lan0"}},
        [],
        SCOPE,
    ),
    (
        "route via changed is replaced",
        RoutesSubsystem(),
        {ROUTE: {"via": "203.0.113.253", "dev": None}},
        {ROUTE: {"via": "203.0.113.1", "dev": "lan0"}},
        ["del-route 192.0.2.0/25", "add-route 192.0.2.0/25"],
        SCOPE,
    ),
    (
        "management make-before-break",
        ManagementSubsystem(),
        {"spec.management.state": "up", "spec.management.addresses": ["198.51.100.3/24"]},
        {"spec.management.state": "up", "spec.management.addresses": ["198.51.100.2/24"]},
        ["add-address 198.51.100.3/24", "del-address 198.51.100.2/24"],
        SCOPE,
    ),
    (
        "management never removes what it did not assign",
        ManagementSubsystem(),
        {"spec.management.state": "up", "spec.management.addresses": ["198.51.100.2/24"]},
        {
            "spec.management.state": "up",
            "spec.management.addresses": ["198.51.100.2/24", "198.51.100.77/24"],
        },
        [],
        SCOPE,
    ),
    (
        "rollback is exact on management",
        ManagementSubsystem(),
        {"spec.management.state": "up", "spec.management.addresses": ["198.51.100.2/24"]},
        {
            "spec.management.state": "up",
            "spec.management.addresses": ["198.51.100.2/24", "198.51.100.77/24"],
        },
        ["del-address 198.51.100.77/24"],
        SCOPE.for_rollback(),
    ),
    (
        "management gateway missing",
        ManagementSubsystem(),
        {
            "spec.management.state": "up",
            "spec.management.addresses": ["198.51.100.2/24"],
            "spec.management.gateway[ipv4]": {"via": "198.51.100.1", "dev": "mgmt0"},
        },
        {"spec.management.state": "up", "spec.management.addresses": ["198.51.100.2/24"]},
        ["add-route 0.0.0.0/0"],
        SCOPE,
    ),
]


def _summary(step: Any) -> str:
    a = step.args
    detail = a.get("prefix") or a.get("to") or a.get("mtu") or a.get("state") or a.get("ifname")
    if step.action == "set-state":
        detail = a["state"]
    return f"{step.action} {detail}"


@pytest.mark.parametrize(
    ("name", "subsystem", "desired", "observed", "steps", "scope"), CASES, ids=[c[0] for c in CASES]
)
def test_plan(
    name: str,
    subsystem: Subsystem,
    desired: dict[str, Any],
    observed: dict[str, Any],
    steps: list[str],
    scope: Scope,
) -> None:
    plan = subsystem.plan(desired, observed, scope)
    assert [_summary(s) for s in plan.steps] == steps
    if not steps:
        assert plan.noop_reasons, "a no-op says why"


def test_ordering_is_by_tier_then_dependencies() -> None:
    names = [s.name for s in ordered(reversed(default_subsystems()))]
    assert names[0] == "management"  # the management tier first
    for sub in default_subsystems():  # every dependency before its dependents
        assert all(names.index(dep) < names.index(sub.name) for dep in sub.depends_on)
    assert names.index("links") < names.index("addresses") < names.index("routes")


def test_scope_owns_previous_management_addresses() -> None:
    previous = parse_document(base_document())
    document = base_document()
    document["spec"]["management"]["addresses"] = ["198.51.100.3/24"]
    scope = scope_for(parse_document(document), previous)
    assert scope.management_owned == {"198.51.100.2/24", "198.51.100.3/24"}
    assert scope.tables == {254, 100}
    assert scope.interfaces == {"mgmt0", "lan0"}


def test_ipv6_metric_zero_is_the_kernels_1024() -> None:
    document = parse_document(
        base_document(routes=[{"to": "2001:db8:2::/48", "via": "2001:db8:1::fe"}])
    )
    facts = RoutesSubsystem().desired(document, scope_for(document))
    assert list(facts) == ["spec.routes[table=main,to=2001:db8:2::/48,metric=1024]"]
