"""What every subsystem is: observe facts, plan steps, execute a step.

Facts are flat: a document path (`spec.interfaces[lan0].addresses`) mapped to
a canonical JSON value. That makes the diff, the drift report and the
journal's before-images one format.

* `desired(document, scope)` — facts the document asks for;
* `observe(netlink, scope)` — facts the system holds, pure parsing of what
  `system/` returns;
* `plan(desired, observed, scope)` — steps, or a no-op with its reason;
* `execute(netlink, step)` — one step.

Rollback is not special: it is `plan(before_image, observe(...))` with
`scope.exact` set, so the same code that applies also restores.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from trueup.model.document import DeviceState
from trueup.model.health import Tier
from trueup.system.netlink import Netlink

__all__ = [
    "Difference",
    "Facts",
    "Plan",
    "Scope",
    "Step",
    "StepError",
    "Subsystem",
    "diff_facts",
]

Facts = dict[str, Any]


class StepError(RuntimeError):
    """A step the system refused; names the step and what to fix."""

    def __init__(self, step: Step, message: str) -> None:
        self.step = step
        super().__init__(f"{step.describe()}: {message}")


@dataclass(frozen=True)
class Scope:
    """What a transaction may observe and change.

    `management_owned` lists management addresses trueup itself assigned (the
    previous and the new document's): only those are ever removed from the
    management interface, so the management address survives everything but
    an edit of `spec.management`. `exact` is set for rollbacks, which restore
    a before-image precisely.
    """

    interfaces: frozenset[str] = frozenset()
    tables: frozenset[int] = frozenset({254})
    management_interface: str = ""
    management_owned: frozenset[str] = frozenset()
    management_default_routes: frozenset[tuple[int, str, int]] = frozenset()
    exact: bool = False

    def for_rollback(self) -> Scope:
        return replace(self, exact=True)

    def to_json(self) -> dict[str, Any]:
        return {
            "interfaces": sorted(self.interfaces),
            "tables": sorted(self.tables),
            "management_interface": self.management_interface,
            "management_owned": sorted(self.management_owned),
            "management_default_routes": sorted(list(k) for k in self.management_default_routes),
            "exact": self.exact,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Scope:
        return cls(
            interfaces=frozenset(data["interfaces"]),
            tables=frozenset(data["tables"]),
            management_interface=data["management_interface"],
            management_owned=frozenset(data["management_owned"]),
            management_default_routes=frozenset(
                (int(t), str(to), int(m)) for t, to, m in data["management_default_routes"]
            ),
            exact=bool(data.get("exact", False)),
        )


@dataclass(frozen=True)
class Step:
    subsystem: str
    action: str
    path: str
    args: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        detail = " ".join(f"{k}={v}" for k, v in self.args.items() if v is not None)
        return f"{self.subsystem}: {self.action} {detail} ({self.path})".replace("  ", " ")

    def to_json(self) -> dict[str, Any]:
        return {
            "subsystem": self.subsystem,
            "action": self.action,
            "path": self.path,
            "args": self.args,
        }


@dataclass(frozen=True)
class Plan:
    subsystem: str
    steps: list[Step]
    noop_reasons: list[str] = field(default_factory=list)

    @property
    def changes(self) -> bool:
        return bool(self.steps)


@dataclass(frozen=True)
class Difference:
    """One path where observed differs from desired."""

    subsystem: str
    path: str
    desired: Any
    observed: Any
    missing: list[Any] = field(default_factory=list)
    extra: list[Any] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "subsystem": self.subsystem,
            "path": self.path,
            "desired": self.desired,
            "observed": self.observed,
        }
        if self.missing:
            out["missing"] = self.missing
        if self.extra:
            out["extra"] = self.extra
        return out


def _matches(desired: Any, observed: Any) -> bool:
    if isinstance(desired, dict) and isinstance(observed, dict):
        return all(observed.get(k) == v for k, v in desired.items() if v is not None)
    if isinstance(desired, list) and isinstance(observed, list):
        return sorted(map(str, desired)) == sorted(map(str, observed))
    return bool(desired == observed)


def diff_facts(
    subsystem: str, desired: Facts, observed: Facts, *, observed_only_matters: bool
) -> list[Difference]:
    keys = list(desired)
    if observed_only_matters:
        keys += [k for k in observed if k not in desired]
    out: list[Difference] = []
    for key in sorted(keys):
        want, have = desired.get(key), observed.get(key)
        if _matches(want, have):
            continue
        missing: list[Any] = []
        extra: list[Any] = []
        if isinstance(want, list) and isinstance(have, list):
            missing = [v for v in want if v not in have]
            extra = [v for v in have if v not in want]
        out.append(Difference(subsystem, key, want, have, missing, extra))
    return out


class Subsystem(ABC):
    """One area of the system trueup owns. Subsystems never import each other."""

    name: ClassVar[str]
    tier: ClassVar[Tier]
    depends_on: ClassVar[tuple[str, ...]] = ()
    # Whether a fact present only in observed state (a foreign route) is drift.
    observed_only_matters: ClassVar[bool] = False
    # Whether a step can hang (a daemon, a socket): such subsystems converge on a
    # worker thread that is abandoned at the deadline. Netlink ones run inline.
    may_block: ClassVar[bool] = True
    # What `trueup preflight` checks before an agent that runs this subsystem starts.
    required_binaries: ClassVar[tuple[str, ...]] = ()
    required_files: ClassVar[tuple[str, ...]] = ()

    def configured(self, document: DeviceState) -> bool:
        """Whether the document asks anything of this subsystem."""
        del document
        return True

    def prepare(self, document: DeviceState) -> None:
        """Work a subsystem needs before it can plan: name resolution, a daemon's socket.

        Runs inside the subsystem's own deadline, never before the management
        tier, and must not change the system. The default needs nothing.
        """
        del document

    @abstractmethod
    def desired(self, document: DeviceState, scope: Scope) -> Facts: ...

    @abstractmethod
    def observe(self, netlink: Netlink, scope: Scope) -> Facts: ...

    @abstractmethod
    def plan(self, desired: Facts, observed: Facts, scope: Scope) -> Plan: ...

    @abstractmethod
    def execute(self, netlink: Netlink, step: Step) -> None: ...

    def diff(self, desired: Facts, observed: Facts) -> list[Difference]:
        return diff_facts(
            self.name, desired, observed, observed_only_matters=self.observed_only_matters
        )

    def run_step(self, netlink: Netlink, step: Step, call: Callable[[], None]) -> None:
        from trueup.system.netlink import NetlinkError

        try:
            call()
        except NetlinkError as exc:
            raise StepError(step, str(exc)) from exc
