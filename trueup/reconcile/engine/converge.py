"""The one converge: plan → execute → observe until observed equals desired.

Every writer of a subsystem's facts goes through `converge`, under one of two
policies (`Policy`):

* `JOURNALED` — inside `Engine.transact` or crash recovery: the writer lock is
  held and the caller journals each subsystem's outcome (`applied`, `failed`,
  `waiting`, `recovered`). `converge_bounded` runs it within the subsystem's
  deadline, on a worker for subsystems that may block.
* `MANAGEMENT_ONLY` — outside a transaction (startup phase 1, the fallback
  heal when the state directory refuses transactions, `trueup management
  set`): only the management subsystem, never away from an address trueup did
  not assign, and an audit line `management_restored` (best effort) instead of
  a journal. `converge_management` is that policy's entry point.
* `GATEWAYS_ONLY` — the gateway monitor's switch on a probe transition
  (`trueup.agent.gateways`): only the gateways subsystem, never a step at
  the management default route's key, and an audit line `gateway_switched`
  (best effort). `converge_gateways` is its entry point.

The kernel has side effects (removing an address flushes the routes through
it; removing a primary IPv4 address removes its secondaries), so a subsystem
is done only when a fresh observation agrees, not when its first plan ran.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

from trueup.model.document import DeviceState
from trueup.reconcile.changes import Kind
from trueup.reconcile.engine.run import PREEMPTED, Preempted, hit, paths_text
from trueup.subsystems.base import Facts, Plan, Scope, Step, StepError, Subsystem
from trueup.subsystems.registry import scope_for
from trueup.system.sources import Sources

if TYPE_CHECKING:
    from trueup.reconcile.engine.core import Engine

__all__ = [
    "ManagementConverged",
    "Policy",
    "converge",
    "converge_bounded",
    "converge_gateways",
    "converge_management",
]

MANAGEMENT = "management"
GATEWAYS = "gateways"
# Plan-and-execute rounds of one convergence before it gives up on what still differs.
CONVERGE_PASSES = 3


class Policy(Enum):
    """Who may converge what, and what records it."""

    JOURNALED = "journaled"  # inside a transaction or recovery: locked, the caller journals
    MANAGEMENT_ONLY = "management-only"  # outside: the management tier alone, audited
    GATEWAYS_ONLY = "gateways-only"  # the gateway monitor's switch: gateways alone, audited


def converge(
    net: Sources,
    subsystem: Subsystem,
    desired: Facts,
    scope: Scope,
    *,
    policy: Policy,
    plan: Plan | None = None,
    cancel: threading.Event | None = None,
    deadline: float | None = None,
    first_step: Callable[[], None] | None = None,
) -> list[Step]:
    """Execute a plan, then re-observe and re-plan until no steps remain; the steps run.

    `plan`: the plan already made from a fresh observation (else one is made).
    `cancel` / `deadline` (monotonic): checked before every step. `first_step`
    is called after the first step ran (a transaction's fault point). Raises
    `StepError` (or `NetlinkError`) when a step fails or the subsystem still
    differs after a few passes.
    """
    if policy is Policy.MANAGEMENT_ONLY and subsystem.name != MANAGEMENT:
        raise ValueError(f"{subsystem.name}: only management converges outside a transaction")
    if policy is Policy.GATEWAYS_ONLY and subsystem.name != GATEWAYS:
        raise ValueError(f"{subsystem.name}: the gateway monitor converges gateways alone")
    if plan is None:
        plan = subsystem.plan(desired, subsystem.observe(net, scope), scope)
    if policy is Policy.GATEWAYS_ONLY:
        _never_management(plan, scope)
    done: list[Step] = []
    for attempt in range(CONVERGE_PASSES):
        if not plan.changes:
            return done
        for index, step in enumerate(plan.steps):
            if (cancel is not None and cancel.is_set()) or (
                deadline is not None and time.monotonic() > deadline
            ):
                raise StepError(step, "cancelled: the subsystem's deadline passed")
            subsystem.execute(net, step)
            done.append(step)
            if index == 0 and attempt == 0 and first_step is not None:
                first_step()
        plan = subsystem.plan(desired, subsystem.observe(net, scope), scope)
        if policy is Policy.GATEWAYS_ONLY:
            _never_management(plan, scope)
    if not plan.changes:
        return done
    raise StepError(
        plan.steps[0],
        f"still differs after {CONVERGE_PASSES} passes: "
        + paths_text(sorted({step.path for step in plan.steps})),
    )


def converge_bounded(
    engine: Engine,
    net: Sources,
    subsystem: Subsystem,
    desired: Facts,
    scope: Scope,
    plan: Plan | None,
    seconds: float,
    fault_point: tuple[Kind, str] | None = None,
) -> None:
    """`converge` (journaled) within the subsystem's deadline.

    Netlink subsystems answer at kernel speed and run inline, checking the
    deadline between steps. Others (daemons, plugins) run on a worker with
    a netlink handle of their own; at the deadline the worker is told to
    stop before its next step and the transaction moves on.
    """
    first_step = (lambda: hit(*fault_point)) if fault_point is not None else None
    if not subsystem.may_block:
        deadline = time.monotonic() + seconds
        converge(
            net,
            subsystem,
            desired,
            scope,
            policy=Policy.JOURNALED,
            plan=plan,
            deadline=deadline,
            first_step=first_step,
        )
        return
    ends = time.monotonic() + seconds
    where = Step(subsystem.name, "converge", f"subsystem {subsystem.name}")
    left_behind = engine.abandoned.get(subsystem.name)
    if left_behind is not None and left_behind.is_alive():
        # A convergence abandoned earlier (a deadline, a heal yielding) stops before
        # its next step: its step in progress ends before another one starts.
        left_behind.join(max(0.0, ends - time.monotonic()))
        if left_behind.is_alive():
            raise StepError(where, "an earlier convergence of it is still finishing its step")
    cancel = threading.Event()
    outcome: list[BaseException | None] = []

    def work() -> None:
        try:
            with engine.sources(net.memo) as own:
                converge(
                    own,
                    subsystem,
                    desired,
                    scope,
                    policy=Policy.JOURNALED,
                    plan=plan,
                    cancel=cancel,
                    first_step=first_step,
                )
            outcome.append(None)
        except BaseException as exc:  # reported to the waiting thread
            outcome.append(exc)

    worker = threading.Thread(target=work, name=f"trueup-{subsystem.name}", daemon=True)
    worker.start()
    engine.abandoned[subsystem.name] = worker  # until it ends
    while worker.is_alive() and time.monotonic() < ends:
        worker.join(min(0.05, max(0.0, ends - time.monotonic())))
        if worker.is_alive() and engine.preempted():
            # A heal gives the writer up to an operator's write: the worker stops
            # before its next step, and its subsystem waits for the next pass.
            cancel.set()
            raise Preempted(where, PREEMPTED)
    # The worker changed the kernel through its own handle (an HA subsystem releasing
    # an address): what this handle cached before is stale.
    forget = getattr(net.netlink, "forget", None)
    if callable(forget):
        forget()
    if worker.is_alive():
        cancel.set()
        raise StepError(where, f"deadline of {seconds:g}s exceeded")
    if outcome and outcome[0] is not None:
        raise outcome[0]


@dataclass(frozen=True)
class ManagementConverged:
    """What converging the management tier outside a transaction did."""

    steps: list[Step]
    # Why the `management_restored` line was not written (a read-only or full
    # state directory), or None: written, or nothing to audit.
    audit_problem: str | None = None

    def described(self) -> list[str]:
        return [step.describe() for step in self.steps]


def converge_management(
    engine: Engine,
    document: DeviceState,
    previous: DeviceState | None = None,
    *,
    actor: str,
    audit: bool = True,
    **details: Any,
) -> ManagementConverged:
    """Converge the management subsystem alone to `document` (policy `MANAGEMENT_ONLY`).

    `previous` names management state trueup assigned before (its addresses
    and default route may be removed once the new ones are on: make before
    break). When steps ran and `audit` holds, `management_restored` is
    audited with `details`, best effort: a read-only or full state directory
    must not keep management down, nor make restoring it look failed (the
    problem is noted as damaged state). Raises `StepError` (or
    `NetlinkError`) when a step fails or the kernel still differs.
    """
    sub = engine.by_name[MANAGEMENT]
    scope = scope_for(document, previous)
    with engine.sources() as net:
        steps = converge(
            net, sub, sub.desired(document, scope), scope, policy=Policy.MANAGEMENT_ONLY
        )
    if not steps or not audit:
        return ManagementConverged(steps)
    try:
        engine.state.audit.append(
            "management_restored", actor, steps=[s.describe() for s in steps], **details
        )
    except OSError as exc:
        engine.check.note(engine.state.audit.path, f"cannot be appended to: {exc}")
        return ManagementConverged(steps, str(exc))
    return ManagementConverged(steps)


def _never_management(plan: Plan, scope: Scope) -> None:
    """Refuse a gateway step at the management default route's key (table, to, metric)."""
    for step in plan.steps:
        key = (step.args.get("table"), step.args.get("to"), step.args.get("metric"))
        if key in scope.management_default_routes:
            raise StepError(step, "the management default route is never the gateways' to change")


def converge_gateways(
    engine: Engine, document: DeviceState, *, actor: str, **details: Any
) -> tuple[list[Step], str | None]:
    """Converge the gateways subsystem alone to `document` (policy `GATEWAYS_ONLY`).

    Its desired facts are the routes of the monitor's current decision. When
    steps ran, `gateway_switched` is audited with `details`, best effort (a
    full state directory must not keep the router on a dead uplink): the
    steps, and why the line was not written or None. Raises `StepError` (or
    `NetlinkError`) when a step fails or the kernel still differs.
    """
    sub = engine.by_name[GATEWAYS]
    scope = scope_for(document)
    with engine.sources() as net:
        steps = converge(net, sub, sub.desired(document, scope), scope, policy=Policy.GATEWAYS_ONLY)
    if not steps:
        return steps, None
    try:
        engine.state.audit.append(
            "gateway_switched", actor, steps=[s.describe() for s in steps], **details
        )
    except OSError as exc:
        engine.check.note(engine.state.audit.path, f"cannot be appended to: {exc}")
        return steps, str(exc)
    return steps, None
