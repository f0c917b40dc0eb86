"""The management tier: the management interface up, its addresses, its default route.

Comes up before anything else (promise 1). Addresses are only ever removed
from the management interface when trueup assigned them and the document's
`spec.management` no longer lists them, or when a rollback restores a
before-image; an address someone else put there is reported, never removed.
An HA virtual address on the management interface is the HA role's: it is
not observed here at all (`scope.virtual_addresses`).
"""

from __future__ import annotations

import contextlib
from typing import Any

from trueup.model.document import DeviceState
from trueup.model.health import Tier
from trueup.model.types import family_of
from trueup.subsystems.base import Facts, Plan, Scope, Sources, Step, Subsystem
from trueup.system.netlink import RouteInfo
from trueup.system.watches import rtnetlink

__all__ = ["ManagementSubsystem"]

MAIN = 254
STATE = "spec.management.state"
ADDRESSES = "spec.management.addresses"
GATEWAY = "spec.management.gateway"


def _gateway_key(family: int) -> str:
    return f"{GATEWAY}[ipv{family}]"


class ManagementSubsystem(Subsystem):
    name = "management"
    tier = Tier.MANAGEMENT
    may_block = False
    watches = (rtnetlink("link", "address", "route"),)

    def desired(self, document: DeviceState, scope: Scope) -> Facts:
        mgmt = document.spec.management
        facts: Facts = {
            STATE: "up",
            ADDRESSES: sorted(mgmt.addresses),
        }
        for _table, to, _metric in sorted(scope.management_default_routes):
            facts[_gateway_key(family_of(to))] = None
        if mgmt.gateway is not None:
            facts[_gateway_key(family_of(mgmt.gateway))] = {
                "via": mgmt.gateway,
                "dev": mgmt.interface,
            }
        return facts

    def observe(self, sources: Sources, scope: Scope) -> Facts:
        netlink = sources.netlink
        ifname = scope.management_interface
        links = {link.name: link for link in netlink.links()}
        facts: Facts = {}
        link = links.get(ifname)
        facts[STATE] = link.state if link else "absent"
        facts[ADDRESSES] = sorted(
            a.prefix
            for a in netlink.addresses()
            if a.ifname == ifname and not scope.is_virtual(a.prefix)
        )
        routes = netlink.routes({MAIN}) if scope.management_default_routes else []
        for route in routes:
            if route.key in scope.management_default_routes:
                facts[_gateway_key(route.family)] = {"via": route.via, "dev": route.dev}
        return facts

    def plan(self, desired: Facts, observed: Facts, scope: Scope) -> Plan:
        ifname = scope.management_interface
        steps: list[Step] = []
        noop: list[str] = []
        if observed.get(STATE) == "absent":
            steps.append(Step(self.name, "require-link", STATE, {"ifname": ifname}))
        elif observed.get(STATE) != desired.get(STATE):
            steps.append(Step(self.name, "set-link", STATE, {"ifname": ifname, "state": "up"}))
        want = set(desired.get(ADDRESSES, []))
        have = set(observed.get(ADDRESSES, []))
        for prefix in sorted(want - have):
            steps.append(
                Step(self.name, "add-address", ADDRESSES, {"ifname": ifname, "prefix": prefix})
            )
        # Make before break: new management addresses go on before old ones come off.
        for prefix in sorted(have - want):
            if scope.exact or prefix in scope.management_owned:
                steps.append(
                    Step(self.name, "del-address", ADDRESSES, {"ifname": ifname, "prefix": prefix})
                )
            else:
                noop.append(
                    f"{prefix} on {ifname} was not assigned by trueup; reported, never removed "
                    "from the management interface"
                )
        for key in sorted(k for k in desired if k.startswith(GATEWAY)):
            want_route: Any = desired[key]
            have_route: Any = observed.get(key)
            if want_route == have_route or (
                want_route
                and have_route
                and have_route.get("via") == want_route["via"]
                and have_route.get("dev") == want_route["dev"]
            ):
                continue
            family = 6 if key.endswith("[ipv6]") else 4
            to = "::/0" if family == 6 else "0.0.0.0/0"
            metric = 1024 if family == 6 else 0
            if have_route is not None:
                steps.append(
                    Step(
                        self.name,
                        "del-route",
                        key,
                        {"to": to, "table": MAIN, "metric": metric, "family": family},
                    )
                )
            if want_route is not None:
                steps.append(
                    Step(
                        self.name,
                        "add-route",
                        key,
                        {
                            "to": to,
                            "table": MAIN,
                            "metric": metric,
                            "family": family,
                            "via": want_route["via"],
                            "dev": want_route["dev"],
                        },
                    )
                )
        if not steps and not noop:
            noop.append(f"management interface {ifname} is up with its addresses and gateway")
        return Plan(self.name, steps, noop)

    def execute(self, sources: Sources, step: Step) -> None:
        netlink = sources.netlink
        a = step.args
        if step.action == "require-link":
            from trueup.subsystems.base import StepError

            raise StepError(step, f"management interface {a['ifname']} does not exist")
        if step.action == "set-link":
            self.run_step(step, lambda: netlink.set_link(a["ifname"], state=a["state"]))
            # The link came up: neighbours learn its addresses now, not at their next retry.
            for address in netlink.addresses():
                if address.ifname == a["ifname"]:
                    sources.announcer.announce(address.ifname, address.prefix)
        elif step.action == "add-address":
            self.run_step(step, lambda: netlink.add_address(a["ifname"], a["prefix"]))
            sources.announcer.announce(a["ifname"], a["prefix"])
        elif step.action == "del-address":
            if ":" not in a["prefix"]:
                # Without it, removing the primary IPv4 address removes the
                # secondaries of its subnet too — the new management address just
                # added make-before-break among them.
                with contextlib.suppress(OSError):
                    sources.files.write(
                        f"/proc/sys/net/ipv4/conf/{a['ifname']}/promote_secondaries", "1\n"
                    )
            self.run_step(step, lambda: netlink.del_address(a["ifname"], a["prefix"]))
        elif step.action in ("add-route", "del-route"):
            route = RouteInfo(
                a["table"], a["to"], a.get("via"), a.get("dev"), a["metric"], a["family"]
            )
            if step.action == "add-route":
                self.run_step(step, lambda: netlink.add_route(route))
            else:
                self.run_step(step, lambda: netlink.del_route(route))
        else:
            raise ValueError(f"unknown management step {step.action}")
