"""Drift records: what drifted, since when, which look found it, who explains it, who healed it.

Who calls this: the reconcile loop's drift bookkeeping (`trueup.reconcile.
driftwatch`), its healer (which names its heal on the record), and the
status view (`trueup.reconcile.view`), which shows each record as JSON. The
notifications that fill `attribution` are matched in
`trueup.reconcile.attribution`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NotRequired, TypedDict

from trueup.model.drift import Attribution, DetectedBy
from trueup.system.events import iso_time

__all__ = [
    "DRIFT_HISTORY",
    "Attribution",
    "DetectedBy",
    "DriftBook",
    "DriftHistoryEntry",
    "DriftJSON",
    "DriftRecord",
    "EndedDrift",
    "HealedBy",
]

DRIFT_HISTORY = 20  # ended drift records kept (per agent), newest last


class HealedBy(TypedDict):
    """The heal that converged a drift (trueup's own, in its transaction)."""

    by: str
    action: str
    writer: str  # "trueup heal TXN"
    txn: str | None
    at: str
    actor: str


class DriftJSON(TypedDict):
    """A drift going on, as status shows it (`policies.NAME.drift`)."""

    since: str
    paths: list[str]
    detected_by: DetectedBy
    attribution: list[Attribution]
    healed_by: NotRequired[HealedBy | None]


class EndedDrift(DriftJSON):
    """A drift that ended (`last_drift`): when, and trueup's heal, None when none healed it."""

    ended_at: str | None


class DriftHistoryEntry(EndedDrift):
    """One line of status' `drift_history` (`ended_at` None while it goes on)."""

    subsystem: str


@dataclass
class DriftRecord:
    since: float
    paths: list[str]
    detected_by: DetectedBy
    attribution: list[Attribution] = field(default_factory=list)
    seen_events: int = 0  # events already considered, by sequence number
    # The heal that converged it; None while it lasts, or when something else put it back.
    healed_by: HealedBy | None = None

    def to_json(self) -> DriftJSON:
        out: DriftJSON = {
            "since": iso_time(self.since),
            "paths": self.paths,
            "detected_by": self.detected_by,
            "attribution": self.attribution,
        }
        if self.healed_by is not None:
            out["healed_by"] = self.healed_by
        return out


class DriftBook:
    """Per subsystem, the drift going on now and the last one that ended; and the
    agent's recent ended drift (`history`, the newest `DRIFT_HISTORY`, oldest first)."""

    def __init__(self) -> None:
        self.current: dict[str, DriftRecord] = {}
        self.last: dict[str, EndedDrift] = {}
        self.history: deque[DriftHistoryEntry] = deque(maxlen=DRIFT_HISTORY)

    def get(self, name: str) -> DriftRecord | None:
        return self.current.get(name)

    def start(self, name: str, since: float, detected_by: DetectedBy) -> DriftRecord:
        """The record of `name`'s drift: the open one, or a new one from `since`."""
        record = self.current.get(name)
        if record is None:
            record = DriftRecord(since=since, paths=[], detected_by=detected_by)
            self.current[name] = record
        return record

    def end(self, name: str, now: float) -> None:
        """`name` is in sync again, whoever fixed it: keep the record as the last drift.

        `healed_by` names trueup's heal when one converged it; None: it came
        back without one (undone by whoever changed it, or by the kernel).
        """
        record = self.current.pop(name, None)
        if record is not None:
            self.last[name] = {
                **record.to_json(),
                "ended_at": iso_time(now),
                "healed_by": record.healed_by,
            }
            self.history.append({"subsystem": name, **self.last[name]})

    def history_json(self) -> list[DriftHistoryEntry]:
        """Drift going on now (`ended_at` None) and the recent ended drift, newest first."""
        ongoing: list[DriftHistoryEntry] = [
            {"subsystem": name, **record.to_json(), "ended_at": None}
            for name, record in sorted(self.current.items(), key=lambda item: -item[1].since)
        ]
        return ongoing + list(reversed(self.history))

    def forget(self, names: Iterable[str] | None = None) -> None:
        """Drop open records without ending them (a new apply, an explicit reconcile)."""
        if names is None:
            self.current.clear()
            return
        for name in names:
            self.current.pop(name, None)
