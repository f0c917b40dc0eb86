"""Reading the system: each subsystem's facts, a plan against a document, the differences.

Nothing here writes. One subsystem's observation failing never stops the
others (a later tier never blocks an earlier one); `observe_bounded` gives
up as soon as its caller must yield (a heal, to an operator's write).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection
from dataclasses import replace
from typing import TYPE_CHECKING

from trueup.model.document import DeviceState
from trueup.reconcile.engine.run import STEP_ERRORS
from trueup.subsystems.base import Difference, Facts, Plan, PlannedValues, Scope, Subsystem
from trueup.subsystems.registry import scope_for
from trueup.system.sources import Sources

if TYPE_CHECKING:
    from trueup.reconcile.engine.core import Engine

__all__ = ["differences", "observe", "observe_bounded", "plan"]


def observe(
    engine: Engine,
    net: Sources,
    scope: Scope,
    names: Collection[str] | None = None,
    errors: dict[str, str] | None = None,
) -> dict[str, Facts]:
    """Each subsystem's facts. One that cannot be observed is left out, its error in `errors`.

    A daemon that does not answer, a file the kernel refuses to show: one
    subsystem's observation failing never stops the others. Without
    `errors`, the failure is raised.
    """
    out: dict[str, Facts] = {}
    for sub in engine.subsystems:
        if names is not None and sub.name not in names:
            continue
        try:
            out[sub.name] = sub.observe(net, scope)
        except STEP_ERRORS as exc:
            if errors is None:
                raise
            errors[sub.name] = f"cannot observe {sub.name}: {exc}"
    return out


def _observe_aside(
    engine: Engine,
    net: Sources,
    scope: Scope,
    sub: Subsystem,
    errors: dict[str, str] | None,
    give_up: Callable[[], bool],
) -> dict[str, Facts] | None:
    """One subsystem that may block, observed on a worker with a handle of its own."""
    found: dict[str, Facts] = {}
    failures: dict[str, str] = {}
    raised: list[BaseException] = []

    def work() -> None:
        try:
            with engine.sources(net.memo) as own:
                kept = failures if errors is not None else None
                found.update(observe(engine, own, scope, [sub.name], kept))
        except BaseException as exc:  # reported to the waiting thread
            raised.append(exc)

    worker = threading.Thread(target=work, name=f"observe-{sub.name}", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(0.05)
        if worker.is_alive() and give_up():
            return None
    if raised:
        if errors is None:
            raise raised[0]
        errors[sub.name] = f"cannot observe {sub.name}: {raised[0]}"
        return {}
    if errors is not None:
        errors.update(failures)
    return found


def observe_bounded(
    engine: Engine,
    net: Sources,
    scope: Scope,
    names: Collection[str] | None = None,
    errors: dict[str, str] | None = None,
    *,
    give_up: Callable[[], bool],
) -> dict[str, Facts] | None:
    """`observe`, abandoned (None) as soon as `give_up()` holds.

    Subsystems that may block (a daemon's socket) are observed on a worker
    with a handle of their own, so a daemon that does not answer never keeps
    the caller (a heal, the loop's pass) from yielding to an operator's write.
    """
    out: dict[str, Facts] = {}
    for sub in engine.subsystems:
        if names is not None and sub.name not in names:
            continue
        if give_up():
            return None
        if not sub.may_block:
            out.update(observe(engine, net, scope, [sub.name], errors))
            continue
        found = _observe_aside(engine, net, scope, sub, errors, give_up)
        if found is None:
            return None
        out.update(found)
    return out


def _preparation_failures(engine: Engine, document: DeviceState) -> dict[str, str]:
    """What an apply's preparation would refuse (an nft rule, …), so plan says it too."""
    failures: dict[str, str] = {}
    for sub in engine.subsystems:
        if type(sub).prepare is Subsystem.prepare or not sub.configured(document):
            continue
        try:
            sub.prepare(document)
        except Exception as exc:  # reported per subsystem, as an apply reports it
            failures[sub.name] = f"preparation failed: {exc}"
    return failures


def plan(engine: Engine, document: DeviceState, net: Sources) -> list[Plan]:
    """What applying `document` would do now, per subsystem, with old → new values."""
    scope = scope_for(document, engine.applied_document())
    errors: dict[str, str] = {}
    refused = _preparation_failures(engine, document)
    observed = observe(engine, net, scope, errors=errors)
    plans: list[Plan] = []
    for s in engine.subsystems:
        if s.name in refused:
            plans.append(Plan(s.name, [], [], error=refused[s.name]))
        elif s.name in observed:
            desired = s.desired(document, scope)
            have = observed[s.name]
            made = s.plan(desired, have, scope)
            values: dict[str, PlannedValues] = {
                step.path: {"old": have.get(step.path), "new": desired.get(step.path)}
                for step in made.steps
                if step.path in desired or step.path in have
            }
            plans.append(replace(made, values=values))
        else:
            plans.append(Plan(s.name, [], [errors[s.name]]))
    return plans


def differences(
    engine: Engine,
    document: DeviceState,
    net: Sources,
    names: list[str] | None = None,
    errors: dict[str, str] | None = None,
) -> dict[str, list[Difference]]:
    """Observed against desired, per subsystem; unobservable ones go to `errors`."""
    scope = scope_for(document)
    failures: dict[str, str] = {} if errors is None else errors
    observed = observe(engine, net, scope, names, errors=failures)
    return {
        s.name: s.diff(s.desired(document, scope), observed[s.name])
        for s in engine.subsystems
        if s.name in observed
    }
