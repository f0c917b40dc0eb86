"""The write-ahead journal (`journal.jsonl`): one line per transaction event, fsync'd.

A transaction is `begin` (version, subsystems, scope, before-images, the
applied record it replaces) → `applied`/`failed` per subsystem → `commit` or
`rolled_back`. A `begin` with no terminal record is an *open* transaction:
after a crash the agent rolls it back to its before-images (see
`trueup.reconcile.engine.Engine.recover`). A torn last line — a crash in the
middle of a write — is ignored, which is safe because every record is
written before the action it announces.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Unpack, cast

from trueup.journal.atomic import UnsafeFile, append_line, write_atomic
from trueup.journal.audit import now_iso
from trueup.model.records import BeginFields, Entry, TransactionSummary
from trueup.system.safefile import open_file, unsafe_entry

if TYPE_CHECKING:
    from trueup.journal.confirm import PendingConfirm

__all__ = ["TERMINAL", "Journal", "JournalRecord", "Transaction"]

TERMINAL = {"commit", "rolled_back"}
_COMPACT_BYTES = 4 * 1024 * 1024
_KEEP_TRANSACTIONS = 50
_MIN_KEEP = 2  # transactions kept by compaction whatever their size


class JournalRecord(BeginFields, Entry, total=False):
    """Any line of `journal.jsonl` as written and read back: `txn`, `type`, `at`, and the
    fields of its type (a `begin`'s, the entries after it, and the confirmation's trace:
    `confirm_pending` / `confirm_closed` with the `pending` record they announce)."""

    to_version: int  # recovering, rolled_back (recovered): the version recovery returns to
    settles: str  # commit: the recovered transaction a later write answers
    pending: PendingConfirm | None
    applied_version: int  # confirm_closed: the applied version it was settled against
    by: str  # confirm_closed (confirmed): who confirmed
    from_revision: int  # confirm_closed (rolled_back): the revision returned to


@dataclass
class _Parsed:
    inode: int
    offset: int = 0
    records: list[JournalRecord] = field(default_factory=list)
    lines: int = 0
    problems: list[tuple[int, str]] = field(default_factory=list)  # (line number, why ignored)


_CACHE: dict[Path, _Parsed] = {}
_CACHE_LOCK = threading.Lock()


@dataclass
class Transaction:
    """Everything the journal holds about one transaction."""

    txn: str
    records: list[JournalRecord] = field(default_factory=list)

    @property
    def begin(self) -> JournalRecord:
        return self.records[0]

    @property
    def terminal(self) -> JournalRecord | None:
        last = self.records[-1]
        return last if last["type"] in TERMINAL else None

    @property
    def is_open(self) -> bool:
        return self.terminal is None

    @property
    def kind(self) -> str:
        return str(self.begin.get("kind", "apply"))

    def summary(self) -> TransactionSummary:
        begin = self.begin
        terminal = self.terminal
        return {
            "txn": self.txn,
            "kind": self.kind,
            "version": begin.get("version"),
            "mode": begin.get("mode"),
            "subsystems": list(begin.get("subsystems", [])),
            "began_at": begin.get("at"),
            "ended_at": terminal.get("at") if terminal else None,
            "state": terminal["type"] if terminal else "open",
            "outcome": terminal.get("outcome") if terminal else None,
            "recovered": bool(terminal.get("recovered")) if terminal else False,
            "applied": [
                r["subsystem"] for r in self.records if r["type"] == "applied" and "subsystem" in r
            ],
            "failed": {
                r["subsystem"]: r.get("error")
                for r in self.records
                if r["type"] == "failed" and "subsystem" in r
            },
            "history": [
                {k: v for k, v in r.items() if k not in ("before", "scope", "previous_applied")}
                for r in self.records
            ],
        }


def _parse(line: bytes) -> tuple[JournalRecord | None, str]:
    """A journal line's record (txn, type and a begin's time checked), or None and why not."""
    try:
        record = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError:
        return None, "not valid UTF-8"
    except ValueError:
        return None, "not valid JSON"
    if not isinstance(record, dict):
        return None, "not a journal record"
    if not isinstance(record.get("txn"), str) or not isinstance(record.get("type"), str):
        return None, "not a journal record (no txn or type)"
    if record["type"] == "begin" and not isinstance(record.get("at"), str):
        return None, "a begin record without its time"
    return cast("JournalRecord", record), ""


class Journal:
    def __init__(self, path: Path) -> None:
        self.path = path

    def _write(self, record: JournalRecord) -> None:
        append_line(self.path, json.dumps(record, sort_keys=True, separators=(",", ":")))

    def begin(self, **fields: Unpack[BeginFields]) -> str:
        self._maybe_compact()
        txn = f"{now_iso().replace(':', '').replace('-', '')}-{secrets.token_hex(3)}"
        line = {"txn": txn, "type": "begin", "at": now_iso(), "pid": os.getpid(), **fields}
        self._write(cast("JournalRecord", line))
        return txn

    def record(self, txn: str, type_: str, **fields: Any) -> None:
        """Append a line of `type_` to transaction `txn` (its fields: `JournalRecord`'s)."""
        self._write(cast("JournalRecord", {"txn": txn, "type": type_, "at": now_iso(), **fields}))

    def _records(self) -> list[JournalRecord]:
        """Every whole record, parsed once per process: later calls read only what was appended."""
        try:
            fd = open_file(self.path, os.O_RDONLY)
        except (FileNotFoundError, UnsafeFile):
            return []  # an unsafe journal is named by problems() and refuses every begin
        with os.fdopen(fd, "rb") as handle:
            return self._parse_from(handle)

    def _parse_from(self, handle: BinaryIO) -> list[JournalRecord]:
        stat = os.fstat(handle.fileno())
        key = self.path.resolve()
        with _CACHE_LOCK:
            cached = _CACHE.get(key)
            if cached is None or cached.inode != stat.st_ino or cached.offset > stat.st_size:
                cached = _Parsed(stat.st_ino)
                _CACHE[key] = cached
            if cached.offset < stat.st_size:
                handle.seek(cached.offset)
                chunk = handle.read()
                end = chunk.rfind(b"\n") + 1  # a torn last line waits for its newline
                for line in chunk[:end].split(b"\n")[:-1]:
                    cached.lines += 1
                    record, problem = _parse(line)
                    if record is not None:
                        cached.records.append(record)
                    else:
                        # A torn write (the action it announced never started), or an edit.
                        cached.problems.append((cached.lines, problem))
                cached.offset += end
            return list(cached.records)

    def problems(self) -> list[str]:
        """Lines that are not journal records, and a torn last line: each ignored, with why."""
        unsafe = unsafe_entry(self.path)
        if unsafe is not None:
            return [f"{unsafe}: refused (never followed); no transaction can be recorded"]
        self._records()
        key = self.path.resolve()
        with _CACHE_LOCK:
            cached = _CACHE.get(key)
            found = [
                f"line {n}: {why}; ignored as a torn write"
                for n, why in (cached.problems if cached else [])
            ]
            offset = cached.offset if cached else 0
            lines = cached.lines if cached else 0
        try:
            size = self.path.lstat().st_size
        except FileNotFoundError:
            return found
        if size > offset:
            found.append(
                f"line {lines + 1}: incomplete ({size - offset} bytes, no newline): a write cut "
                "short by a crash; ignored"
            )
        return found

    def records(self) -> list[JournalRecord]:
        """Every whole record, oldest first (lines that are not records are left out)."""
        return self._records()

    def transactions(self) -> list[Transaction]:
        by_id: dict[str, Transaction] = {}
        order: list[str] = []
        for record in self._records():
            txn = str(record.get("txn"))
            if txn not in by_id:
                if record.get("type") != "begin":
                    continue
                by_id[txn] = Transaction(txn)
                order.append(txn)
            by_id[txn].records.append(record)
        return [by_id[t] for t in order]

    def open_transaction(self) -> Transaction | None:
        for transaction in reversed(self.transactions()):
            if transaction.is_open:
                return transaction
        return None

    def last(self, *, kinds: tuple[str, ...] | None = None) -> Transaction | None:
        for transaction in reversed(self.transactions()):
            if kinds is None or transaction.kind in kinds:
                return transaction
        return None

    def _maybe_compact(self) -> None:
        """Keep the journal bounded: rewrite it with the last transactions only."""
        try:
            if self.path.lstat().st_size < _COMPACT_BYTES:
                return
        except FileNotFoundError:
            return
        # The last transactions, newest first, up to half the threshold (at least
        # `_MIN_KEEP`): with large before-images (a 5,000-rule firewall is 1.5 MB)
        # 50 transactions would stay above the threshold and every begin would
        # rewrite and re-read all of them.
        kept: list[list[str]] = []
        size = 0
        for transaction in reversed(self.transactions()[-_KEEP_TRANSACTIONS:]):
            lines = [
                json.dumps(r, sort_keys=True, separators=(",", ":")) for r in transaction.records
            ]
            size += sum(len(line) + 1 for line in lines)
            if len(kept) >= _MIN_KEEP and size > _COMPACT_BYTES // 2:
                break
            kept.append(lines)
        text = "\n".join(line for lines in reversed(kept) for line in lines)
        write_atomic(self.path, (text + "\n").encode())
