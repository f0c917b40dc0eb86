"""The audit verifier's engine: replay the log into what it says each audited table holds,
then compare every live row with that.

An audited table is declared once, in audittables.py:

- an `AuditedTable` says how its live rows are read (and in which order they are
  reported), the key that ties a row to the log, how findings name a row, the checks
  that compare a row with its audited state (`checks`; `Same` for a column the log
  records as it is) and those run on every row, audited or not (`always`), and how an
  audited row missing from the table is reported (`Missing`, or not at all);
- each `Action` says which audit action creates, changes or deletes its rows, how the
  action's detail names the row (`key`) and how it maps to the row's audited state (a
  fact record, `creates`); `first` holds what the action does to other rows before
  (revoking the tokens it replaces), `each` a detail that lists several rows.

This module knows no table. `replay` applies entries through the declared actions into
`Facts` (one `TableFacts` per table) and names each entry whose detail is malformed;
`verify_table` runs one table's checks over its rows. A row the log never created is
"inserted directly", or "restored" if the log deleted it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, cast

from sqlalchemy import Connection, RowMapping

from trueup.model.jsontypes import JSONObject
from trueup.server.auditchain import AuditProblem, entry_name
from trueup.server.keys import ServerKey

__all__ = [
    "Action",
    "AuditedTable",
    "Context",
    "Each",
    "Fact",
    "Facts",
    "Malformed",
    "Missing",
    "Reading",
    "Same",
    "Says",
    "TableFacts",
    "differs",
    "replay",
    "verify_table",
]

K = TypeVar("K", int, str, tuple[int, int])
F = TypeVar("F", bound="Fact")
T = TypeVar("T")


class Fact(Protocol):
    """What the log says about one row: at least the seq of the entry that said it last."""

    @property
    def seq(self) -> int: ...


class Malformed(Exception):
    """An entry's detail lacks a field its action needs, or has one of the wrong type."""


# -- replaying -------------------------------------------------------------------------------


class Reading:
    """One entry being replayed: its columns, its detail read field by field, and the facts
    so far (an action may look up a row named by an earlier one)."""

    __slots__ = ("detail", "entry", "facts", "seq", "target", "tenant_id")

    def __init__(self, entry: RowMapping, detail: JSONObject, facts: Facts) -> None:
        self.entry = entry
        self.detail = detail
        self.facts = facts
        self.seq: int = entry["seq"]
        self.tenant_id: int | None = entry["tenant_id"]
        self.target: str = entry["target"]

    def after(self, prefix: str) -> str | None:
        """The target past `prefix` ("user:ops" -> "ops"), or None if it has another."""
        target = self.target
        return target[len(prefix) :] if target.startswith(prefix) else None

    def optional_int(self, key: str) -> int | None:
        value = self.detail.get(key)
        if value is None or (isinstance(value, int) and not isinstance(value, bool)):
            return value
        raise Malformed(f"{key!r} is not an integer")

    def required_int(self, key: str) -> int:
        value = self.detail.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise Malformed(f"{key!r} is {'missing' if value is None else 'not an integer'}")

    def optional_str(self, key: str) -> str | None:
        value = self.detail.get(key)
        if value is None or isinstance(value, str):
            return value
        raise Malformed(f"{key!r} is not a string")

    def required_str(self, key: str) -> str:
        value = self.detail.get(key)
        if isinstance(value, str):
            return value
        raise Malformed(f"{key!r} is {'missing' if value is None else 'not a string'}")

    def ints(self, key: str) -> list[int]:
        """A list of integers (none if the key is absent)."""
        value = self.detail.get(key, [])
        if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            raise Malformed(f"{key!r} is not a list of integers")
        return value

    def number(self, key: str) -> float | None:
        """A number as a float; None when absent or not a number (never malformed)."""
        value = self.detail.get(key)
        return float(value) if isinstance(value, int | float) else None

    def item(self, detail: JSONObject) -> Reading:
        """The same entry, reading one object of a list in its detail."""
        return Reading(self.entry, detail, self.facts)


@dataclass
class TableFacts(Generic[K, F]):
    """What the log says one table holds: its live rows by key, the seq that deleted a
    row, and (for tables whose rows other entries name) the key of each (tenant, name)."""

    rows: dict[K, F] = field(default_factory=dict)
    deleted: dict[K, int] = field(default_factory=dict)
    ids: dict[tuple[int | None, str], K] = field(default_factory=dict)

    def get(self, key: K) -> F | None:
        return self.rows.get(key)


class Facts:
    """What the log says every audited table holds, one `TableFacts` per table."""

    def __init__(self) -> None:
        self._tables: dict[str, TableFacts[Any, Any]] = {}

    def of(self, table: AuditedTable[K, F]) -> TableFacts[K, F]:
        facts = self._tables.get(table.name)
        if facts is None:
            facts = self._tables[table.name] = TableFacts()
        return facts


@dataclass(frozen=True)
class Each:
    """A detail listing several rows: `key` names the list, `what` one of its objects."""

    key: str
    what: str


@dataclass(frozen=True)
class Action(Generic[K, F]):
    """What one audit action does to one table's rows, read from its detail.

    In order: the row's `key`; the `first` steps (read and applied as they come, so a
    revocation read before a malformed field still counts); then the effect: `deletes`
    the row, `creates` (or replaces) its audited state, or `changes` a row already known.
    `names` gives the name other entries use for a created row (its tenant's index).
    """

    name: str
    table: AuditedTable[K, F]
    key: Callable[[Reading], K]
    creates: Callable[[Reading, F | None], F] | None = None
    changes: Callable[[F, Reading], None] | None = None
    deletes: bool = False
    first: tuple[Callable[[Reading], None], ...] = ()
    names: Callable[[F], str | None] | None = None
    each: Each | None = None

    def apply(self, reading: Reading) -> None:
        if self.each is None:
            self._apply(reading)
            return
        for item in reading.detail.get(self.each.key, []):
            if not isinstance(item, dict):
                raise Malformed(f"{self.each.what} is not an object")
            self._apply(reading.item(item))

    def _apply(self, reading: Reading) -> None:
        rows = reading.facts.of(self.table).rows
        key = self.key(reading)
        for step in self.first:
            step(reading)
        if self.deletes:
            rows.pop(key, None)
            reading.facts.of(self.table).deleted[key] = reading.seq
        if self.creates is not None:
            fact = rows[key] = self.creates(reading, rows.get(key))
            name = None if self.names is None else self.names(fact)
            if name is not None:
                reading.facts.of(self.table).ids[(reading.tenant_id, name)] = key
        if self.changes is not None:
            known = rows.get(key)
            if known is not None:
                self.changes(known, reading)


def replay(
    entries: Iterable[RowMapping],
    actions: Mapping[str, Sequence[Action[Any, Any]]],
    facts: Facts,
) -> list[AuditProblem]:
    """Apply `entries` in order through the actions declared for each; the malformed ones."""
    problems = []
    for entry in entries:
        try:
            detail = json.loads(entry["detail"])
            if not isinstance(detail, dict):
                raise Malformed("detail is not a JSON object")
            reading = Reading(entry, detail, facts)
            for action in actions.get(entry["action"], ()):
                action.apply(reading)
        except (Malformed, ValueError, TypeError, KeyError, AttributeError) as exc:
            problems.append(
                AuditProblem(
                    "audit_log",
                    entry_name(entry),
                    f"detail malformed ({exc}); the rows this entry vouches for are not covered",
                )
            )
    return problems


# -- verifying -------------------------------------------------------------------------------


@dataclass
class Context:
    """What the checks of a verification share: the connection, the key, the replayed
    facts, and lookups computed once (`cached`)."""

    conn: Connection
    key: ServerKey
    facts: Facts
    _cache: dict[object, object] = field(default_factory=dict)

    def cached(self, compute: Callable[[Context], T]) -> T:
        if compute not in self._cache:
            self._cache[compute] = compute(self)
        return cast(T, self._cache[compute])


@dataclass(frozen=True)
class Says:
    """One finding about a row, before the engine names the table and the row."""

    problem: str
    gap: bool = False


def differs(what: str, live: object, audited: object, seq: int) -> str:
    return (
        f"{what} is {live!r} but the audit log (seq={seq}) says {audited!r} "
        "(changed behind the server's back)"
    )


@dataclass(frozen=True)
class Same(Generic[F]):
    """A column the log records as it is: the live value must be the audited one (an
    audited None: not recorded, by an older trueup). `what` names it (the column)."""

    column: str
    audited: Callable[[F], object]
    what: str | None = None

    def __call__(self, row: RowMapping, fact: F, _ctx: Context) -> Says | None:
        value = self.audited(fact)
        if value is None or row[self.column] == value:
            return None
        return Says(differs(self.what or self.column, row[self.column], value, fact.seq))


@dataclass(frozen=True)
class Missing(Generic[K]):
    """How an audited row that is not in the table is reported: `problem` ({seq}: the
    entry that created it) about the row `label` names."""

    problem: str
    label: Callable[[K, Context], str]


@dataclass(frozen=True)
class AuditedTable(Generic[K, F]):
    """A table the log vouches for, as verification reads it (see the module docstring)."""

    name: str
    rows: Callable[[Connection], Iterable[RowMapping]]
    key: Callable[[RowMapping], K]
    label: Callable[[RowMapping, Context], str]
    checks: tuple[Callable[[RowMapping, F, Context], Says | None], ...] = ()
    always: tuple[Callable[[RowMapping, F | None, Context], Says | None], ...] = ()
    missing: Missing[K] | None = None


def _unaudited(deleted: int | None) -> Says:
    if deleted is None:
        return Says("has no audit entry (inserted directly)")
    return Says(f"deleted at seq={deleted} but still present (restored)")


def verify_table(table: AuditedTable[K, F], ctx: Context) -> list[AuditProblem]:
    """Every finding about `table`: each live row against its audited state, then each
    audited row that is missing."""
    facts = ctx.facts.of(table)
    problems: list[AuditProblem] = []
    live: set[K] = set()
    for row in table.rows(ctx.conn):
        key = table.key(row)
        live.add(key)
        name = table.label(row, ctx)
        fact = facts.get(key)
        said = (
            [_unaudited(facts.deleted.get(key))]
            if fact is None
            else [s for check in table.checks if (s := check(row, fact, ctx)) is not None]
        )
        said += [s for check in table.always if (s := check(row, fact, ctx)) is not None]
        problems += [AuditProblem(table.name, name, s.problem, s.gap) for s in said]
    if table.missing is not None:
        for key, fact in sorted(facts.rows.items(), key=lambda item: item[0]):
            if key not in live:
                label = table.missing.label(key, ctx)
                problems.append(
                    AuditProblem(table.name, label, table.missing.problem.format(seq=fact.seq))
                )
    return problems
