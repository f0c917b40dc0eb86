"""What the reconcile loop shows: per-subsystem healing state, failures, drift, the loop itself.

Who calls this: the reconcile loop rebuilds a `LoopView` after every change
(`build_view`); the status builder (`trueup.reconcile.status.build_status`)
and the agent's metrics (`trueup.agent.metrics`) read it. A view is
immutable, so API threads read it without the loop's lock.

The keys are those of `status` (docs/convergence.md, "Status"): per
subsystem `policy`, `healing`, `breaker`, `consecutive_failures`,
`backoff_seconds`, `next_attempt_at`, `retry_budget`, `contested` (+
`contested_detail`), `acknowledged_until` (+ `acknowledgement`),
`last_heal_at`, `drift` / `last_drift`, and when it applies `reason` and
`waiting`; top level `pending_confirmation` and `reconcile_loop`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import NotRequired, Required, TypedDict

from trueup.journal.confirm import ConfirmOutcome
from trueup.model.digests import json_digest
from trueup.model.document import DeviceState
from trueup.reconcile.acks import EndedAckJSON
from trueup.reconcile.confirm import PendingSummary
from trueup.reconcile.driftbook import (
    Attribution,
    DriftBook,
    DriftHistoryEntry,
    DriftJSON,
    EndedDrift,
)
from trueup.reconcile.healing import (
    Acknowledgement,
    Breaker,
    Governor,
    HealingOptions,
    MarkedPath,
    SubsystemHealing,
)
from trueup.system.events import iso_time

__all__ = [
    "Counters",
    "FailureEntry",
    "LoopActivity",
    "LoopActivityJSON",
    "LoopView",
    "PolicyEntry",
    "RetryBudget",
    "Shown",
    "StatusExtra",
    "StatusInputs",
    "build_view",
    "failure_entry",
    "fought_finding_inputs",
    "policy_entry",
]


log = logging.getLogger("trueup.reconcile")


def _iso(seconds: float | None) -> str | None:
    return iso_time(seconds) if seconds else None


class Counters(TypedDict, total=False):
    """What the loop counted since it started."""

    passes: int
    events: int  # notifications received
    heals_ok: int
    heals_failed: int
    overflows: int  # the notification socket overflowed: a full resync followed
    ticks: int


class LoopActivityJSON(Counters, total=False):
    """Status' `reconcile_loop`: the loop's timing, then its counters."""

    event_source: Required[str | None]
    resync_seconds: Required[float]
    last_pass_at: Required[str | None]
    last_resync_at: Required[str | None]


class RetryBudget(TypedDict):
    used: int  # attempts within the window
    limit: int
    window_seconds: float


class PolicyEntry(TypedDict):
    """One subsystem's healing state, laid over its status entry."""

    policy: str | None
    healing: str  # "active", "notify: detection only", or why a wanted heal does not run
    breaker: Breaker
    consecutive_failures: int
    backoff_seconds: float
    next_attempt_at: str | None
    retry_budget: RetryBudget
    contested: list[str]
    contested_detail: dict[str, MarkedPath]
    fought: dict[str, MarkedPath]  # management only
    acknowledged_until: str | None
    acknowledgement: Acknowledgement | None
    last_heal_at: str | None
    drift: NotRequired[DriftJSON]  # the drift going on
    last_drift: NotRequired[EndedDrift]  # the last one that ended
    reason: NotRequired[str]
    waiting: NotRequired[str]  # the dependency a heal waits for


class FailureEntry(TypedDict):
    """A subsystem's heal failures, for `STATE_RECONCILIATION_FAILED`."""

    detail: str
    since: str | None
    paths: list[str]
    breaker: Breaker
    failures: int
    backoff_seconds: float
    next_attempt_at: str | None
    open_until: str | None


class StatusExtra(TypedDict, total=False):
    """The top-level status keys the loop adds (all of them; without a loop, status shows
    the confirmation ones from the state directory)."""

    pending_confirmation: PendingSummary | None
    confirmation: ConfirmOutcome | None
    reconcile_loop: LoopActivityJSON
    drift_history: list[DriftHistoryEntry]
    acknowledgements_ended: list[EndedAckJSON]


class StatusInputs(TypedDict):
    """`ReconcileLoop.status_inputs()`: the view at once."""

    reconcile_failures: dict[str, FailureEntry]
    drift_since: dict[str, str]
    attribution: dict[str, list[Attribution]]
    policies: dict[str, PolicyEntry]
    extra: StatusExtra


@dataclass(frozen=True)
class LoopActivity:
    """The loop itself: where events come from, how often it resyncs, what it counted."""

    event_source: str | None = None
    resync_seconds: float = 60.0
    last_pass_at: float | None = None
    last_resync_at: float | None = None
    counters: Counters = field(default_factory=lambda: Counters())

    def to_json(self) -> LoopActivityJSON:
        return {
            "event_source": self.event_source,
            "resync_seconds": self.resync_seconds,
            "last_pass_at": _iso(self.last_pass_at),
            "last_resync_at": _iso(self.last_resync_at),
            **self.counters,
        }


@dataclass(frozen=True)
class LoopView:
    policies: dict[str, PolicyEntry] = field(default_factory=dict)
    reconcile_failures: dict[str, FailureEntry] = field(default_factory=dict)
    drift_since: dict[str, str] = field(default_factory=dict)
    attribution: dict[str, list[Attribution]] = field(default_factory=dict)
    pending_confirmation: PendingSummary | None = None
    # The last guarded apply: pending (what it waits for), confirmed or rolled-back, why.
    confirmation: ConfirmOutcome | None = None
    activity: LoopActivity = field(default_factory=LoopActivity)
    # Drift going on and recently ended, newest first (`DriftBook.history_json`).
    drift_history: list[DriftHistoryEntry] = field(default_factory=list)
    # Acknowledgements that ended (expired or withdrawn), newest first.
    ended_acks: list[EndedAckJSON] = field(default_factory=list)

    def status_extra(self) -> StatusExtra:
        """The top-level status keys the loop adds."""
        return {
            "pending_confirmation": self.pending_confirmation,
            "confirmation": self.confirmation,
            "reconcile_loop": self.activity.to_json(),
            "drift_history": self.drift_history,
            "acknowledgements_ended": self.ended_acks,
        }

    def operator_digest(self) -> str:
        """A digest of what an operator sees here (the loop's counters and clock left out):
        it changes when drift is seen or ends, a breaker or an acknowledgement changes, a
        confirmation is pending or settled."""
        return json_digest(
            {
                "policies": self.policies,
                "failures": self.reconcile_failures,
                "pending_confirmation": self.pending_confirmation,
                "confirmation": self.confirmation,
                "drift_history": self.drift_history,
                "ended_acks": self.ended_acks,
            }
        )

    def status_inputs(self) -> StatusInputs:
        """Everything at once, as `ReconcileLoop.status_inputs()` has always answered."""
        return {
            "reconcile_failures": self.reconcile_failures,
            "drift_since": self.drift_since,
            "attribution": self.attribution,
            "policies": self.policies,
            "extra": self.status_extra(),
        }


def policy_entry(
    heal: SubsystemHealing,
    *,
    policy: str | None,
    ack: Acknowledgement | None,
    blocked: str | None,
    options: HealingOptions,
    now: float,
) -> PolicyEntry:
    """One subsystem's healing state; `blocked` says why a wanted heal does not run."""
    return {
        "policy": policy,
        "healing": "notify: detection only" if policy == "notify" else (blocked or "active"),
        "breaker": heal.breaker,
        "consecutive_failures": heal.failures,
        "backoff_seconds": heal.backoff_seconds,
        "next_attempt_at": _iso(heal.next_attempt_at),
        "retry_budget": {
            "used": len([t for t in heal.attempts if t > now - options.retry_window]),
            "limit": options.retry_budget,
            "window_seconds": options.retry_window,
        },
        "contested": sorted(heal.contested),
        "contested_detail": _shown(heal.contested),
        "fought": _shown(heal.fought),
        "acknowledged_until": ack["until_at"] if ack else None,
        "acknowledgement": ack,
        "last_heal_at": _iso(heal.last_heal_at),
    }


def _shown(marked: Mapping[str, MarkedPath]) -> dict[str, MarkedPath]:
    """Contested or fought paths as status shows them (internal clock values left out)."""
    out: dict[str, MarkedPath] = {}
    for path, record in marked.items():
        shown = record.copy()
        shown.pop("last_written_at", None)
        out[path] = shown
    return out


def fought_finding_inputs(policies: Mapping[str, PolicyEntry]) -> dict[str, MarkedPath]:
    """Management paths another writer keeps changing (path → record), from `policies`."""
    entry = policies.get("management")
    return dict(entry["fought"]) if entry is not None else {}


def failure_entry(heal: SubsystemHealing) -> FailureEntry | None:
    """A subsystem's heal failures, for `STATE_RECONCILIATION_FAILED`; None while it has none."""
    if not heal.failures and heal.breaker == Breaker.CLOSED:
        return None
    return {
        "detail": f"{heal.failures} consecutive heal failure(s); breaker "
        f"{heal.breaker}: {heal.last_error}",
        "since": _iso(heal.failing_since),
        "paths": heal.failing_paths,
        "breaker": heal.breaker,
        "failures": heal.failures,
        "backoff_seconds": heal.backoff_seconds,
        "next_attempt_at": _iso(heal.next_attempt_at),
        "open_until": _iso(heal.open_until),
    }


def build_view(
    subsystems: Iterable[str],
    *,
    document: DeviceState | None,
    governor: Governor,
    options: HealingOptions,
    drift: DriftBook,
    waiting: Mapping[str, str],
    pending_confirmation: PendingSummary | None,
    activity: LoopActivity,
    now: float,
    confirmation: ConfirmOutcome | None = None,
) -> LoopView:
    """The view of `subsystems` at `now`; `waiting` is the last pass's dependency waits."""
    failures: dict[str, FailureEntry] = {}
    policies: dict[str, PolicyEntry] = {}
    for name in subsystems:
        heal = governor.of(name)
        policy = document.spec.convergence.policy_for(name) if document else None
        drifting = name in drift.current
        blocked = None
        if policy == "auto" and drifting:
            blocked = governor.blocked(name, now) or waiting.get(name)
        entry = policy_entry(
            heal,
            policy=policy,
            ack=governor.acks.get(name),
            blocked=blocked,
            options=options,
            now=now,
        )
        record = drift.current.get(name)
        if record is not None:
            entry["drift"] = record.to_json()
        if name in drift.last:
            entry["last_drift"] = drift.last[name]
        if heal.contested and not heal.failures and heal.breaker == Breaker.CLOSED:
            entry["reason"] = "; ".join(c["reason"] for c in heal.contested.values())
        if heal.fought:
            entry["reason"] = "; ".join(c["reason"] for c in heal.fought.values())
        if name in waiting and drifting:
            entry["waiting"] = waiting[name]
            entry.setdefault("reason", waiting[name])
        policies[name] = entry
        failure = failure_entry(heal)
        if failure is not None:
            failures[name] = failure
    return LoopView(
        policies=policies,
        reconcile_failures=failures,
        drift_since={n: iso_time(r.since) for n, r in drift.current.items()},
        attribution={n: list(r.attribution) for n, r in drift.current.items()},
        pending_confirmation=pending_confirmation,
        confirmation=confirmation,
        activity=activity,
        drift_history=drift.history_json(),
    )


class Shown:
    """The loop's view as API threads read it, and who hears when an operator would see a change.

    `show` replaces the view (under the loop's lock); when its
    `operator_digest` changed, every `on_change` callback is called (it must
    only signal: the agent reports to the control plane).
    """

    def __init__(self) -> None:
        self.view = LoopView()
        self.on_change: list[Callable[[], None]] = []
        self._digest: str | None = None

    def show(self, view: LoopView) -> None:
        self.view = view
        digest = view.operator_digest()
        if digest != self._digest:
            self._digest = digest
            self.changed()

    def changed(self) -> None:
        for callback in self.on_change:
            try:
                callback()
            except Exception:  # a report that cannot be asked for must not stop the loop
                log.exception("a change of status not reported upstream")

    def now(self, counters: Counters) -> LoopView:
        """The view with the counters as they are now."""
        view = self.view
        return replace(view, activity=replace(view.activity, counters=counters.copy()))
