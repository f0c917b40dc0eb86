"""Kernel parameters (`spec.sysctl`): the worked example of adding a subsystem.

```yaml
spec:
  sysctl:
    net.ipv4.ip_forward: 1
    net.ipv6.conf.all.forwarding: 1
```

Everything a subsystem is, beside its section (`section.py`: `SysctlSection`,
listed in the catalog; docs/architecture.md walks through both): its facts (`spec.sysctl[NAME]` → the value as
the kernel prints it), a plan (set the ones that differ), one kind of step
(write `/proc/sys/...` through `sources.files`), what it watches (a periodic
look: `/proc/sys` sends no inotify events) and its scope (the names the
document — or the previous revision — sets; others are never touched).
Inside a network namespace the `net.*` parameters are the namespace's own.
"""

from __future__ import annotations

from trueup.model.document import DeviceState
from trueup.model.health import Tier
from trueup.subsystems.base import Facts, Plan, Scope, Sources, Step, StepError, Subsystem
from trueup.subsystems.sysctl.section import SECTION, SysctlSection
from trueup.system.watches import every

__all__ = ["SysctlSection", "SysctlSubsystem"]


def _path(name: str) -> str:
    return f"spec.sysctl[{name}]"


def _proc(name: str) -> str:
    return "/proc/sys/" + name.replace(".", "/")


class SysctlSubsystem(Subsystem):
    name = "sysctl"
    tier = Tier.NETWORK
    section = SECTION
    watches = (every(10.0),)
    releases_unmanaged = True  # a name dropped from the document keeps its value

    @classmethod
    def scope_keys(cls, document: DeviceState) -> frozenset[str]:
        section = document.spec.section("sysctl", SysctlSection)
        return frozenset(section.root) if section is not None else frozenset()

    def configured(self, document: DeviceState) -> bool:
        return document.spec.section("sysctl", SysctlSection) is not None

    def desired(self, document: DeviceState, scope: Scope) -> Facts:
        section = document.spec.section("sysctl", SysctlSection)
        if section is None:
            return {}
        return {_path(name): str(value) for name, value in section.root.items()}

    def observe(self, sources: Sources, scope: Scope) -> Facts:
        facts: Facts = {}
        for name in sorted(scope.keys_for(self.name)):
            text = sources.files.read(_proc(name))
            facts[_path(name)] = " ".join(text.split()) if text is not None else None
        return facts

    def plan(self, desired: Facts, observed: Facts, scope: Scope) -> Plan:
        names = {_path(name): name for name in scope.keys_for(self.name)}
        steps = [
            Step(self.name, "set-sysctl", path, {"name": names[path], "value": want})
            for path, want in sorted(desired.items())
            # A value of None is a name this kernel did not have: nothing to set back.
            if want is not None and observed.get(path) != want
        ]
        return Plan(self.name, steps, [] if steps else ["every sysctl has its value"])

    def execute(self, sources: Sources, step: Step) -> None:
        if step.action != "set-sysctl":
            raise ValueError(f"unknown sysctl step {step.action}")
        name, value = step.args["name"], step.args["value"]
        if sources.files.read(_proc(name)) is None:
            raise StepError(step, f"no sysctl {name} on this kernel (no {_proc(name)})")
        self.run_step(step, lambda: sources.files.write(_proc(name), f"{value}\n"))
