"""The append-only, hash-chained audit log (`audit.jsonl`).

Each line holds its sequence number, the previous line's hash and its own
hash over the canonical JSON of everything else; `verify()` names the first
line that was edited, removed, inserted or reordered.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from trueup.journal.atomic import append_line

__all__ = ["AuditLog", "AuditProblem", "now_iso"]

GENESIS = "0" * 64


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _hash(record: dict[str, Any]) -> str:
    body = {k: v for k, v in record.items() if k != "hash"}
    blob = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


@dataclass(frozen=True)
class AuditProblem:
    line: int
    problem: str

    def __str__(self) -> str:
        return f"audit.jsonl line {self.line}: {self.problem}"


class AuditLog:
    _locks: dict[Path, threading.Lock] = {}

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = self._locks.setdefault(path.resolve(), threading.Lock())

    def _tail(self) -> tuple[int, str]:
        if not self.path.exists():
            return 0, GENESIS
        last = b""
        with self.path.open("rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - 65536))
            chunk = handle.read().rstrip(b"\n")
            last = chunk.rsplit(b"\n", 1)[-1]
        if not last:
            return 0, GENESIS
        record = json.loads(last)
        return int(record["seq"]), str(record["hash"])

    def append(self, event: str, actor: str = "local", **details: Any) -> dict[str, Any]:
        with self._lock:
            seq, prev = self._tail()
            record: dict[str, Any] = {
                "seq": seq + 1,
                "at": now_iso(),
                "event": event,
                "actor": actor,
                "details": details,
                "prev": prev,
            }
            record["hash"] = _hash(record)
            append_line(self.path, json.dumps(record, sort_keys=True, separators=(",", ":")))
            return record

    def tail(self, max_bytes: int = 256 * 1024) -> list[dict[str, Any]]:
        """The last records (whole lines within the last `max_bytes`), oldest first."""
        if not self.path.exists():
            return []
        with self.path.open("rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - max_bytes))
            chunk = handle.read()
        lines = chunk.splitlines()
        if size > max_bytes and lines:
            lines = lines[1:]  # the first line may be cut
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return out

    def records(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                out.append({"unparseable": line})
        return out

    def verify(self) -> list[AuditProblem]:
        """Every line whose chain breaks; the first names where tampering starts."""
        problems: list[AuditProblem] = []
        prev = GENESIS
        expected_seq = 1
        for number, record in enumerate(self.records(), start=1):
            if "unparseable" in record:
                problems.append(AuditProblem(number, "not valid JSON (edited)"))
                prev, expected_seq = "?", expected_seq + 1
                continue
            if record.get("hash") != _hash(record):
                problems.append(AuditProblem(number, "content does not match its hash (edited)"))
            elif record.get("seq") != expected_seq:
                problems.append(
                    AuditProblem(
                        number,
                        f"sequence {record.get('seq')} where {expected_seq} was expected "
                        "(a line was removed, inserted or reordered)",
                    )
                )
            elif record.get("prev") != prev and prev != "?":
                problems.append(
                    AuditProblem(number, "does not chain to the line before (removed or reordered)")
                )
            prev = str(record.get("hash"))
            expected_seq = int(record.get("seq", expected_seq)) + 1
        return problems
