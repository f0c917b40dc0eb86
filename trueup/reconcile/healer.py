"""The heal of one pass: what may heal now, one `reconcile` transaction, its outcome booked.

Who calls this: the reconcile loop (`trueup.reconcile.loop`), once per pass
that found drift. The bounds themselves (back-off, budget, breaker, flaps,
acknowledgements) are the governor's (`trueup.reconcile.healing`); this
module asks it, runs the transaction through the engine, and tells it how
each attempt went.

A subsystem is healed only when its policy is `auto` (or the heal is
forced by `trueup reconcile`) and the governor does not hold it. A
subsystem whose dependency differs and will not be healed now *waits*
(`waiting on addresses: …`); so does one whose dependency fails inside the
transaction. Waiting is not failing: the breaker, back-off and retry
budget do not count it. Nor is a heal that failed because a link it needs
changed state while it ran (a link up/down storm): it waits on `links`.

Policy does not hold what the agent's start left unfinished (`starting`:
a subsystem pending on a late link, or failed, when startup ended): a
start converges every subsystem to the committed revision under every
policy, and the loop finishes it; `notify` governs only what changes after
the start. The governor's bounds still apply to those heals.

A failure blames another writer only with evidence (`evidence`: the
notifications' senders naming the paths); otherwise it says what still
differs.

Why this module is over 400 lines: choosing what heals, running it, and
booking each attempt with the governor read the same pass report and the
same differences; the fallback that keeps management up when transactions
are refused is part of the same decision.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from trueup.model.document import DeviceState
from trueup.model.order import natural_sorted
from trueup.reconcile.answers import WriteAnswer
from trueup.reconcile.attribution import item_paths
from trueup.reconcile.changes import Change, DamagedState, Kind, Refused, StorageError, own_label
from trueup.reconcile.driftbook import DriftRecord
from trueup.reconcile.engine import Engine
from trueup.reconcile.engine.converge import converge_management
from trueup.reconcile.healing import Governor
from trueup.reconcile.view import Counters
from trueup.subsystems.base import Difference, StepError
from trueup.system.events import iso_time
from trueup.system.netlink import NetlinkError

__all__ = ["Healer", "PassReport"]

log = logging.getLogger("trueup.reconcile")

# After a heal was deferred, when to look again: another writer holds the
# device (it will be done soon), or the state directory refused the journal.
RETRY_AFTER_REFUSAL = 0.1
RETRY_AFTER_STORAGE_ERROR = 2.0

AuditLines = list[tuple[str, dict[str, Any]]]
# Who else wrote a subsystem's differing paths (path → writer), and why a failed heal
# was the effect of a link changing state while it ran (or None); both from the loop.
Evidence = Callable[[str, list[Difference]], dict[str, str]]
Disturbance = Callable[[str], str | None]


def _covered(path: str, pinned: Collection[str]) -> bool:
    """Whether `path` (or the list it is an item of) is contested."""
    return path in pinned or any(path.startswith(p + "[") for p in pinned)


@dataclass
class PassReport:
    """What one pass saw and did; `reconcile_now` turns it into the API's answer."""

    drift: dict[str, list[str]] = field(default_factory=dict)
    healed: dict[str, list[str]] = field(default_factory=dict)  # subsystem → step descriptions
    failed: dict[str, str] = field(default_factory=dict)
    held: dict[str, str] = field(default_factory=dict)  # subsystem → why not healed
    waiting: dict[str, str] = field(default_factory=dict)  # subsystem → the dependency it awaits
    unobservable: dict[str, str] = field(default_factory=dict)  # subsystem → why it cannot be seen
    txns: list[str] = field(default_factory=list)
    skipped: str | None = None

    def reconcile_answer(
        self, names: list[str], applied_version: int, *, breakers_closed: list[str]
    ) -> WriteAnswer:
        """The API's answer to `trueup reconcile` of `names`, from the pass it forced."""
        if self.skipped == "nothing applied":
            return {"ok": True, "version": 0, "outcome": "nothing applied", "steps": []}
        deferred = {n: why for n, why in self.held.items() if n in names}
        failed = {**self.failed, **deferred}
        return {
            "ok": not failed,
            "version": applied_version,
            "outcome": "failed" if failed else ("reconciled" if self.healed else "in sync"),
            "txn": self.txns[-1] if self.txns else None,
            "steps": [s for steps in self.healed.values() for s in steps],
            "failed": failed,
            "rollback_errors": [],
            "breakers_closed": breakers_closed,
        }


class Healer:
    def __init__(
        self,
        engine: Engine,
        governor: Governor,
        clock: Callable[[], float],
        counters: Counters,
    ) -> None:
        self.engine = engine
        self.governor = governor
        self.clock = clock
        self.counters = counters  # the loop's: heals_ok, heals_failed
        self.evidence: Evidence | None = None
        self.disturbance: Disturbance | None = None
        self._disturbed: dict[str, str] = {}  # this heal's failures caused by a link change

    def held(
        self, name: str, document: DeviceState, now: float, forced: bool, starting: bool = False
    ) -> str | None:
        """Why `name` may not be healed now, or None (`starting`: the start is unfinished)."""
        if forced:
            return None
        policy = document.spec.convergence.policy_for(name)
        if policy != "auto" and not starting:
            return f"policy {policy}: drift is reported, not healed"
        if name != "management":  # management first: never held by lost bookkeeping
            damaged = [d for d in self.engine.check.blocking("heals") if d.blocks == "heals"]
            if damaged:
                return (
                    f"{damaged[0].sentence()}: acknowledgements and breakers are unknown, so "
                    "automatic heals wait until it is repaired (`trueup reconcile` heals now)"
                )
        return self.governor.blocked(name, now)

    def _healable(
        self,
        document: DeviceState,
        differences: Mapping[str, list[Difference]],
        report: PassReport,
        *,
        force: Collection[str],
        starting: Collection[str],
    ) -> tuple[list[str], dict[str, frozenset[str]]]:
        """What may be healed now, and per subsystem the paths pinned as contested.

        What is held (policy, bounds, a dependency that will not settle, only
        contested paths differing) goes to `report.held` with why.
        """
        now = self.clock()
        healable: list[str] = []
        # Differs and will not be healed now (or cannot even be observed) → why.
        unsettled: dict[str, str] = dict(report.unobservable)
        contested: dict[str, frozenset[str]] = {}
        for sub in self.engine.subsystems:
            name = sub.name
            diffs = differences.get(name, [])
            if not diffs:
                continue
            forced = name in force
            paths = ", ".join(d.path for d in diffs[:3]) + (" …" if len(diffs) > 3 else "")
            held = self.held(name, document, now, forced, name in starting)
            if held is not None:
                report.held[name] = held
                unsettled[name] = f"{held} ({paths})"
                continue
            blocker = next((d for d in sub.depends_on if d in unsettled), None)
            if blocker is not None and not forced:
                why = f"waiting on {blocker}: {unsettled[blocker]}"
                report.held[name] = report.waiting[name] = why
                unsettled[name] = why
                continue
            pinned = frozenset() if forced else frozenset(self.governor.contested(name))
            contested[name] = pinned
            items = set(item_paths(diffs))
            differing_contested = {p for p in items if _covered(p, pinned)}
            if differing_contested:
                unsettled[name] = "contested: " + ", ".join(natural_sorted(differing_contested))
                if differing_contested == items:
                    report.held[name] = "only contested paths differ: " + ", ".join(
                        sorted(differing_contested)
                    )
                    continue
            healable.append(name)
        return healable, contested

    def heal(
        self,
        document: DeviceState,
        differences: Mapping[str, list[Difference]],
        drift: Mapping[str, DriftRecord],
        report: PassReport,
        *,
        actor: str,
        lock_wait: float,
        force: Collection[str] = (),
        starting: Collection[str] = (),
    ) -> float | None:
        """Heal what policy, bounds and dependencies allow, as one `reconcile` transaction.

        Fills `report`. Returns in how many seconds to look again when the heal
        was deferred (another writer, a refusing state directory), else None.
        """
        healable, contested = self._healable(
            document, differences, report, force=force, starting=starting
        )
        if not healable:
            return None
        attempted: list[str] = []
        self._disturbed = {}

        def audit_lines(
            txn: str,
            failed: dict[str, str],
            waiting: dict[str, str],
            healed: dict[str, list[str]],
        ) -> AuditLines:
            return self._book(txn, differences, drift, failed, waiting, healed, attempted, actor)

        change = Change.heal(
            document,
            actor=actor,
            only=healable,
            contested=contested,
            lock_wait=lock_wait,
            audit=audit_lines,
        )
        try:
            result = self.engine.transact(change)
        except DamagedState as exc:
            # Not retried soon: the refusal lifts when the file is repaired.
            for name in healable:
                report.held[name] = f"refused: {exc}"
            self._keep_management(document, healable, report, actor, str(exc))
            return None
        except Refused as exc:
            for name in healable:
                report.held[name] = f"deferred: {exc}"
            return RETRY_AFTER_REFUSAL
        except StorageError as exc:
            # Not the subsystem's failure: the state directory is full or read-only.
            log.warning("heal deferred: %s", exc)
            for name in healable:
                report.held[name] = f"deferred: {exc}"
            self._keep_management(document, healable, report, actor, str(exc))
            return RETRY_AFTER_STORAGE_ERROR
        if result.txn:
            report.txns.append(result.txn)
        for name in healable:
            if name in self._disturbed:
                report.held[name] = report.waiting[name] = self._disturbed[name]
            elif name in result.failed:
                report.failed[name] = self._blame(name, result.failed[name], differences)
            elif name in result.waiting:
                report.held[name] = report.waiting[name] = result.waiting[name]
            elif name in result.healed:
                report.healed[name] = result.healed[name]
        return None

    def _keep_management(
        self,
        document: DeviceState,
        healable: list[str],
        report: PassReport,
        actor: str,
        why: str,
    ) -> None:
        """The state directory refuses transactions: keep management up as phase 1 does.

        Management first (promise 1): a damaged, read-only or full state
        directory must not leave a lost management address lost. Only the
        management tier is converged, outside a transaction, and never away
        from an address trueup did not assign.
        """
        if "management" not in healable:
            return
        try:
            done = converge_management(
                self.engine, document, actor=actor, outside_transaction=why[:300]
            )
        except (StepError, NetlinkError, OSError, ValueError) as exc:
            report.failed["management"] = f"management not restored: {exc}"
            log.error("management not restored while transactions are refused: %s", exc)
            return
        if not done.steps:
            return
        report.held.pop("management", None)
        report.healed["management"] = done.described()
        log.warning("management restored outside a transaction (%s)", why)
        if done.audit_problem is not None:
            log.warning("management_restored not audited: %s", done.audit_problem)

    def _book(
        self,
        txn: str,
        differences: Mapping[str, list[Difference]],
        drift: Mapping[str, DriftRecord],
        failed: dict[str, str],
        waiting: dict[str, str],
        healed: dict[str, list[str]],
        attempted: list[str],
        actor: str = "reconcile",
    ) -> AuditLines:
        """Governor bookkeeping for a heal's outcome, and its audit lines (written with the commit).

        The engine may call this more than once per transaction (verification
        rounds); `attempted` makes each subsystem count once.
        """
        now = self.clock()
        version = self.engine.state.applied().version
        lines: AuditLines = []
        for name in [*healed, *failed]:
            if name in attempted or name in waiting:
                continue
            attempted.append(name)
            paths = natural_sorted({d.path for d in differences.get(name, [])})
            if name in failed:
                disturbed = self.disturbance(name) if self.disturbance is not None else None
                if disturbed is not None:
                    # The link went while the heal ran: not the heal's failure.
                    self._disturbed[name] = disturbed
                    lines.append(
                        (
                            "reconcile",
                            {"subsystem": name, "outcome": "waiting", "why": disturbed, "txn": txn},
                        )
                    )
                    continue
                self.governor.record_attempt(name, now)
                error = self._blame(name, failed[name], differences)
                lines += self._failed(name, error, paths, txn, version, now)
                continue
            self.governor.record_attempt(name, now)
            self.governor.record_success(name, now)
            self.counters["heals_ok"] += 1
            record = drift.get(name)
            if record is not None:
                record.healed_by = {
                    "by": "trueup",
                    "action": "heal",
                    "writer": own_label(Kind.RECONCILE, txn),
                    "txn": txn,
                    "at": iso_time(now),
                    "actor": actor,
                }
            lines.append(
                (
                    "reconcile",
                    {
                        "subsystem": name,
                        "outcome": "healed",
                        "paths": paths,
                        "steps": healed[name],
                        "txn": txn,
                        "version": version,
                        "attribution": record.attribution[-3:] if record else [],
                    },
                )
            )
        for name, why in waiting.items():
            lines.append(
                ("reconcile", {"subsystem": name, "outcome": "waiting", "why": why, "txn": txn})
            )
        return lines

    def _blame(self, name: str, error: str, differences: Mapping[str, list[Difference]]) -> str:
        """`error`, naming another writer when notifications show one wrote these paths."""
        if self.evidence is None or "something else is changing it" in error:
            return error
        seen = self.evidence(name, list(differences.get(name, [])))
        if not seen:
            return error
        who = "; ".join(f"{path}: {writer}" for path, writer in sorted(seen.items())[:3])
        return f"{error}; something else is changing it ({who})"

    def _failed(
        self, name: str, error: str, paths: list[str], txn: str, version: int, now: float
    ) -> AuditLines:
        opened = self.governor.record_failure(name, now, error, paths)
        self.counters["heals_failed"] += 1
        heal = self.governor.of(name)
        log.warning("heal of %s failed: %s", name, error)
        lines: AuditLines = [
            (
                "reconcile",
                {
                    "subsystem": name,
                    "outcome": "failed",
                    "error": error,
                    "paths": paths,
                    "txn": txn,
                    "version": version,
                    "breaker": heal.breaker,
                    "failures": heal.failures,
                    "backoff_seconds": heal.backoff_seconds,
                },
            )
        ]
        if opened:
            lines.append(
                (
                    "breaker_opened",
                    {"subsystem": name, "failures": heal.failures, "last_error": error},
                )
            )
        return lines
