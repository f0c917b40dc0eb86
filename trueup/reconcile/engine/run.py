"""One transaction's state as a value: what the checks decided and what each step did.

`trueup.reconcile.engine.checks.check` builds a `TransactionRun` from a
`Change`; every later step (`execute`, `verify`, `commit`, `roll_back`)
reads it and records on it what it did. Nothing else holds a transaction's
state: the engine keeps only which run is under way (`Engine.running`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trueup.model.document import DeviceState
from trueup.model.records import Applied
from trueup.reconcile import faults
from trueup.reconcile.changes import ApplyResult, Change, Kind, Mode, Outcome
from trueup.subsystems.base import Facts, Plan, Scope, StepError
from trueup.system.netlink import NetlinkError

if TYPE_CHECKING:
    from trueup.reconcile.engine.checks import Preparation

__all__ = [
    "ATOMIC_WAIT",
    "LOCAL_ORIGINS",
    "PREEMPTED",
    "STEP_ERRORS",
    "Preempted",
    "TransactionRun",
    "hit",
    "paths_text",
]

# What a subsystem's observation or step may raise: that subsystem fails, the transaction goes on.
STEP_ERRORS = (StepError, NetlinkError, ValueError, OSError)

# Origins an operator starts on the device itself; on a managed device they are overrides.
LOCAL_ORIGINS = frozenset({"local-cli", "rollback"})

# Why a heal left a subsystem: an operator's write waits (waiting, never a failure).
PREEMPTED = "deferred: an operator's write is waiting for the writer; the next pass heals it"

# What an atomic apply that met a missing link says (it rolls back; nothing goes on by itself).
ATOMIC_WAIT = (
    "nothing of this revision was kept; create the link, or apply with --mode best-effort "
    "to converge the rest now and the link's part once it appears"
)


class Preempted(StepError):
    """A heal abandoned a subsystem's convergence for an operator's write."""


def hit(kind: Kind, point: str) -> None:
    """A fault point of a transaction (`trueup.reconcile.faults`): `point`, then `kind/point`."""
    faults.hit(point)
    faults.hit(f"{kind}/{point}")


def paths_text(paths: list[str]) -> str:
    """The differing paths, for a failure that has no evidence of another writer."""
    if not paths:
        return "the plan is not empty"
    return ", ".join(paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")


@dataclass
class TransactionRun:
    """One transaction under way: its checked change, its before-images, plans and outcome.

    Set by the checks: `change` (a stale heal's document replaced by the applied
    one), `document` (with its version), `version`, `digest`, `same_version`,
    `previous` (what management must not lose), `scope`, `names` (the
    subsystems it may change) and `carried` (failing before it, unchanged by
    it: left out). Set when it observes and plans: `before`, `targets`,
    `plans`, `late` (preparations still running), `skipped`. Set as it runs:
    `txn`, `failed`, `waiting`, `healed` (subsystem → steps run) and `touched`
    (converged, in order: what a rollback undoes, last first).
    """

    change: Change
    applied: Applied  # the applied record when the transaction started
    previous: DeviceState | None
    document: DeviceState
    version: int
    digest: str
    same_version: bool
    scope: Scope
    names: list[str]
    skipped: dict[str, str]
    preparation: Preparation | None = None
    carried: dict[str, str] = field(default_factory=dict)
    before: dict[str, Facts] = field(default_factory=dict)
    targets: dict[str, Facts] = field(default_factory=dict)
    plans: dict[str, Plan] = field(default_factory=dict)
    late: set[str] = field(default_factory=set)
    txn: str = ""
    failed: dict[str, str] = field(default_factory=dict)
    waiting: dict[str, str] = field(default_factory=dict)
    healed: dict[str, list[str]] = field(default_factory=dict)
    touched: list[str] = field(default_factory=list)
    # The audit lines its commit carries (written after it, `complete_audit` if lost).
    audit_lines: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    @property
    def kind(self) -> Kind:
        return self.change.kind

    @property
    def heal(self) -> bool:
        return self.change.kind == Kind.RECONCILE

    @property
    def mode(self) -> Mode:
        return self.change.mode

    @property
    def atomic(self) -> bool:
        return self.change.mode is Mode.ATOMIC

    @property
    def applied_version(self) -> int:
        return self.applied.version

    @property
    def outcome(self) -> Outcome:
        """What a commit of this run records: a heal that failed is `failed`, else `partial`."""
        if self.heal:
            return Outcome.FAILED if self.failed else Outcome.COMMITTED
        return Outcome.PARTIAL if self.failed else Outcome.COMMITTED

    def result(
        self,
        outcome: Outcome,
        *,
        rollback_errors: list[str] | None = None,
        cleared: str | None = None,
    ) -> ApplyResult:
        """The caller's answer once the run ended with `outcome`."""
        rolled_back = outcome == Outcome.ROLLED_BACK
        return ApplyResult(
            ok=outcome == Outcome.UNCHANGED or (not rolled_back and not self.failed),
            version=self.applied_version if rolled_back else self.version,
            outcome=outcome,
            txn=self.txn or None,
            plans=list(self.plans.values()),
            failed=dict(self.failed),
            rollback_errors=list(rollback_errors or []),
            waiting=dict(self.waiting),
            healed=dict(self.healed),
            origin=self.change.origin if outcome != Outcome.UNCHANGED else None,
            digest=self.digest,
            attempted=self.version if rolled_back else None,
            carried=dict(self.carried),
            cleared=[cleared] if cleared else [],
        )
