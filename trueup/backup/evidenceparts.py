"""The parts of an evidence bundle (`trueup.backup.evidence`) trueup writes itself, typed.

The status document, the desired and observed documents and the log are
written as they are; these are the parts collected for the bundle.
"""

from __future__ import annotations

from typing import Any, TypedDict

from trueup.journal.audit import AuditRecord
from trueup.model.jsontypes import JSONObject
from trueup.model.records import TransactionSummary

__all__ = ["Concurrency", "Environment", "History", "Observed", "Versions"]


class History(TypedDict):
    """`history.json`: the last transactions and the reconcile history."""

    transactions: list[TransactionSummary]
    reconcile: Any  # `reconcile.json` as read (None when missing)


class Concurrency(TypedDict):
    """`concurrency.json`: who holds what, and the writes refused for it."""

    writer_lock: dict[str, object] | None
    agent: dict[str, object] | None
    open_transaction: Any  # status' `journal.open`, as the status document holds it
    refusals_since_last_write: list[JSONObject]
    refused_writes: list[AuditRecord]


class Versions(TypedDict):
    """`versions.json`: the revisions the agent, the control plane and the files name."""

    control_plane_last_fetched: int | None
    applied: Any
    applied_digest: Any
    desired: int | None
    control_plane: Any
    control_plane_applied: Any
    aligned: bool


class Observed(TypedDict):
    """`observed.json`: what the kernel and the daemons hold now, per subsystem."""

    observed_at: str
    facts: dict[str, JSONObject]  # per subsystem: a document path → its value
    unobservable: dict[str, str]


class Environment(TypedDict):
    """`environment.json`: the versions and the process the bundle was collected with."""

    trueup: str
    python: str
    executable: str
    kernel: dict[str, str]
    daemons: dict[str, str | None]
    agent_pid: int | None
    systemd_unit: str | None
    collector_uid: int
