"""The drift attribution record the agent reports, the CLI shows and the control plane stores.

Declared here, below every layer that reads it: the agent builds it
(`trueup.reconcile.attribution`), `trueup status` and `trueup drift` show it, and
the control plane keeps it with each device's drift.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Required, TypedDict

__all__ = ["Attribution", "DetectedBy"]


class DetectedBy(StrEnum):
    """Which look found a drift."""

    EVENT = "event"  # a notification woke the loop (or proved the change itself)
    RESYNC = "resync"  # the periodic full look
    REQUEST = "request"  # an explicit `trueup reconcile`


class Attribution(TypedDict, total=False):
    """One notification that explains a drift: `NetlinkEvent.to_json()` (its detail's keys
    beside these), the writer named; or, when none arrived, a note of which look found it."""

    message: Required[str | None]  # RTM_NEWADDR, …; None in the note
    kind: str
    received_at: Required[str]
    ifname: str
    address: str
    destination: str
    table: int
    gateway: str
    protocol: str
    sender_port: int
    sender: str
    own: bool
    match: str  # "related" (nothing matched: what did arrive), "proves the change"
    source: DetectedBy  # the note: which look found it
    detail: str  # the note: why no notification is shown
