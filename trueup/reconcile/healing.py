"""Bounded healing: back-off, retry budget, circuit breaker, flap detection, acknowledgements.

Who calls this: the reconcile loop (`trueup.reconcile.loop`), once per pass
and after every heal attempt. Pure bookkeeping over an injected clock value
(`now`, wall-clock seconds) and an injected random source, so unit tests
drive it with a fake clock.

Per subsystem:

* **back-off** — after the n-th consecutive failure the next attempt waits
  `min(cap, base · 2^(n-1))` ± jitter; a successful heal resets it;
* **retry budget** — at most `retry_budget` attempts per `retry_window`;
* **circuit breaker** — `breaker_threshold` consecutive failures open it:
  no healing, `STATE_RECONCILIATION_FAILED`, until a new apply, an explicit
  `trueup reconcile`, or the cool-down (then one half-open attempt decides);
* **flap detection** — a path that returns to the *same* undesired value
  `flap_threshold` times within `flap_window`, each time by a writer other
  than the kernel, is *contested*: someone else is writing it, and it is no
  longer healed (detection goes on). A contested path clears by itself once
  no writer touched it for `flap_window`;
* **acknowledgements** — healing (never detection) stops until they expire.

Management is never held (promise 1): its paths are never contested — a
writer fighting them is recorded as *fought* and reported while trueup keeps
restoring them —, acknowledgements and the retry budget do not apply to it,
its breaker never opens and its back-off never exceeds
`MANAGEMENT_BACKOFF_CAP` (one second).

Breaker state, acknowledgements and contested paths are persisted by the
loop (`reconcile.json`) through `to_json()` / `load()`.

Why this module is over 400 lines: the five bounds and management's
exemptions from them read and write one per-subsystem record
(`SubsystemHealing`), persisted as one; each decision (`blocked`) weighs
all of them at once. Split, the record and its rules would live apart.
"""

from __future__ import annotations

import logging
import math
import os
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NotRequired, TypedDict, cast

from trueup.model.digests import canonical_json
from trueup.model.order import natural_sorted
from trueup.system.events import iso_time

__all__ = [
    "MANAGEMENT",
    "MANAGEMENT_BACKOFF_CAP",
    "Acknowledgement",
    "Breaker",
    "Governor",
    "GovernorJSON",
    "HealingJSON",
    "HealingOptions",
    "MarkedPath",
    "NewlyMarked",
    "SubsystemHealing",
    "value_key",
]

MANAGEMENT = "management"  # the subsystem that is never held
MANAGEMENT_BACKOFF_CAP = 1.0  # seconds: the longest wait before restoring management again


log = logging.getLogger("trueup.reconcile")


def _env_float(env: Mapping[str, str], name: str, default: float, *, zero: bool = False) -> float:
    """A knob's value: a number above 0 (or 0 itself when `zero`), else its default.

    A mistyped knob never stops the reconcile loop (detection cannot be
    switched off): it is logged, naming the variable, and the default holds.
    """
    value = env.get(name)
    if value in (None, ""):
        return default
    try:
        number = float(str(value))
    except ValueError:
        number = math.nan
    if math.isfinite(number) and (number > 0 or (zero and number == 0)):
        return number
    least = "0 or more" if zero else "above 0"
    log.error("%s=%r: not a number %s; the default %g is used", name, value, least, default)
    return default


def _env_count(env: Mapping[str, str], name: str, default: int) -> int:
    """A knob that counts (a threshold, a budget): a whole number, 1 or more, else its default."""
    number = _env_float(env, name, float(default))
    if number >= 1 and number == int(number):
        return int(number)
    log.error(
        "%s=%r: not a whole number, 1 or more; the default %d is used", name, env[name], default
    )
    return default


@dataclass(frozen=True)
class HealingOptions:
    """Knobs; `from_env()` reads the `TRUEUP_*` variables documented in docs/convergence.md."""

    resync_seconds: float = 60.0
    backoff_base: float = 1.0
    backoff_cap: float = 300.0
    jitter: float = 0.2
    breaker_threshold: int = 5
    breaker_cooldown: float = 600.0
    retry_budget: int = 30
    retry_window: float = 600.0
    flap_threshold: int = 3
    flap_window: float = 300.0
    attribution_window: float = 10.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> HealingOptions:
        env = os.environ if env is None else env
        d = cls()
        return cls(
            resync_seconds=_env_float(env, "TRUEUP_RESYNC_SECONDS", d.resync_seconds),
            backoff_base=_env_float(env, "TRUEUP_BACKOFF_BASE", d.backoff_base),
            backoff_cap=_env_float(env, "TRUEUP_BACKOFF_CAP", d.backoff_cap),
            jitter=_env_float(env, "TRUEUP_BACKOFF_JITTER", d.jitter, zero=True),
            breaker_threshold=_env_count(env, "TRUEUP_BREAKER_THRESHOLD", d.breaker_threshold),
            breaker_cooldown=_env_float(env, "TRUEUP_BREAKER_COOLDOWN", d.breaker_cooldown),
            retry_budget=_env_count(env, "TRUEUP_RETRY_BUDGET", d.retry_budget),
            retry_window=_env_float(env, "TRUEUP_RETRY_WINDOW", d.retry_window),
            flap_threshold=_env_count(env, "TRUEUP_FLAP_THRESHOLD", d.flap_threshold),
            flap_window=_env_float(env, "TRUEUP_FLAP_WINDOW", d.flap_window),
            attribution_window=_env_float(env, "TRUEUP_ATTRIBUTION_WINDOW", d.attribution_window),
        )


class Breaker(StrEnum):
    """A subsystem's circuit breaker (its value is what status and `reconcile.json` say)."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"  # the cool-down is over: one attempt decides


class MarkedPath(TypedDict):
    """A contested (or, for management, fought) path: who keeps writing it, how often."""

    value: object  # the undesired value it keeps returning to, as observed
    flips: int
    since: str
    last_at: str
    # Wall-clock seconds of the last write (internal: status leaves it out); absent in a
    # record an older agent saved, which an apply or a reconcile clears.
    last_written_at: NotRequired[float]
    writer: str | None
    reason: str  # what is going on, and what trueup does about it


class NewlyMarked(MarkedPath):
    """A path `Governor.observe` just marked, and how: `contested` or `fought`."""

    kind: str


class Acknowledgement(TypedDict):
    """An operator's acknowledgement of a subsystem: its healing waits until `until`."""

    until: float  # wall-clock seconds
    until_at: str
    reason: str
    actor: str
    at: str


class HealingJSON(TypedDict):
    """`SubsystemHealing` as `reconcile.json` keeps it."""

    failures: int
    breaker: Breaker
    opened_at: float | None
    open_until: float | None
    backoff_seconds: float
    next_attempt_at: float | None
    last_error: str | None
    failing_since: float | None
    failing_paths: list[str]
    attempts: list[float]
    contested: dict[str, MarkedPath]
    fought: dict[str, MarkedPath]
    last_heal_at: float | None


class GovernorJSON(TypedDict):
    """`reconcile.json`: every subsystem's healing record and the acknowledgements."""

    subsystems: dict[str, HealingJSON]
    acks: dict[str, Acknowledgement]


def value_key(value: Any) -> str:
    """A canonical text for an observed value, so flaps compare by value."""
    return canonical_json(value).decode()


@dataclass
class SubsystemHealing:
    failures: int = 0  # consecutive
    breaker: Breaker = Breaker.CLOSED
    opened_at: float | None = None
    open_until: float | None = None
    backoff_seconds: float = 0.0
    next_attempt_at: float | None = None
    last_error: str | None = None
    failing_since: float | None = None
    failing_paths: list[str] = field(default_factory=list)
    attempts: list[float] = field(default_factory=list)  # within the retry window
    contested: dict[str, MarkedPath] = field(default_factory=dict)
    fought: dict[str, MarkedPath] = field(default_factory=dict)  # management only
    last_heal_at: float | None = None

    def to_json(self) -> HealingJSON:
        return {
            "failures": self.failures,
            "breaker": self.breaker,
            "opened_at": self.opened_at,
            "open_until": self.open_until,
            "backoff_seconds": self.backoff_seconds,
            "next_attempt_at": self.next_attempt_at,
            "last_error": self.last_error,
            "failing_since": self.failing_since,
            "failing_paths": self.failing_paths,
            "attempts": self.attempts,
            "contested": self.contested,
            "fought": self.fought,
            "last_heal_at": self.last_heal_at,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SubsystemHealing:
        """A record as `reconcile.json` holds it (keys it does not know are left out)."""
        known = cls().to_json()
        fields = {k: v for k, v in data.items() if k in known}
        if "breaker" in fields:
            fields["breaker"] = Breaker(fields["breaker"])
        return cls(**fields)


@dataclass
class _PathHistory:
    last: str | None = None  # value key of the last observation; "" when in sync
    flips: dict[str, list[float]] = field(default_factory=dict)


class Governor:
    """Decides, per subsystem, whether healing may run now, and remembers why not."""

    def __init__(self, options: HealingOptions, rng: random.Random | None = None) -> None:
        self.options = options
        self.rng = rng or random.Random()
        self.subsystems: dict[str, SubsystemHealing] = {}
        self.acks: dict[str, Acknowledgement] = {}
        self._paths: dict[tuple[str, str], _PathHistory] = {}
        self.dirty = False

    # -- persistence --------------------------------------------------------
    def to_json(self) -> GovernorJSON:
        return {
            "subsystems": {n: s.to_json() for n, s in sorted(self.subsystems.items())},
            "acks": self.acks,
        }

    def load(self, data: Mapping[str, Any] | None) -> None:
        data = data or {}
        self.subsystems = {
            name: SubsystemHealing.from_json(entry)
            for name, entry in dict(data.get("subsystems", {})).items()
        }
        # As `acknowledge` wrote them (a damaged file raises here, and the loop starts empty).
        self.acks = {
            name: cast(Acknowledgement, dict(ack))
            for name, ack in dict(data.get("acks", {})).items()
        }
        management = self.subsystems.get(MANAGEMENT)
        if management is not None and management.contested:
            # Saved by a trueup that still contested management: fought now, and restored.
            for path, record in management.contested.items():
                fought = record.copy()
                fought["reason"] = (
                    f"{record.get('writer') or 'another writer'} kept changing "
                    f"{path}; trueup keeps restoring it (management is never left to "
                    "another writer): find and stop that writer"
                )
                management.fought.setdefault(path, fought)
            management.contested = {}
            self.dirty = True

    def of(self, name: str) -> SubsystemHealing:
        if name not in self.subsystems:
            self.subsystems[name] = SubsystemHealing()
        return self.subsystems[name]

    # -- decisions ----------------------------------------------------------
    def blocked(self, name: str, now: float) -> str | None:
        """Why healing `name` must wait now, or None when it may run.

        Management waits only for its short back-off: acknowledgements, the
        breaker and the retry budget never stop it from being restored.
        """
        heal = self.of(name)
        if name == MANAGEMENT:
            if heal.next_attempt_at is not None and now < heal.next_attempt_at:
                return f"backing off {heal.backoff_seconds:g}s (until {iso_time(heal.next_attempt_at)})"
            return None
        ack = self.acks.get(name)
        if ack is not None and now < float(ack["until"]):
            return f"acknowledged until {ack['until_at']}: {ack['reason']}"
        if heal.breaker == Breaker.OPEN:
            if heal.open_until is not None and now >= heal.open_until:
                heal.breaker = Breaker.HALF_OPEN  # the cool-down is over: one attempt decides
                self.dirty = True
            else:
                until = iso_time(heal.open_until) if heal.open_until else "an apply"
                return f"circuit breaker open until {until} after {heal.failures} failures"
        if heal.next_attempt_at is not None and now < heal.next_attempt_at:
            return f"backing off {heal.backoff_seconds:g}s (until {iso_time(heal.next_attempt_at)})"
        window_start = now - self.options.retry_window
        heal.attempts = [t for t in heal.attempts if t > window_start]
        if len(heal.attempts) >= self.options.retry_budget:
            reopen = heal.attempts[0] + self.options.retry_window
            return (
                f"retry budget spent ({len(heal.attempts)} attempts in "
                f"{self.options.retry_window:g}s; next at {iso_time(reopen)})"
            )
        return None

    def record_attempt(self, name: str, now: float) -> None:
        self.of(name).attempts.append(now)
        self.dirty = True

    def record_resolved(self, name: str) -> None:
        """The drift a failing heal was fighting is gone (fixed by someone or something else)."""
        heal = self.of(name)
        if heal.failures == 0 and heal.breaker == Breaker.CLOSED:
            return
        last_heal_at = heal.last_heal_at
        self.record_success(name, 0.0)
        heal.last_heal_at = last_heal_at

    def record_success(self, name: str, now: float) -> None:
        heal = self.of(name)
        heal.failures = 0
        heal.breaker = Breaker.CLOSED
        heal.opened_at = heal.open_until = None
        heal.backoff_seconds = 0.0
        heal.next_attempt_at = None
        heal.last_error = None
        heal.failing_since = None
        heal.failing_paths = []
        heal.last_heal_at = now
        self.dirty = True

    def record_failure(self, name: str, now: float, error: str, paths: list[str]) -> bool:
        """Count a failed heal; True when this failure opened the breaker."""
        heal = self.of(name)
        heal.failures += 1
        heal.last_error = error
        heal.failing_paths = natural_sorted(paths)
        if heal.failing_since is None:
            heal.failing_since = now
        cap = self.options.backoff_cap
        if name == MANAGEMENT:
            cap = min(cap, MANAGEMENT_BACKOFF_CAP)
        nominal = min(cap, self.options.backoff_base * 2 ** (heal.failures - 1))
        jitter = 1.0 + self.rng.uniform(-self.options.jitter, self.options.jitter)
        heal.backoff_seconds = round(nominal, 3)
        heal.next_attempt_at = now + min(cap, nominal * jitter)
        self.dirty = True
        if name == MANAGEMENT:
            return False  # never opens: management is always restored again
        opened = False
        if heal.breaker == Breaker.HALF_OPEN or (
            heal.breaker == Breaker.CLOSED and heal.failures >= self.options.breaker_threshold
        ):
            opened = heal.breaker == Breaker.CLOSED
            heal.breaker = Breaker.OPEN
            heal.opened_at = now
            heal.open_until = now + self.options.breaker_cooldown
        self.dirty = True
        return opened

    def retry_now(self, name: str) -> bool:
        """Something the failure waited for happened (a link appeared): skip the back-off.

        The failure count, the retry budget and the breaker stand; only the
        wait for the next attempt ends. Returns whether there was a wait.
        """
        heal = self.of(name)
        if heal.next_attempt_at is None or heal.breaker == Breaker.OPEN:
            return False
        heal.next_attempt_at = None
        self.dirty = True
        return True

    def link_returned(self, name: str, now: float) -> bool:
        """A managed link came (back) up: what `name` failed against may be gone.

        The back-off ends, the retry budget starts over (what was spent was
        spent on the link's absence: the kernel flushing addresses and routes
        with their link is not a writer to fight), and an open breaker
        half-opens at once: one attempt decides (a failure opens it again for
        a full cool-down). A link up/down storm must not leave the kernel
        mixed for a whole retry window or cool-down once the link is back.
        """
        heal = self.of(name)
        if heal.attempts:
            heal.attempts = []
            self.dirty = True
        if heal.breaker == Breaker.OPEN:
            heal.breaker = Breaker.HALF_OPEN
            heal.open_until = now
            heal.next_attempt_at = None
            self.dirty = True
            return True
        return self.retry_now(name)

    def reset(self, names: Iterable[str]) -> None:
        """A new apply or an explicit reconcile: breaker closed, back-off and flaps forgotten."""
        for name in names:
            self.subsystems[name] = SubsystemHealing(last_heal_at=self.of(name).last_heal_at)
            for key in [k for k in self._paths if k[0] == name]:
                del self._paths[key]
        self.dirty = True

    # -- flap detection -----------------------------------------------------
    def observe(
        self,
        name: str,
        differing: Mapping[str, Any],
        now: float,
        written: Mapping[str, str] | None = None,
    ) -> list[tuple[str, NewlyMarked]]:
        """Record this pass's differing paths (path → observed value); return what is new.

        Only a change that a writer outside the kernel made counts as a flip:
        `written` maps a path to who wrote it (from the notification's
        sender). A route the kernel flushed because its address went is drift,
        but it is not somebody else writing that route.

        Returns newly contested paths (`"kind": "contested"`) and, for
        management, newly fought ones (`"kind": "fought"`): management is
        never contested, only reported while it keeps being restored. A
        contested or fought path another writer touches again stays so for
        another `flap_window` (`expire_contested`).
        """
        window_start = now - self.options.flap_window
        newly: list[tuple[str, NewlyMarked]] = []
        heal = self.of(name)
        for key, history in self._paths.items():
            if key[0] == name and key[1] not in differing:
                history.last = ""  # back in sync
        for path, observed in differing.items():
            history = self._paths.setdefault((name, path), _PathHistory())
            current = value_key(observed)
            if current == history.last:
                continue
            history.last = current
            if written is not None and path not in written:
                continue
            writer = (written or {}).get(path)
            flips = [t for t in history.flips.get(current, []) if t > window_start] + [now]
            history.flips[current] = flips
            marked = heal.fought if name == MANAGEMENT else heal.contested
            if path in marked:
                again = marked[path]
                again["flips"] = int(again.get("flips", 0)) + 1
                again["last_written_at"] = now
                again["last_at"] = iso_time(now)
                again["writer"] = writer or again.get("writer")
                self.dirty = True
                continue
            if len(flips) < self.options.flap_threshold:
                continue
            seen = (
                f"returned to the same undesired value {len(flips)} times in "
                f"{now - flips[0]:.1f}s: someone else is writing {path}"
                + (f" ({writer})" if writer else "")
            )
            if name == MANAGEMENT:
                kind = "fought"
                why = (
                    f"{seen}; trueup keeps restoring it (management is never left to "
                    "another writer): find and stop that writer"
                )
            else:
                kind = "contested"
                why = (
                    f"{seen}; trueup stopped healing it (detection continues) until no "
                    f"writer touched it for {self.options.flap_window:g}s"
                )
            record: MarkedPath = {
                "value": observed,
                "flips": len(flips),
                "since": iso_time(now),
                "last_at": iso_time(now),
                "last_written_at": now,
                "writer": writer,
                "reason": why,
            }
            marked[path] = record
            newly.append((path, {**record, "kind": kind}))
            self.dirty = True
        return newly

    def expire_contested(self, now: float) -> list[tuple[str, str, MarkedPath]]:
        """Contested and fought paths no writer touched for `flap_window`: cleared.

        Returns (subsystem, path, record) for each; healing of a cleared
        contested path resumes, and its flap count starts over.
        """
        cleared: list[tuple[str, str, MarkedPath]] = []
        for name, heal in self.subsystems.items():
            for marked in (heal.contested, heal.fought):
                for path, record in list(marked.items()):
                    if now < self._quiet_at(record):
                        continue
                    del marked[path]
                    self._paths.pop((name, path), None)
                    cleared.append((name, path, record))
        if cleared:
            self.dirty = True
        return cleared

    def _quiet_at(self, record: MarkedPath) -> float:
        last = record.get("last_written_at")
        if not isinstance(last, int | float):
            return float("inf")  # from an older agent: cleared by an apply or a reconcile
        return float(last) + self.options.flap_window

    def contested(self, name: str) -> dict[str, MarkedPath]:
        return self.of(name).contested

    # -- acknowledgements ---------------------------------------------------
    def acknowledge(
        self, name: str, now: float, seconds: float, reason: str, actor: str
    ) -> Acknowledgement:
        ack: Acknowledgement = {
            "until": now + seconds,
            "until_at": iso_time(now + seconds),
            "reason": reason,
            "actor": actor,
            "at": iso_time(now),
        }
        self.acks[name] = ack
        self.dirty = True
        return ack

    def expire_acks(self, now: float) -> list[tuple[str, Acknowledgement]]:
        expired = [(n, a) for n, a in self.acks.items() if now >= float(a["until"])]
        for name, _ in expired:
            del self.acks[name]
        if expired:
            self.dirty = True
        return expired

    # -- timing -------------------------------------------------------------
    def next_due(self, now: float) -> float | None:
        """The earliest moment something here changes by itself (wake the loop then)."""
        moments: list[float] = [float(a["until"]) for a in self.acks.values()]
        for heal in self.subsystems.values():
            if heal.next_attempt_at is not None and heal.next_attempt_at > now:
                moments.append(heal.next_attempt_at)
            if heal.breaker == Breaker.OPEN and heal.open_until is not None:
                moments.append(heal.open_until)
            if len(heal.attempts) >= self.options.retry_budget and heal.attempts:
                moments.append(heal.attempts[0] + self.options.retry_window)
            for record in (*heal.contested.values(), *heal.fought.values()):
                quiet = self._quiet_at(record)
                if quiet != float("inf"):
                    moments.append(quiet)
        return min(moments) if moments else None
