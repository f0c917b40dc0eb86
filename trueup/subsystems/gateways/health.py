"""Whether an uplink is up, and which uplinks the default routes go through: pure functions.

Who calls this: the monitor (`trueup.subsystems.gateways.monitor`), after
each probe round, and the subsystem's `desired` (the routes the decision
implies). No clock, no sockets: the caller gives the time and the answers,
so the unit tests drive both by hand.

A probe *round* sends one probe to each target and is **good** when at least
`reliability` targets answered in time and, over the last `window` rounds,
the loss stays within `max_loss_percent` and the mean latency within
`max_latency_ms`. The state machine, with its hysteresis:

    pending ──up_after good──► up ──down_after failed──► down ──up_after good──► up
       └──────down_after failed──────────────────────────►┘

A failed round resets the good count and a good round the failed count, so
an upstream that flaps faster than the hysteresis never changes the state.

The decision, per address family: `failover` takes the up uplink with the
lowest priority (then document order); `balance` takes every up uplink,
weighted. With none up, the last decision is kept (or, before any, the
highest priority): a router never loses its default route to a probe, and
the decision says so (`all_down`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum

__all__ = [
    "Choice",
    "Decision",
    "GatewayState",
    "Member",
    "RoundResult",
    "Thresholds",
    "Tracker",
    "decide",
]


class GatewayState(StrEnum):
    PENDING = "pending"
    UP = "up"
    DOWN = "down"


@dataclass(frozen=True)
class Thresholds:
    reliability: int = 1
    window: int = 10
    max_loss_percent: float = 20.0
    max_latency_ms: float = 1000.0
    down_after: int = 3
    up_after: int = 5


@dataclass(frozen=True)
class RoundResult:
    """One round: each target's latency in ms, None for no answer in time."""

    latencies_ms: tuple[float | None, ...]

    @property
    def answered(self) -> int:
        return sum(1 for latency in self.latencies_ms if latency is not None)


@dataclass
class Tracker:
    """One uplink's state, counts and window; `observe` each round."""

    thresholds: Thresholds
    state: GatewayState = GatewayState.PENDING
    since: float | None = None
    good_in_a_row: int = 0
    failed_in_a_row: int = 0
    last_good: bool | None = None
    rounds: deque[tuple[bool, float | None]] = field(default_factory=deque)

    def observe(self, result: RoundResult, now: float) -> GatewayState | None:
        """Take one round's answers; the previous state when this round changed it, else None."""
        answered = [lat for lat in result.latencies_ms if lat is not None]
        reached = len(answered) >= self.thresholds.reliability
        latency = sum(answered) / len(answered) if answered else None
        self.rounds.append((reached, latency))
        while len(self.rounds) > self.thresholds.window:
            self.rounds.popleft()
        good = (
            reached
            and self.loss_percent() <= self.thresholds.max_loss_percent
            and (self.latency_ms() or 0.0) <= self.thresholds.max_latency_ms
        )
        self.last_good = good
        if good:
            self.good_in_a_row += 1
            self.failed_in_a_row = 0
        else:
            self.failed_in_a_row += 1
            self.good_in_a_row = 0
        before = self.state
        if before is not GatewayState.UP and self.good_in_a_row >= self.thresholds.up_after:
            self.state = GatewayState.UP
        elif before is not GatewayState.DOWN and self.failed_in_a_row >= self.thresholds.down_after:
            self.state = GatewayState.DOWN
        if self.state is before:
            return None
        self.since = now
        return before

    def loss_percent(self) -> float:
        if not self.rounds:
            return 0.0
        lost = sum(1 for reached, _ in self.rounds if not reached)
        return 100.0 * lost / len(self.rounds)

    def latency_ms(self) -> float | None:
        """The mean latency of the window's answered rounds, None when none answered."""
        values = [lat for _, lat in self.rounds if lat is not None]
        return sum(values) / len(values) if values else None


@dataclass(frozen=True)
class Member:
    """An uplink as the decision sees it."""

    name: str
    family: int
    priority: int
    weight: int
    index: int  # document order, the tie-break


@dataclass(frozen=True)
class Choice:
    """The uplinks one family's default routes go through, and why."""

    members: tuple[str, ...]
    all_down: bool = False  # no uplink is up: the last route (or the first) is kept
    kept: bool = False  # the members are kept from the last decision


@dataclass(frozen=True)
class Decision:
    policy: str
    choices: dict[int, Choice]  # address family → choice

    def active(self) -> list[str]:
        return [name for family in sorted(self.choices) for name in self.choices[family].members]


def _order(members: list[Member]) -> list[Member]:
    return sorted(members, key=lambda m: (m.priority, m.index))


def decide(
    policy: str,
    members: list[Member],
    states: dict[str, GatewayState],
    last: Decision | None = None,
) -> Decision:
    """Which uplinks carry each family's default routes (see the module docstring)."""
    choices: dict[int, Choice] = {}
    for family in sorted({m.family for m in members}):
        ordered = _order([m for m in members if m.family == family])
        up = [m for m in ordered if states.get(m.name) is GatewayState.UP]
        if up:
            chosen = up if policy == "balance" else up[:1]
            choices[family] = Choice(tuple(m.name for m in chosen))
            continue
        every_down = all(states.get(m.name) is GatewayState.DOWN for m in ordered)
        names = {m.name for m in ordered}
        previous = last.choices.get(family) if last is not None else None
        if previous is not None and previous.members and set(previous.members) <= names:
            choices[family] = Choice(previous.members, all_down=every_down, kept=True)
        else:
            choices[family] = Choice((ordered[0].name,), all_down=every_down)
    return Decision(policy, choices)
