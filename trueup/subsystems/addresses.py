"""Addresses (IPv4 and IPv6) on the interfaces in `spec.interfaces`.

An interface listed in the document is owned whole: an address on it that the
document does not list is drift and is removed. IPv6 link-local addresses
belong to the kernel and are never observed; HA virtual addresses
(`scope.virtual_addresses`) belong to the HA role and are never observed
either.
"""

from __future__ import annotations

from trueup.model.document import DeviceState
from trueup.model.health import Tier
from trueup.subsystems.base import Facts, Plan, Scope, Sources, Step, Subsystem
from trueup.system.watches import rtnetlink

__all__ = ["AddressesSubsystem"]


def _path(ifname: str) -> str:
    return f"spec.interfaces[{ifname}].addresses"


def _ifname(path: str) -> str:
    return path.split("[", 1)[1].split("]", 1)[0]


class AddressesSubsystem(Subsystem):
    name = "addresses"
    tier = Tier.NETWORK
    may_block = False
    watches = (rtnetlink("address", "link"),)
    depends_on = ("links",)

    def desired(self, document: DeviceState, scope: Scope) -> Facts:
        return {_path(i.name): sorted(i.addresses) for i in document.spec.interfaces}

    def observe(self, sources: Sources, scope: Scope) -> Facts:
        netlink = sources.netlink
        managed = scope.interfaces - {scope.management_interface}
        facts: Facts = {_path(name): [] for name in sorted(managed)}
        for address in netlink.addresses():
            if address.ifname in managed and not scope.is_virtual(address.prefix):
                facts[_path(address.ifname)].append(address.prefix)
        return {k: sorted(v) for k, v in facts.items()}

    def plan(self, desired: Facts, observed: Facts, scope: Scope) -> Plan:
        removals: list[Step] = []
        additions: list[Step] = []
        for key, want_list in sorted(desired.items()):
            ifname = _ifname(key)
            want, have = set(want_list), set(observed.get(key, []))
            removals += [
                Step(self.name, "del-address", key, {"ifname": ifname, "prefix": p})
                for p in sorted(have - want)
            ]
            additions += [
                Step(self.name, "add-address", key, {"ifname": ifname, "prefix": p})
                for p in sorted(want - have)
            ]
        steps = removals + additions
        return Plan(self.name, steps, [] if steps else ["every managed address is in place"])

    def execute(self, sources: Sources, step: Step) -> None:
        netlink = sources.netlink
        a = step.args
        if step.action == "add-address":
            self.run_step(step, lambda: netlink.add_address(a["ifname"], a["prefix"]))
        elif step.action == "del-address":
            self.run_step(step, lambda: netlink.del_address(a["ifname"], a["prefix"]))
        else:
            raise ValueError(f"unknown addresses step {step.action}")
