"""What every subsystem is: observe facts, plan steps, execute a step.

Facts are flat: a document path (`spec.interfaces[lan0].addresses`) mapped to
a canonical JSON value. That makes the diff, the drift report and the
journal's before-images one format.

* `desired(document, scope)` — facts the document asks for;
* `observe(sources, scope)` — facts the system holds, pure parsing of what
  the sources (`trueup.system.sources.Sources`: netlink, files, programs)
  return;
* `plan(desired, observed, scope)` — steps, or a no-op with its reason;
* `execute(sources, step)` — one step.

Next to them a subsystem declares its section of `spec` (`section`: the
`trueup.model.sections.Section` of its light `section.py`, which the catalog
lists too, registered with the document), what it watches (`watches`: rtnetlink kinds, files, a period, a
program), what it depends on and its tier. docs/architecture.md walks
through adding one.

Rollback is not special: it is `plan(before_image, observe(...))` with
`scope.exact` set, so the same code that applies also restores.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel

from trueup.model.document import DeviceState
from trueup.model.health import SubsystemHealth, Tier
from trueup.model.order import natural_sorted
from trueup.model.sections import Section
from trueup.subsystems.scope import Scope
from trueup.subsystems.stepjson import DifferenceJSON, PlannedStep, PlannedValues, StepJSON
from trueup.system.events import NetlinkEvent
from trueup.system.requirements import Requirement, binary, regular_file
from trueup.system.sources import Sources
from trueup.system.watches import Watch

__all__ = [
    "Difference",
    "DifferenceJSON",
    "EventVerdict",
    "Facts",
    "FenceFollowed",
    "Plan",
    "PlannedStep",
    "PlannedValues",
    "Requirement",
    "Scope",
    "Sources",
    "Step",
    "StepError",
    "StepJSON",
    "StepWaits",
    "Subsystem",
    "daemon_failure",
    "diff_facts",
]

Facts = dict[str, Any]


@dataclass(frozen=True)
class FenceFollowed:
    """What one running daemon did when told to follow its subsystem's fence now."""

    daemon: str
    # What it does now ("disabled", "enabled"); "" when it was not told.
    state: str = ""
    # Why it was not told (it follows the record at its next start).
    problem: str = ""
    # It did not answer at all (hung) and was ended instead (`end_hung`).
    ended: bool = False


class StepError(RuntimeError):
    """A step the system refused; names the step and what to fix."""

    def __init__(self, step: Step, message: str) -> None:
        self.step = step
        super().__init__(f"{step.describe()}: {message}")


class StepWaits(StepError):
    """A step that cannot run *yet*: what it needs does not exist (a link not created yet).

    Not a failure: a best-effort transaction reports the subsystem `pending`
    with `reason` ("waiting on link lan0"), its dependents wait on it, and
    the reconcile loop's breaker, back-off and retry budget do not count it.
    The event that ends the wait (RTM_NEWLINK) wakes the loop, which tries
    again at once.
    """

    def __init__(self, step: Step, reason: str) -> None:
        super().__init__(step, reason)
        self.reason = reason


@dataclass(frozen=True)
class Step:
    subsystem: str
    action: str
    path: str
    args: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        # An argument named `_…` is for the step's execution only (a whole daemon
        # configuration): it stays out of descriptions, audit lines and answers' texts.
        detail = " ".join(
            f"{k}={v}" for k, v in self.args.items() if v is not None and not k.startswith("_")
        )
        return f"{self.subsystem}: {self.action} {detail} ({self.path})".replace("  ", " ")

    def to_json(self) -> StepJSON:
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
    # Why the document cannot be applied to this subsystem (its preparation refused it).
    error: str = ""
    # Per step path: {"old": observed, "new": desired} (filled by the engine's plan).
    values: dict[str, PlannedValues] = field(default_factory=dict)

    def step_json(self, step: Step) -> PlannedStep:
        """A step for `plan`'s answer: its JSON, its description and old → new values."""
        out: PlannedStep = {
            "subsystem": step.subsystem,
            "action": step.action,
            "path": step.path,
            "args": step.args,
            "describe": step.describe(),
        }
        values = self.values.get(step.path)
        if values is not None:
            out["old"], out["new"] = values["old"], values["new"]
        return out

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

    def to_json(self) -> DifferenceJSON:
        out: DifferenceJSON = {
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
    for key in natural_sorted(keys):
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


@dataclass(frozen=True)
class EventVerdict:
    """What notifications prove about a subsystem that was in sync (`proven_change`).

    `paths`: what certainly changed (empty: nothing proven); `pending`: a
    change is being reported but not complete yet (more notifications follow
    at once, e.g. the end of an nftables transaction).
    """

    paths: tuple[str, ...] = ()
    lines: tuple[int, ...] = ()  # the sequence numbers of the notifications that prove it
    pending: bool = False


class Subsystem(ABC):
    """One area of the system trueup owns. Subsystems never import each other."""

    name: ClassVar[str]
    tier: ClassVar[Tier]
    depends_on: ClassVar[tuple[str, ...]] = ()
    # Whether a fact present only in observed state (a foreign route) is drift.
    observed_only_matters: ClassVar[bool] = False
    # Whether a key the document stops managing is left as it is (a sysctl name) rather
    # than removed: crash recovery then restores it from the transaction's before-image.
    releases_unmanaged: ClassVar[bool] = False
    # Whether a step can hang (a daemon, a socket): such subsystems converge on a
    # worker thread that is abandoned at the deadline. Netlink ones run inline.
    may_block: ClassVar[bool] = True
    # The section of `spec` this subsystem owns, registered with the document model by
    # `trueup.subsystems.registry`: its `Section` (a plugin may give (name, model)).
    section: ClassVar[Section[Any] | tuple[str, type[BaseModel]] | None] = None
    # The durable fence (`trueup.system.fence`) its daemons follow (`follow_fence`), if any.
    fence: ClassVar[str | None] = None
    # What can change this subsystem's part of the system (`trueup.system.watches`).
    watches: ClassVar[tuple[Watch, ...]] = ()
    # A plugin's short declaration of what it needs (presence only, no package named);
    # built-in subsystems declare `requirements()` instead.
    required_binaries: ClassVar[tuple[str, ...]] = ()
    required_files: ClassVar[tuple[str, ...]] = ()

    @property
    def watch_kinds(self) -> frozenset[str]:
        """The rtnetlink notification kinds that can explain this subsystem's drift."""
        return frozenset(k for w in self.watches if w.kind == "rtnetlink" for k in w.events)

    @classmethod
    def scope_keys(cls, document: DeviceState) -> frozenset[str]:
        """Keys of `Scope.owned` this subsystem manages under `document` (default: none)."""
        del document
        return frozenset()

    def configured(self, document: DeviceState) -> bool:
        """Whether the document asks anything of this subsystem."""
        del document
        return True

    def requirements(self, document: DeviceState) -> list[Requirement]:
        """What the machine must have before an agent runs `document` here: binaries (each
        run in a harmless mode by `trueup preflight`), libraries, files, directories —
        each with the Debian package that provides it (`trueup.system.requirements`).

        Called only when `configured(document)`. The default is what `required_binaries`
        and `required_files` name.
        """
        del document
        return [binary(name, "", probe=()) for name in self.required_binaries] + [
            regular_file(path, "") for path in self.required_files
        ]

    def prepare(self, document: DeviceState) -> None:
        """Work a subsystem needs before it can plan: name resolution, a daemon's socket.

        Runs inside the subsystem's own deadline, never before the management
        tier, and must not change the system. The default needs nothing.
        """
        del document

    def follow_fence(
        self,
        state_dir: Path,
        *,
        fenced: bool | None = None,
        wait: float = 5.0,
        end_hung: bool = False,
    ) -> list[FenceFollowed]:
        """Make this subsystem's running daemons follow its fence (`fence`) now, as the
        record in `state_dir` says or as `fenced` says (a fence enforced before it is
        recorded), and the files they start from too; one entry per running daemon.

        The hook the CLI (`trueup dhcp fence hold|lift`) and the restore call right
        after holding or lifting a fence, with or without an agent; the subsystem
        asserts it at every start too. `end_hung` ends a daemon that does not answer
        at all instead of reporting it. The default holds no fence.
        """
        del state_dir, fenced, wait, end_hung
        return []

    def condition(
        self, sources: Sources, document: DeviceState
    ) -> tuple[SubsystemHealth, str] | None:
        """Health the facts cannot show, laid over it in status: `fenced` (a durable fence
        holds it back), `pending` (waiting for an interface to appear). Must not change
        the system. The default has none."""
        del sources, document
        return None

    @abstractmethod
    def desired(self, document: DeviceState, scope: Scope) -> Facts: ...

    @abstractmethod
    def observe(self, sources: Sources, scope: Scope) -> Facts: ...

    @abstractmethod
    def plan(self, desired: Facts, observed: Facts, scope: Scope) -> Plan: ...

    @abstractmethod
    def execute(self, sources: Sources, step: Step) -> None: ...

    def management_risks(self, document: DeviceState, api_port: int | None) -> list[str]:
        """What `document` would do to management access through this subsystem.

        The engine's management guard refuses a document with findings here
        (those the applied revision did not have already) unless the caller
        arranged a confirmation (`--confirm-within`). `api_port` is the port
        the agent's API listens on when it overrides the document's. The
        default finds nothing.
        """
        del document, api_port
        return []

    def report(self, sources: Sources, scope: Scope) -> Mapping[str, object]:
        """Observations for status beside the facts (a firewall's unmanaged tables): the
        subsystem's own record (a TypedDict), which status shows as JSON as it is."""
        del sources, scope
        return {}

    def observation_mark(self, observed: Facts) -> object | None:
        """A token naming the exact system state `observed` was read at, or None.

        The reconcile loop keeps it when a pass finds the subsystem in sync and
        hands it to `proven_change` with the notifications that follow. The
        default knows no such state: drift is found by the pass alone.
        """
        del observed
        return None

    def proven_change(
        self, mark: object, events: Sequence[tuple[int, NetlinkEvent]]
    ) -> EventVerdict:
        """Whether `events` (numbered notifications) prove a change since the state `mark` names.

        Only a proof counts: the loop records drift from it before its pass
        (which confirms and heals), so a change trueup itself made, or one
        that may have left things as they were, must not be proven. The
        default proves nothing.
        """
        del mark, events
        return EventVerdict()

    def diff(self, desired: Facts, observed: Facts) -> list[Difference]:
        return diff_facts(
            self.name, desired, observed, observed_only_matters=self.observed_only_matters
        )

    def run_step(self, step: Step, call: Callable[[], None]) -> None:
        """Run one system call for `step`; a refusal becomes a `StepError` naming the step."""
        from trueup.system.netlink import NetlinkError

        try:
            call()
        except (NetlinkError, OSError) as exc:
            raise StepError(step, str(exc)) from exc


def daemon_failure(sources: Sources, name: str) -> str | None:
    """Why daemon `name`, which the document asks for, is not running — in its own words
    (the supervisor's last error, else the problem its last instance logged); None while
    it runs or when nothing says."""
    status = sources.daemons.status(name)
    if status.running or not status.last_error:
        return None
    return f"{name} is not running: {status.last_error}"
