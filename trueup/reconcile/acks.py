"""`trueup ack`: healing paused for a while, never detection — given, withdrawn, expired.

Who calls this: the reconcile loop (`ReconcileLoop.acknowledge`,
`clear_acknowledgement`, and every pass for the expiry), under its lock.
The acknowledgements themselves live in the governor
(`trueup.reconcile.healing.Governor.acks`, saved in `reconcile.json`);
here are the operator's answers, the audit lines and the ones that ended,
which status shows (`acknowledgements_ended`, the last `ENDED_ACKS`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import TypedDict

from trueup.journal.state import StateDir
from trueup.reconcile.healing import MANAGEMENT, Acknowledgement, Governor
from trueup.system.events import iso_time

__all__ = ["ENDED_ACKS", "AckAnswer", "Acknowledgements", "EndedAck", "EndedAckJSON", "Ending"]

ENDED_ACKS = 10  # expired or withdrawn acknowledgements shown (status, reports)
ACTOR = "reconciler"


class AckAnswer(TypedDict, total=False):
    """What `POST /v1/ack` and `DELETE /v1/ack` answer."""

    ok: bool
    message: str
    subsystem: str
    until: str  # an acknowledgement given: when it expires
    cleared: bool  # a withdrawal: whether there was one to withdraw


class Ending(StrEnum):
    """How an acknowledgement ended."""

    EXPIRED = "expired"
    WITHDRAWN = "withdrawn"


class EndedAckJSON(TypedDict):
    """An ended acknowledgement as status' `acknowledgements_ended` shows it."""

    subsystem: str
    until: str | None
    by: str | None
    reason: str | None
    at: str | None
    ended: Ending
    ended_at: str


@dataclass(frozen=True)
class EndedAck:
    """An acknowledgement that expired or was withdrawn."""

    subsystem: str
    until: str | None
    by: str | None
    reason: str | None
    at: str | None
    ended: Ending
    ended_at: str

    def to_json(self) -> EndedAckJSON:
        return {
            "subsystem": self.subsystem,
            "until": self.until,
            "by": self.by,
            "reason": self.reason,
            "at": self.at,
            "ended": self.ended,
            "ended_at": self.ended_at,
        }


class Acknowledgements:
    def __init__(self, governor: Governor, state: StateDir, clock: Callable[[], float]) -> None:
        self.governor = governor
        self.state = state
        self.clock = clock
        self.ended: deque[EndedAck] = deque(maxlen=ENDED_ACKS)

    def refusal(self, subsystem: str, seconds: float) -> AckAnswer | None:
        """The answer to an acknowledgement that cannot be given, None when it can."""
        if seconds <= 0:
            return {"ok": False, "message": "--for must be a positive duration"}
        if subsystem == MANAGEMENT:
            return {
                "ok": False,
                "message": "management cannot be acknowledged: trueup always restores the "
                "management address and route (use `trueup management set` to change them)",
            }
        return None

    def give(self, subsystem: str, seconds: float, reason: str, actor: str) -> AckAnswer:
        """Pause `subsystem`'s healing for `seconds` (audited `acknowledged`)."""
        ack = self.governor.acknowledge(subsystem, self.clock(), seconds, reason, actor)
        self.state.audit.append(
            "acknowledged", actor, subsystem=subsystem, until=ack["until_at"], reason=reason
        )
        return {
            "ok": True,
            "subsystem": subsystem,
            "until": ack["until_at"],
            "message": f"{subsystem}: healing paused until {ack['until_at']} ({reason}); "
            "drift is still detected and reported",
        }

    def withdraw(self, subsystem: str, actor: str) -> AckAnswer:
        """Withdraw `subsystem`'s acknowledgement now (audited `ack_cleared`)."""
        ack = self.governor.acks.pop(subsystem, None)
        if ack is None:
            return {
                "ok": True,
                "subsystem": subsystem,
                "cleared": False,
                "message": f"{subsystem}: no acknowledgement to withdraw",
            }
        self.governor.dirty = True
        self._ended(subsystem, ack, Ending.WITHDRAWN, self.clock())
        self.state.audit.append(
            "ack_cleared", actor, subsystem=subsystem, until=ack["until_at"], reason=ack["reason"]
        )
        return {
            "ok": True,
            "subsystem": subsystem,
            "cleared": True,
            "message": f"{subsystem}: acknowledgement until {ack['until_at']} withdrawn; "
            "healing follows the policy again",
        }

    def expire(self, now: float) -> None:
        for name, ack in self.governor.expire_acks(now):
            self.state.audit.append(
                "ack_expired", ACTOR, subsystem=name, until=ack["until_at"], reason=ack["reason"]
            )
            self._ended(name, ack, Ending.EXPIRED, now)

    def ended_json(self) -> list[EndedAckJSON]:
        """Status' `acknowledgements_ended`, newest first."""
        return [ended.to_json() for ended in self.ended]

    def _ended(self, name: str, ack: Acknowledgement, how: Ending, now: float) -> None:
        self.ended.appendleft(
            EndedAck(
                subsystem=name,
                until=ack.get("until_at"),
                by=ack.get("actor"),
                reason=ack.get("reason"),
                at=ack.get("at"),
                ended=how,
                ended_at=iso_time(now),
            )
        )
