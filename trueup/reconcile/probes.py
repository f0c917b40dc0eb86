"""Status' look at subsystems that may block: bounded, served stale when a daemon does not answer.

Who calls this: `trueup.reconcile.status.build_status` (behind `/v1/status`,
`/v1/health/services`, `trueup status`). A subsystem that reads a daemon
(Kea's control socket, knotc, HAProxy's master CLI, keepalived, nft) is looked
at on a thread of its own — one at a time per subsystem, whatever the number of
requests. A request waits for that look at most `FRESH_WAIT` when an earlier
look exists (else `FIRST_WAIT`); a look not finished by then goes on in the
background and the request is answered from the last finished one, marked
stale with its age (`Probe.stale`). No request ever waits on a daemon's
socket, the daemon supervisor's lock or a slow listing beyond that bound.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypedDict

from trueup.model.document import DeviceState
from trueup.model.health import SubsystemHealth
from trueup.model.jsontypes import JSONObject
from trueup.subsystems.base import Facts, Scope, Subsystem
from trueup.system.sources import Sources

__all__ = ["FIRST_WAIT", "FRESH_WAIT", "Look", "StaleMark", "StatusProbes"]

# How long a status request waits for a subsystem's look in progress.
FRESH_WAIT = 0.06
# The same when no look has ever finished (nothing to show instead).
FIRST_WAIT = 1.0


class StaleMark(TypedDict):
    """A subsystem shown from its last look (or not at all): since when, and why."""

    observed_at: str | None  # when the look shown finished; None: none ever did
    age_seconds: float | None
    why: str


@dataclass(frozen=True)
class Look:
    """One finished look at a subsystem."""

    facts: Facts | None
    error: str | None  # why it could not be observed (facts is None)
    report: JSONObject | None  # `Subsystem.report`: the subsystem's own observations
    condition: tuple[SubsystemHealth, str] | None
    at: float  # wall clock, when it finished
    key: object  # the document (and scope) it was taken against


@dataclass(frozen=True)
class Served:
    """What a request shows for a subsystem: a look, and whether it is the last one only."""

    look: Look | None
    stale: StaleMark | None  # when not fresh


class _Probe:
    def __init__(self) -> None:
        self.last: Look | None = None
        self.running: threading.Thread | None = None
        self.started = 0.0
        self.done = threading.Event()


class StatusProbes:
    """The looks of subsystems that may block, shared by every status request."""

    def __init__(
        self,
        sources: Callable[[], AbstractContextManager[Sources]],
        *,
        fresh_wait: float = FRESH_WAIT,
        first_wait: float = FIRST_WAIT,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._sources = sources
        self.fresh_wait = fresh_wait
        self.first_wait = first_wait
        self.clock = clock
        self._lock = threading.Lock()
        self._probes: dict[str, _Probe] = {}

    def look(
        self,
        subs: list[Subsystem],
        document: DeviceState,
        scope: Scope,
        key: object,
    ) -> dict[str, Served]:
        """A look at each of `subs`, waiting at most the bound for each one in progress."""
        started = time.monotonic()
        waits: dict[str, tuple[_Probe, threading.Event]] = {}
        for sub in subs:
            waits[sub.name] = self._start(sub, document, scope, key)
        out: dict[str, Served] = {}
        for sub in subs:
            probe, done = waits[sub.name]
            last = probe.last
            usable = last if last is not None and last.key == key else None
            bound = self.fresh_wait if usable is not None else self.first_wait
            done.wait(max(0.0, started + bound - time.monotonic()))
            if done.is_set() and probe.last is not None and probe.last.key != key:
                # That look was taken against another revision (or scope), started before
                # it was applied: not this revision's facts. One look more, same bound.
                probe, done = self._start(sub, document, scope, key)
                done.wait(max(0.0, started + bound - time.monotonic()))
            if done.is_set() and probe.last is not None and probe.last.key == key:
                out[sub.name] = Served(probe.last, None)
                continue
            shown = probe.last if probe.last is not None else None
            running_for = time.monotonic() - probe.started
            why = (
                f"{sub.name} did not answer within {bound:g}s (its look has been running "
                f"for {running_for:.1f}s)"
            )
            if shown is not None and shown.key != key:
                why += "; its last look was taken against an earlier revision"
            if shown is None:
                out[sub.name] = Served(None, {"observed_at": None, "age_seconds": None, "why": why})
                continue
            out[sub.name] = Served(
                shown,
                {
                    "observed_at": datetime.fromtimestamp(shown.at, UTC).isoformat(),
                    "age_seconds": round(max(0.0, self.clock() - shown.at), 3),
                    "why": why + "; shown from its last look",
                },
            )
        return out

    def _start(
        self, sub: Subsystem, document: DeviceState, scope: Scope, key: object
    ) -> tuple[_Probe, threading.Event]:
        """The look in progress for `sub`, started now when none runs."""
        with self._lock:
            probe = self._probes.setdefault(sub.name, _Probe())
            if probe.running is not None and probe.running.is_alive():
                return probe, probe.done
            done = threading.Event()
            probe.done = done
            probe.started = time.monotonic()
            thread = threading.Thread(
                target=self._run,
                args=(probe, done, sub, document, scope, key),
                name=f"status-{sub.name}",
                daemon=True,
            )
            probe.running = thread
            thread.start()
            return probe, done

    def _run(
        self,
        probe: _Probe,
        done: threading.Event,
        sub: Subsystem,
        document: DeviceState,
        scope: Scope,
        key: object,
    ) -> None:
        facts: Facts | None = None
        error: str | None = None
        report: JSONObject | None = None
        condition: tuple[SubsystemHealth, str] | None = None
        try:
            with self._sources() as net:
                try:
                    facts = sub.observe(net, scope)
                except Exception as exc:  # one subsystem's failure is reported, not raised
                    error = f"cannot observe {sub.name}: {exc}"
                if sub.configured(document):
                    try:
                        report = dict(sub.report(net, scope))
                    except Exception as exc:  # a report never breaks status
                        report = {"error": f"{type(exc).__name__}: {exc}"}
                try:
                    condition = sub.condition(net, document)
                except Exception:  # status never fails because one subsystem cannot say
                    condition = None
        except Exception as exc:  # the system seams could not be opened
            error = f"cannot observe {sub.name}: {exc}"
        probe.last = Look(facts, error, report, condition, self.clock(), key)
        done.set()
