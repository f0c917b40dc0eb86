"""`reconcile.json`: what the governor keeps across restarts (breakers, back-off, acks, contested).

Who calls this: the reconcile loop, when it is built (`load`) and after a
pass or an acknowledgement changed the governor (`save`).
"""

from __future__ import annotations

import logging
import random

from trueup.reconcile.engine import Engine
from trueup.reconcile.healing import Governor, HealingOptions

__all__ = ["RECONCILE_FILE", "load", "save"]

log = logging.getLogger("trueup.reconcile")

RECONCILE_FILE = "reconcile.json"


def load(engine: Engine, options: HealingOptions, rng: random.Random | None) -> Governor:
    """The governor as it was saved; empty when the file is damaged (reported as damage:
    automatic heals wait until it is repaired; the loop itself runs, detection never stops)."""
    state = engine.state
    governor = Governor(options, rng)
    try:
        governor.load(state.read(RECONCILE_FILE, {}))
    except (ValueError, TypeError, AttributeError, KeyError, OSError) as exc:
        log.error(
            "%s/%s: %s; acknowledgements and breakers start empty", state.root, RECONCILE_FILE, exc
        )
        governor.load({})
    return governor


def save(engine: Engine, governor: Governor) -> None:
    """Write what changed; a damaged file stays as evidence, a refused write stays in memory."""
    if not governor.dirty:
        return
    if any(d.file == RECONCILE_FILE for d in engine.check.blocking("heals")):
        return  # the damaged file stays as evidence until it is repaired
    try:
        engine.state.write(RECONCILE_FILE, governor.to_json())
    except OSError as exc:  # a read-only or full state directory: kept in memory
        log.warning("%s: not saved: %s", RECONCILE_FILE, exc)
        return
    governor.dirty = False
