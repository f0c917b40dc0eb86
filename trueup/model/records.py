"""The records that cross package boundaries: applied revision, pending confirmation, journal.

The agent writes them into the state directory, the CLI and status read
them, the control-plane report carries parts of them. Each is one typed
model here instead of a `dict[str, Any]` shaped in several places:

* `Applied` — `applied.json`: the applied revision's identity (version,
  document digest, origin, the last control-plane version, a local
  override) and how it was applied;
* `Pending` — `pending-confirm.json`: an apply waiting for `trueup confirm`;
* `BeginFields` / `Entry` — the journal's `begin` line and the lines after
  it (typed dictionaries: the journal is on the hot path of every apply, so
  its records are checked by mypy, not validated at run time);
* `DamageRecord` — a damaged state file and what it forbids;
* `TransactionSummary` — one transaction as status and the classifier see it
  (`trueup.journal.journal.Transaction.summary`).

Unknown fields are kept (`extra="allow"`), so a newer agent's files still
load in an older one for `doctor` and `evidence`.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

from pydantic import BaseModel, ConfigDict, with_config
from typing_extensions import TypedDict as ValidatedTypedDict

from trueup.model.jsontypes import JSONObject

__all__ = [
    "Applied",
    "BeginFields",
    "DamageRecord",
    "Entry",
    "Override",
    "Pending",
    "ScopeJSON",
    "TransactionSummary",
]

Outcome = Literal["committed", "partial"]


class _Record(BaseModel):
    model_config = ConfigDict(extra="allow")

    def to_json(self) -> JSONObject:
        """The record as its file holds it."""
        body: JSONObject = self.model_dump(mode="json")
        return body


class Override(_Record):
    """A local change on a device a control plane manages: who, when, why."""

    version: int
    actor: str
    at: str
    reason: str
    digest: str


class Applied(_Record):
    """`applied.json`: what the device runs, and where it came from."""

    version: int = 0
    digest: str | None = None
    origin: str | None = None  # control-plane | local-file | local-cli | rollback | confirm-timeout
    cp_version: int | None = None  # the last revision applied from the control plane
    override: Override | None = None
    outcome: str | None = None  # committed | partial
    txn: str | None = None
    applied_at: str | None = None
    mode: str | None = None
    failed: dict[str, str] = {}
    # Failing before this revision, their section unchanged by it: not converged by its
    # transaction, still failing, healed by the reconcile loop (subsystem → why).
    carried: dict[str, str] = {}
    actor: str | None = None
    source: str | None = None


class Pending(_Record):
    """`pending-confirm.json`: an apply that is rolled back unless confirmed in time."""

    state: Literal["applying", "pending"]
    version: int | None = None
    confirmed_version: int
    deadline: float
    deadline_at: str
    actor: str
    created_at: str
    txn: str | None = None


class ScopeJSON(TypedDict):
    """What a transaction manages (`trueup.subsystems.scope.Scope.to_json`), as its journal
    `begin` line keeps it for crash recovery."""

    interfaces: list[str]
    tables: list[int]
    management_interface: str
    management_owned: list[str]
    # [table, destination, metric] of the default routes `spec.management` owns.
    management_default_routes: list[list[int | str]]
    # Journals written before these existed have none.
    exact: NotRequired[bool]
    owned: NotRequired[dict[str, list[str]]]
    virtual_addresses: NotRequired[list[str]]


class BeginFields(TypedDict, total=False):
    """The fields of a journal `begin` line (besides txn, type, at, pid)."""

    kind: str
    origin: str
    version: int
    mode: str
    digest: str | None
    actor: str
    subsystems: list[str]
    all_subsystems: list[str]
    scope: ScopeJSON
    before: dict[str, dict[str, Any]]
    previous_applied: dict[str, Any]
    steps: dict[str, int]
    paths: list[str]


class Entry(TypedDict, total=False):
    """Any journal line: `begin`, then `applied`/`failed`/`waiting`/`verified`/`recovering`/
    `recovered` (one per subsystem brought back, in tier order), then `commit` or
    `rolled_back`."""

    txn: str
    type: str
    at: str
    pid: int
    subsystem: str
    error: str
    outcome: str
    version: int
    failed: dict[str, str | None]
    recovered: bool
    reason: str
    errors: list[str]
    audit: list[dict[str, Any]]


@with_config(ConfigDict(extra="allow"))
class TransactionSummary(ValidatedTypedDict, total=False):
    """One transaction as status shows it (`journal.open`, `journal.last`); every key is
    there when the journal wrote it, a status document read back may hold fewer."""

    txn: str
    kind: str
    version: int | None
    mode: str | None
    subsystems: list[str]
    began_at: str | None
    ended_at: str | None
    state: str  # open | commit | rolled_back
    outcome: str | None
    recovered: bool
    applied: list[str]
    failed: dict[str, str | None]
    history: list[JSONObject]  # the journal's lines as written, before-images and scope left out


class DamageRecord(ValidatedTypedDict):
    """A damaged state file as status shows it (`trueup.journal.damage.Damage.to_json`)."""

    path: str
    file: str
    problem: str
    blocks: str  # writes | heals | none
    consequence: str
