"""What status shows of the system: each subsystem observed against the applied document.

`observe(engine, document)` gives the differences, the subsystems' own
reports (`Subsystem.report`), their conditions (fenced, pending) and the
stale marks of daemons that did not answer in time; `trueup.reconcile.status`
builds the status document from it. Netlink subsystems are read inline;
those that may block are looked at through the engine's status probes
(`trueup.reconcile.probes`), bounded, so status never waits long on a daemon.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from trueup.model.document import DeviceState, document_digest
from trueup.model.health import SubsystemHealth
from trueup.model.jsontypes import JSONObject
from trueup.reconcile.engine import Engine
from trueup.reconcile.engine import observe as observing
from trueup.reconcile.probes import StaleMark
from trueup.subsystems.base import Difference, Subsystem
from trueup.subsystems.registry import scope_for
from trueup.system.sources import Sources

__all__ = ["Observation", "observe"]

log = logging.getLogger("trueup.status")


@dataclass
class Observation:
    """What the system showed against the applied document, per subsystem."""

    differences: dict[str, list[Difference]] = field(default_factory=dict)
    reports: dict[str, JSONObject] = field(default_factory=dict)
    conditions: dict[str, tuple[SubsystemHealth, str]] = field(default_factory=dict)
    stale: dict[str, StaleMark] = field(default_factory=dict)
    unobservable: dict[str, str] = field(default_factory=dict)  # subsystem → why not now


def observe(engine: Engine, document: DeviceState) -> Observation:
    """Differences, reports, conditions and stale marks; never waiting long on a daemon.

    Netlink subsystems are read inline; those that may block are looked at
    through the engine's status probes (`trueup.reconcile.probes`), bounded.
    """
    scope = scope_for(document)
    inline = [s for s in engine.subsystems if not s.may_block]
    probed = [s for s in engine.subsystems if s.may_block]
    seen = Observation()
    unobservable = seen.unobservable
    with engine.sources() as net:
        observed = observing.observe(engine, net, scope, [s.name for s in inline], unobservable)
        seen.reports = _reports(engine, document, net, inline)
        seen.conditions = _conditions(engine, net, document, inline)
    for sub in inline:
        if sub.name in observed:
            seen.differences[sub.name] = sub.diff(sub.desired(document, scope), observed[sub.name])
    key = (document_digest(document), json.dumps(scope.to_json(), sort_keys=True, default=str))
    for name, served in engine.status_probes.look(probed, document, scope, key).items():
        sub = engine.by_name[name]
        if served.stale is not None:
            seen.stale[name] = served.stale
        look = served.look
        if look is None:
            unobservable[name] = f"cannot observe {name}: {served.stale and served.stale['why']}"
            continue
        if look.facts is None:
            unobservable[name] = look.error or f"cannot observe {name}"
        else:
            seen.differences[name] = sub.diff(sub.desired(document, scope), look.facts)
        if look.report:
            seen.reports[name] = look.report
        if look.condition is not None:
            seen.conditions[name] = look.condition
    return seen


def _reports(
    engine: Engine, document: DeviceState, net: Sources, subs: Sequence[Subsystem] | None = None
) -> dict[str, JSONObject]:
    """What configured subsystems report beside their facts (`Subsystem.report`)."""
    scope = scope_for(document)
    out: dict[str, JSONObject] = {}
    for sub in engine.subsystems if subs is None else subs:
        if not sub.configured(document):
            continue
        try:
            out[sub.name] = dict(sub.report(net, scope))
        except Exception as exc:  # a report never breaks status
            out[sub.name] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def _conditions(
    engine: Engine, net: Sources, document: DeviceState, subs: Sequence[Subsystem] | None = None
) -> dict[str, tuple[SubsystemHealth, str]]:
    """Each subsystem's health beyond its facts (fenced, pending); one failing is left out."""
    out: dict[str, tuple[SubsystemHealth, str]] = {}
    for sub in engine.subsystems if subs is None else subs:
        try:
            condition = sub.condition(net, document)
        except Exception:  # status never fails because one subsystem cannot say
            log.exception("%s: condition", sub.name)
            continue
        if condition is not None:
            out[sub.name] = condition
    return out
