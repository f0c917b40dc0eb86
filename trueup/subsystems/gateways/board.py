"""The gateways' shared state: each uplink's tracker and the decision the routes follow.

Who uses this: the monitor (`trueup.agent.gateways`), which feeds it probe
rounds and switches the routes when the decision changes, and the subsystem,
whose desired facts are the routes of the current decision. One board per
agent process, held by its `GatewaysSubsystem`; everything under one lock.

`sync(section)` follows the applied document: an uplink whose probe settings
are unchanged keeps its tracker (state, counts, window, since), so a new
document never restarts the failover it is in the middle of; a new or
changed uplink starts `pending`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypedDict

from trueup.subsystems.gateways.health import (
    Decision,
    GatewayState,
    Member,
    RoundResult,
    Thresholds,
    Tracker,
    decide,
)
from trueup.subsystems.gateways.section import GatewaysSection, Uplink

__all__ = ["Board", "GatewayReport", "GatewaysReport", "Transition"]


class GatewayReport(TypedDict):
    """One uplink in status."""

    name: str
    interface: str
    gateway: str
    priority: int
    weight: int
    state: str
    since: str | None
    loss_percent: float
    latency_ms: float | None
    active: bool


class GatewaysReport(TypedDict):
    """`subsystems.gateways.system` in status."""

    policy: str
    active: list[str]
    all_down: bool
    monitoring: bool
    gateways: list[GatewayReport]


@dataclass(frozen=True)
class Transition:
    """An uplink's state change, or the decision's, as the monitor audits it."""

    gateway: str
    before: str
    after: str
    at: float


def thresholds_of(uplink: Uplink) -> Thresholds:
    return Thresholds(
        reliability=uplink.reliability,
        window=uplink.window,
        max_loss_percent=uplink.max_loss_percent,
        max_latency_ms=uplink.max_latency_ms,
        down_after=uplink.down_after,
        up_after=uplink.up_after,
    )


def members_of(section: GatewaysSection) -> list[Member]:
    return [
        Member(u.name, u.family, u.priority, u.weight, i) for i, u in enumerate(section.uplinks)
    ]


def _iso(at: float | None) -> str | None:
    if at is None:
        return None
    millis = min(999, round((at % 1) * 1000))
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)) + f".{millis:03d}Z"


class Board:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.section: GatewaysSection | None = None
        self._trackers: dict[str, tuple[tuple[object, ...], Tracker]] = {}
        self.decision: Decision | None = None
        self.monitoring = False  # a monitor feeds this board (the agent); else probes never ran

    def sync(self, section: GatewaysSection | None) -> None:
        """Follow the applied document's uplinks (see the module docstring)."""
        with self.lock:
            self.section = section
            kept: dict[str, tuple[tuple[object, ...], Tracker]] = {}
            for uplink in section.uplinks if section is not None else []:
                settings = uplink.probe_settings()
                known = self._trackers.get(uplink.name)
                if known is not None and known[0] == settings:
                    kept[uplink.name] = known
                else:
                    kept[uplink.name] = (settings, Tracker(thresholds_of(uplink)))
            self._trackers = kept
            if section is None:
                self.decision = None

    def states_for(self, section: GatewaysSection) -> dict[str, GatewayState]:
        """Each uplink's state as far as this board knows it for `section` (a tracker whose
        settings differ, or none, is pending)."""
        with self.lock:
            out = {}
            for uplink in section.uplinks:
                known = self._trackers.get(uplink.name)
                matches = known is not None and known[0] == uplink.probe_settings()
                out[uplink.name] = known[1].state if known and matches else GatewayState.PENDING
            return out

    def decision_for(self, section: GatewaysSection) -> Decision:
        """The decision `section` gets from what the board knows (not remembered)."""
        with self.lock:
            return decide(
                section.policy, members_of(section), self.states_for(section), self.decision
            )

    def observe(
        self, name: str, settings: tuple[object, ...], result: RoundResult, now: float
    ) -> Transition | None:
        """One probe round of uplink `name` (probed with `settings`); its state change, if any."""
        with self.lock:
            known = self._trackers.get(name)
            if known is None or known[0] != settings:
                return None  # the document changed under the probe: its round is not this uplink's
            before = known[1].observe(result, now)
            if before is None:
                return None
            return Transition(name, before.value, known[1].state.value, now)

    @contextmanager
    def deciding(self) -> Iterator[tuple[Decision | None, Decision | None]]:
        """(previous, new) decision under the board's lock; the new one is remembered."""
        with self.lock:
            previous = self.decision
            new = self.decision_for(self.section) if self.section is not None else None
            self.decision = new
            yield previous, new

    def remember(self, decision: Decision) -> None:
        with self.lock:
            self.decision = decision

    def report(self, section: GatewaysSection) -> GatewaysReport:
        with self.lock:
            decision = self.decision_for(section)
            active = set(decision.active())
            gateways: list[GatewayReport] = []
            for uplink in section.uplinks:
                known = self._trackers.get(uplink.name)
                tracker = known[1] if known and known[0] == uplink.probe_settings() else None
                latency = tracker.latency_ms() if tracker is not None else None
                gateways.append(
                    {
                        "name": uplink.name,
                        "interface": uplink.interface,
                        "gateway": uplink.gateway,
                        "priority": uplink.priority,
                        "weight": uplink.weight,
                        "state": (tracker.state if tracker else GatewayState.PENDING).value,
                        "since": _iso(tracker.since) if tracker else None,
                        "loss_percent": round(tracker.loss_percent(), 1) if tracker else 0.0,
                        "latency_ms": round(latency, 2) if latency is not None else None,
                        "active": uplink.name in active,
                    }
                )
            return {
                "policy": section.policy,
                "active": decision.active(),
                "all_down": any(c.all_down for c in decision.choices.values()),
                "monitoring": self.monitoring,
                "gateways": gateways,
            }
