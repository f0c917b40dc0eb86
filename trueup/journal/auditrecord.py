"""The records of the audit log (`trueup.journal.audit`): a line, and what `records()` lists.

Standard library only: the audit log is imported wherever the state directory is.
"""

from __future__ import annotations

from typing import Any, TypeAlias, TypedDict

__all__ = [
    "AnchorMismatch",
    "AuditDetails",
    "AuditRecord",
    "UnparseableLine",
    "UnsignedAuditRecord",
]


# An event's own fields (`append(event, actor, **details)`): every event names its own
# (txn, subsystem, reason, …), so the line types the frame and leaves the details open.
AuditDetails: TypeAlias = dict[str, Any]


class UnsignedAuditRecord(TypedDict):
    """An audit line before its hash is computed over it."""

    seq: int
    at: str
    event: str
    actor: str
    details: AuditDetails
    prev: str  # the hash of the line before (GENESIS for the first)


class AuditRecord(UnsignedAuditRecord):
    """One line of `audit.jsonl`; `hash` is sha256 over the canonical JSON of the rest."""

    hash: str


class UnparseableLine(TypedDict):
    """A line of `audit.jsonl` that is no record, as `AuditLog.records()` lists it."""

    unparseable: str


class AnchorMismatch(TypedDict, total=False):
    """The details of an `audit_anchor_mismatch` event."""

    reason: str  # truncated | emptied | rewritten | anchor invalid
    error: str
    anchor_seq: int
    anchor_hash: str
    found_seq: int
    found_hash: str
