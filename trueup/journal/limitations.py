"""Known limitations (`limitations.json`): permanent, reviewed records of accepted differences.

An acknowledgement (`trueup ack`) is temporary and stops healing; a known
limitation is the runbook's "permanent limitation documented": a difference
between desired and observed that a reviewer accepted for good (a NIC that
cannot take the MTU, a kernel without a feature). It never expires; it is
withdrawn by command, with a reason. Status classifies the differences it
covers as *accepted* (still listed, not drift needing action); evidence and
the control-plane report carry the records.

```
{"next_id": 3,
 "limitations": [{"id": "L1", "subsystem": "links", "path": "links.eth0.mtu",
                  "reason": TEXT, "reviewed_by": NAME, "ticket": TEXT | null,
                  "added_at": ISO, "added_by": ACTOR,
                  "withdrawn_at": ISO | null, "withdrawn_by": ACTOR | null,
                  "withdraw_reason": TEXT | null}]}
```

`path` matches a difference's path exactly, as a prefix at a path boundary
(`links.eth0` covers `links.eth0.mtu`), or as a shell glob (`routes.*`).
Every change is written atomically under a file lock and audited.
"""

from __future__ import annotations

import fcntl
import fnmatch
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TypedDict, cast

from trueup.journal.atomic import read_json, write_json
from trueup.journal.audit import AuditLog
from trueup.model.jsontypes import JSONObject
from trueup.subsystems.base import Difference
from trueup.system.safefile import open_file

__all__ = [
    "LIMITATIONS_FILE",
    "Limitation",
    "LimitationError",
    "accept_covered",
    "active_limitations",
    "add_limitation",
    "covering",
    "list_limitations",
    "withdraw_limitation",
]

LIMITATIONS_FILE = "limitations.json"
_LOCK_FILE = "limitations.lock"


class LimitationError(ValueError):
    """Bad input for a limitation (the message names the field and what is expected)."""


_OWN_KEYS = (
    "id",
    "subsystem",
    "path",
    "reason",
    "reviewed_by",
    "ticket",
    "added_at",
    "added_by",
    "withdrawn_at",
    "withdrawn_by",
    "withdraw_reason",
)


@dataclass(frozen=True)
class Limitation:
    """One known limitation: what difference is accepted, why, who reviewed it; withdrawn or not."""

    id: str
    subsystem: str
    path: str
    reason: str
    reviewed_by: str
    ticket: str | None = None
    added_at: str | None = None
    added_by: str | None = None
    withdrawn_at: str | None = None
    withdrawn_by: str | None = None
    withdraw_reason: str | None = None
    extra: dict[str, object] = field(default_factory=dict)  # a newer agent's fields, kept

    @classmethod
    def from_json(cls, body: dict[str, object]) -> Limitation:
        """The limitation a `limitations.json` entry holds."""

        def text(key: str) -> str | None:
            value = body.get(key)
            return None if value is None else str(value)

        return cls(
            id=str(body.get("id")),
            subsystem=str(body.get("subsystem")),
            path=str(body.get("path")),
            reason=str(body.get("reason")),
            reviewed_by=str(body.get("reviewed_by")),
            ticket=text("ticket"),
            added_at=text("added_at"),
            added_by=text("added_by"),
            withdrawn_at=text("withdrawn_at"),
            withdrawn_by=text("withdrawn_by"),
            withdraw_reason=text("withdraw_reason"),
            extra={k: v for k, v in body.items() if k not in _OWN_KEYS},
        )

    def to_json(self) -> dict[str, object]:
        """The entry as `limitations.json` holds it (keys sorted, as the file has them)."""
        body: dict[str, object] = {
            "id": self.id,
            "subsystem": self.subsystem,
            "path": self.path,
            "reason": self.reason,
            "reviewed_by": self.reviewed_by,
            "ticket": self.ticket,
            "added_at": self.added_at,
            "added_by": self.added_by,
            "withdrawn_at": self.withdrawn_at,
            "withdrawn_by": self.withdrawn_by,
            "withdraw_reason": self.withdraw_reason,
            **self.extra,
        }
        return dict(sorted(body.items()))


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class _LimitationsFile(TypedDict):
    """`limitations.json`: the next id to give, and every entry (withdrawn ones kept)."""

    next_id: int
    limitations: list[dict[str, object]]  # `Limitation.to_json()` each, as the file holds it


def _read(root: Path) -> _LimitationsFile:
    data = read_json(root / LIMITATIONS_FILE, None)
    if not isinstance(data, dict) or not isinstance(data.get("limitations"), list):
        return {"next_id": 1, "limitations": []}
    return cast("_LimitationsFile", data)


@contextmanager
def _locked(root: Path) -> Iterator[_LimitationsFile]:
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = open_file(root / _LOCK_FILE, os.O_RDWR | os.O_CREAT)  # never through a link
    with os.fdopen(fd, "a+") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        data = _read(root)
        yield data


def list_limitations(root: Path, *, include_withdrawn: bool = False) -> list[Limitation]:
    """The records, oldest first; withdrawn ones only when asked."""
    records = [Limitation.from_json(r) for r in _read(root)["limitations"] if isinstance(r, dict)]
    return records if include_withdrawn else [r for r in records if not r.withdrawn_at]


def active_limitations(root: Path) -> list[Limitation]:
    """Limitations in force (not withdrawn); a missing or unreadable file is none."""
    try:
        return list_limitations(root)
    except Exception:  # status never fails because this file cannot be read
        return []


def _required(field: str, value: str) -> str:
    text = (value or "").strip()
    if not text:
        raise LimitationError(f"{field}: expected a non-empty text")
    if len(text) > 1000:
        raise LimitationError(f"{field}: expected at most 1000 characters")
    return text


def add_limitation(
    root: Path,
    subsystem: str,
    path: str,
    *,
    reason: str,
    reviewed_by: str,
    ticket: str | None = None,
    actor: str = "local",
    known_subsystems: list[str] | None = None,
) -> Limitation:
    """Record a limitation; audited (`limitation_added`). Raises `LimitationError`."""
    subsystem = _required("subsystem", subsystem)
    if known_subsystems is not None and subsystem not in known_subsystems:
        raise LimitationError(
            f"subsystem: {subsystem!r} is not a subsystem; expected one of "
            + ", ".join(sorted(known_subsystems))
        )
    path = _required("path", path)
    reason = _required("--reason", reason)
    reviewed_by = _required("--reviewed-by", reviewed_by)
    added_at = _now()
    with _locked(root) as data:
        record = Limitation(
            id=f"L{int(data.get('next_id', 1))}",
            subsystem=subsystem,
            path=path,
            reason=reason,
            reviewed_by=reviewed_by,
            ticket=ticket.strip() if ticket and ticket.strip() else None,
            added_at=added_at,
            added_by=actor,
        )
        data["next_id"] = int(data.get("next_id", 1)) + 1
        data["limitations"].append(record.to_json())
        write_json(root / LIMITATIONS_FILE, data)
    AuditLog(root / "audit.jsonl").append(
        "limitation_added",
        actor,
        id=record.id,
        subsystem=subsystem,
        path=path,
        reason=record.reason,
        reviewed_by=record.reviewed_by,
        ticket=record.ticket,
    )
    return record


def withdraw_limitation(
    root: Path, limitation_id: str, *, reason: str, actor: str = "local"
) -> Limitation:
    """Withdraw one limitation (kept in the file, marked); audited. KeyError when unknown."""
    reason = _required("--reason", reason)
    with _locked(root) as data:
        entries = data["limitations"]
        for index, entry in enumerate(entries):
            if isinstance(entry, dict) and entry.get("id") == limitation_id:
                record = Limitation.from_json(entry)
                if record.withdrawn_at:
                    raise LimitationError(
                        f"{limitation_id}: already withdrawn at {record.withdrawn_at}"
                    )
                record = replace(
                    record, withdrawn_at=_now(), withdrawn_by=actor, withdraw_reason=reason
                )
                entries[index] = record.to_json()
                write_json(root / LIMITATIONS_FILE, data)
                break
        else:
            raise KeyError(limitation_id)
    AuditLog(root / "audit.jsonl").append(
        "limitation_withdrawn", actor, id=limitation_id, reason=reason
    )
    return record


def _matches(pattern: str, path: str) -> bool:
    if path == pattern or fnmatch.fnmatchcase(path, pattern):
        return True
    return path.startswith(pattern) and path[len(pattern)] in ".["


def covering(limitations: list[Limitation], subsystem: str, path: str) -> str | None:
    """The id of the first limitation covering (subsystem, path), or None."""
    for record in limitations:
        if record.subsystem == subsystem and _matches(record.path, path):
            return record.id
    return None


def accept_covered(
    differences: dict[str, list[Difference]], limitations: list[Limitation]
) -> dict[str, list[JSONObject]]:
    """Move the differences a limitation covers out of `differences` (in place).

    They are returned per subsystem, each with the covering limitation's id:
    still shown (status' `accepted`), never drift needing action.
    """
    accepted: dict[str, list[JSONObject]] = {}
    if not limitations:
        return accepted
    for name, diffs in differences.items():
        kept: list[Difference] = []
        for diff in diffs:
            limitation = covering(limitations, name, diff.path)
            if limitation is None:
                kept.append(diff)
            else:
                accepted.setdefault(name, []).append(diff.to_json() | {"limitation": limitation})
        differences[name] = kept
    return accepted
