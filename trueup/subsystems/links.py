"""Links: admin state and MTU of the interfaces in `spec.interfaces`.

trueup does not create or delete links; a named interface that is missing is
waited for, not failed (`StepWaits`: the subsystem is `pending`, "waiting on
link lan0", and its dependents wait with it): a NIC whose driver comes late
at boot, a veth created by another service. Its RTM_NEWLINK wakes the
reconcile loop, which converges it at once.
"""

from __future__ import annotations

from trueup.model.document import DeviceState
from trueup.model.health import SubsystemHealth, Tier, waiting_on_links
from trueup.subsystems.base import Facts, Plan, Scope, Sources, Step, StepWaits, Subsystem
from trueup.system.watches import rtnetlink

__all__ = ["LinksSubsystem"]


def _path(ifname: str, attr: str) -> str:
    return f"spec.interfaces[{ifname}].{attr}"


class LinksSubsystem(Subsystem):
    name = "links"
    tier = Tier.NETWORK
    may_block = False
    watches = (rtnetlink("link"),)

    def desired(self, document: DeviceState, scope: Scope) -> Facts:
        facts: Facts = {}
        for iface in document.spec.interfaces:
            facts[_path(iface.name, "state")] = iface.state
            if iface.mtu is not None:
                facts[_path(iface.name, "mtu")] = iface.mtu
        return facts

    def observe(self, sources: Sources, scope: Scope) -> Facts:
        netlink = sources.netlink
        facts: Facts = {}
        present = {link.name: link for link in netlink.links()}
        for ifname in sorted(scope.interfaces - {scope.management_interface}):
            link = present.get(ifname)
            facts[_path(ifname, "state")] = link.state if link else "absent"
            if link is not None:
                facts[_path(ifname, "mtu")] = link.mtu
        return facts

    def plan(self, desired: Facts, observed: Facts, scope: Scope) -> Plan:
        steps: list[Step] = []
        # MTU before admin state: a link comes up with its final MTU.
        for key in sorted(desired, key=lambda k: (not k.endswith(".mtu"), k)):
            want, have = desired[key], observed.get(key)
            ifname = key.split("[", 1)[1].split("]", 1)[0]
            if observed.get(_path(ifname, "state")) == "absent":
                if key.endswith(".state") and want != "absent":
                    steps.append(Step(self.name, "require-link", key, {"ifname": ifname}))
                continue
            if want == have:
                continue
            if key.endswith(".mtu"):
                steps.append(Step(self.name, "set-mtu", key, {"ifname": ifname, "mtu": want}))
            else:
                steps.append(Step(self.name, "set-state", key, {"ifname": ifname, "state": want}))
        noop = [] if steps else ["every managed link has its state and MTU"]
        return Plan(self.name, steps, noop)

    def condition(
        self, sources: Sources, document: DeviceState
    ) -> tuple[SubsystemHealth, str] | None:
        present = {link.name for link in sources.netlink.links()}
        missing = [i.name for i in document.spec.interfaces if i.name not in present]
        return waiting_on_links(missing)

    def execute(self, sources: Sources, step: Step) -> None:
        netlink = sources.netlink
        a = step.args
        if step.action == "require-link":
            raise StepWaits(
                step,
                f"waiting on link {a['ifname']}: it does not exist yet (trueup does not "
                "create links; it converges it as soon as it appears)",
            )
        if step.action == "set-mtu":
            self.run_step(step, lambda: netlink.set_link(a["ifname"], mtu=a["mtu"]))
        elif step.action == "set-state":
            self.run_step(step, lambda: netlink.set_link(a["ifname"], state=a["state"]))
        else:
            raise ValueError(f"unknown links step {step.action}")
