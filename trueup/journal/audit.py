"""The append-only, hash-chained audit log (`audit.jsonl`).

Each line holds its sequence number, the previous line's hash and its own
hash over the canonical JSON of everything else; `verify()` names the first
line that was edited, removed, inserted or reordered.

Two files sit beside the log:

`audit.head`
    The anchor: `{"seq", "hash", "size"}` of the last line, rewritten
    atomically (rename, no fsync: the line itself is durable) after every
    append; an anchor a crash left empty counts as none. It makes lines removed from the end (or an
    emptied log) visible to `verify()`. It may lag the log (a crash or a full
    disk between the append and the anchor): verify accepts an anchor whose
    seq is behind the log as long as its hash matches the line at that seq.
    When an append finds the log behind its anchor, it records an
    `audit_anchor_mismatch` event before its own, so the evidence outlives the
    new anchor; `verify()` reports every such event.
`audit.torn`
    Bytes moved out of the log by a repair: a last line torn by a crash (no
    newline, or not a valid record). One JSON line per repair (offset, bytes,
    sha256, the text and the exact bytes in base64); the log itself records
    an `audit_repaired` event chained from the last good line.

Appends are serialised per path by a thread lock and across processes by
`flock` on the log. The position of the chain's head is cached per process,
validated by the file's inode, size and mtime, so a normal append reads
nothing; otherwise the tail is read backwards, only as far as the last line.

Why this module is over 400 lines: appending, the anchor, torn-tail repair
and verification read and write the same file under the same locks; split,
the invariants between them would be spread over several modules.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import logging
import os
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from trueup.journal.atomic import (
    UnsafeFile,
    append_line,
    fsync_dir,
    path_error,
    read_state_bytes,
    write_all,
    write_json,
)
from trueup.journal.auditrecord import (
    AnchorMismatch,
    AuditDetails,
    AuditRecord,
    UnparseableLine,
    UnsignedAuditRecord,
)
from trueup.model.digests import canonical_json, sha256_hex
from trueup.system.safefile import open_file

__all__ = [
    "AuditDetails",
    "AuditLog",
    "AuditProblem",
    "AuditRecord",
    "UnparseableLine",
    "now_iso",
]

log = logging.getLogger("trueup.journal")

GENESIS = "0" * 64
_CHUNK = 64 * 1024

REPAIRED = "audit_repaired"
ANCHOR_MISMATCH = "audit_anchor_mismatch"


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _hash(record: UnsignedAuditRecord) -> str:
    body = {k: v for k, v in record.items() if k != "hash"}
    blob = canonical_json(body)
    return sha256_hex(blob)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class AuditProblem:
    line: int
    problem: str

    def __str__(self) -> str:
        return f"audit.jsonl line {self.line}: {self.problem}"


@dataclass(frozen=True)
class _Head:
    """Where the chain ends, and the file state that proves it is still so."""

    seq: int
    hash: str
    size: int
    inode: int
    mtime_ns: int


@dataclass(frozen=True)
class _Line:
    number: int
    raw: bytes
    record: AuditRecord | None
    problem: str | None


@dataclass(frozen=True)
class _Tail:
    seq: int
    hash: str
    torn_offset: int | None  # where bytes that are no whole record start
    torn: bytes


def _parse_line(raw: bytes) -> tuple[AuditRecord | None, str | None]:
    """The line's record (a JSON object, its fields unchecked: `verify` checks them), or why
    it is none."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None, "not valid UTF-8 (edited)"
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None, "not valid JSON (edited)"
    if not isinstance(value, dict):
        return None, "not an audit record (edited)"
    return cast("AuditRecord", value), None


def _chain_link(raw: bytes) -> tuple[int, str] | None:
    """(seq, hash) of a line that is a whole record, else None."""
    record, _ = _parse_line(raw)
    if record is None or not _is_int(record.get("seq")) or not isinstance(record.get("hash"), str):
        return None
    return int(record["seq"]), str(record["hash"])


def _pread_exact(fd: int, length: int, offset: int) -> bytes:
    parts: list[bytes] = []
    while length > 0:
        part = os.pread(fd, length, offset)
        if not part:
            break
        parts.append(part)
        length -= len(part)
        offset += len(part)
    return b"".join(parts)


def _last_newline(fd: int, end: int) -> int:
    """Offset of the last newline before `end`, or -1: read backwards, a chunk at a time."""
    pos = end
    while pos > 0:
        start = max(0, pos - _CHUNK)
        at = _pread_exact(fd, pos - start, start).rfind(b"\n")
        if at >= 0:
            return start + at
        pos = start
    return -1


def _scan_tail(fd: int, size: int) -> _Tail:
    """The chain's head, read backwards from the end only as far as needed.

    Bytes after the last newline, or a last line that is not a whole record,
    are torn (a crash in the middle of a write). Lines before that which are
    not records are left where they are (verify reports them); the chain goes
    on from the last whole record.
    """
    if size == 0:
        return _Tail(0, GENESIS, None, b"")
    newline = _last_newline(fd, size)
    torn_offset: int | None = None
    if newline != size - 1:
        torn_offset = newline + 1
    end = newline + 1  # just past the last newline
    while end > 0:
        start = _last_newline(fd, end - 1) + 1
        link = _chain_link(_pread_exact(fd, end - 1 - start, start))
        if link is not None:
            break
        if torn_offset is None:
            torn_offset = start  # a last line that is no record: torn too
        end = start
    else:
        link = None
    seq, head = link if link is not None else (0, GENESIS)
    torn = b"" if torn_offset is None else _pread_exact(fd, size - torn_offset, torn_offset)
    return _Tail(seq, head, torn_offset, torn)


def _anchor_link(value: Any) -> tuple[int, str] | None:
    if (
        isinstance(value, dict)
        and _is_int(value.get("seq"))
        and isinstance(value.get("hash"), str)
        and value["seq"] >= 0
    ):
        return int(value["seq"]), str(value["hash"])
    return None


def _mismatch_text(details: Any) -> str:
    details = details if isinstance(details, dict) else {}
    reason = details.get("reason", "?")
    anchor, found = details.get("anchor_seq"), details.get("found_seq")
    if reason in ("truncated", "emptied"):
        what = "lines were removed from the end (truncated)"
        if reason == "emptied":
            what = "the log was emptied"
        return (
            f"before this line the log ended at seq {found} but its anchor (audit.head) "
            f"recorded seq {anchor}: {what}"
        )
    if reason == "rewritten":
        return (
            f"before this line the log's last line (seq {found}) did not match its anchor "
            "(audit.head): the end of the log was rewritten"
        )
    return (
        f"before this line the anchor (audit.head) was not valid (edited): {details.get('error')}"
    )


class AuditLog:
    _locks: dict[Path, threading.Lock] = {}
    _heads: dict[Path, _Head] = {}

    def __init__(self, path: Path) -> None:
        self.path = path
        self._key = path.resolve()
        self._lock = self._locks.setdefault(self._key, threading.Lock())

    @property
    def head_path(self) -> Path:
        """The anchor: seq, hash and size of the last line (`audit.head`)."""
        return self.path.with_suffix(".head")

    @property
    def torn_path(self) -> Path:
        """Where a repair moves torn bytes (`audit.torn`)."""
        return self.path.with_suffix(".torn")

    # -- append -----------------------------------------------------------
    def append(self, event: str, actor: str = "local", **details: Any) -> AuditRecord:
        with self._lock:
            try:
                fd = open_file(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND)
            except UnsafeFile:
                raise
            except OSError as exc:
                raise path_error(self.path, exc) from exc
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                return self._append_locked(fd, event, actor, details)
            except BaseException:
                self._heads.pop(self._key, None)
                raise
            finally:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _append_locked(self, fd: int, event: str, actor: str, details: AuditDetails) -> AuditRecord:
        stat = os.fstat(fd)
        head = self._heads.get(self._key)
        events: list[tuple[str, str, AuditDetails]] = []
        tail: _Tail | None = None
        if head is not None and (head.inode, head.size, head.mtime_ns) == (
            stat.st_ino,
            stat.st_size,
            stat.st_mtime_ns,
        ):
            seq, prev, size = head.seq, head.hash, stat.st_size
        else:
            tail = _scan_tail(fd, stat.st_size)
            seq, prev, size = tail.seq, tail.hash, stat.st_size
            if tail.torn_offset is not None:
                size = tail.torn_offset
                events.append(
                    (
                        REPAIRED,
                        "audit",
                        {
                            "bytes": len(tail.torn),
                            "offset": tail.torn_offset,
                            "sha256": sha256_hex(tail.torn),
                            "sidecar": str(self.torn_path),
                        },
                    )
                )
            mismatch = self._anchor_mismatch(seq, prev)
            if mismatch is not None:
                events.append((ANCHOR_MISMATCH, "audit", dict(mismatch)))
        events.append((event, actor, details))

        # Serialise everything first: bad details change nothing on disk.
        lines: list[bytes] = []
        records: list[AuditRecord] = []
        for name, who, fields in events:
            unsigned: UnsignedAuditRecord = {
                "seq": seq + 1,
                "at": now_iso(),
                "event": name,
                "actor": who,
                "details": fields,
                "prev": prev,
            }
            record: AuditRecord = {**unsigned, "hash": _hash(unsigned)}
            records.append(record)
            lines.append(json.dumps(record, sort_keys=True, separators=(",", ":")).encode())
            seq, prev = record["seq"], record["hash"]
        data = b"\n".join(lines) + b"\n"

        if tail is not None and tail.torn_offset is not None:
            self._move_torn(fd, tail.torn_offset, tail.torn)
        try:
            write_all(fd, data)
            os.fsync(fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)  # no partial line stays behind
            raise path_error(self.path, exc) from exc
        if size == 0:
            fsync_dir(self.path.parent)
        stat = os.fstat(fd)
        self._heads[self._key] = _Head(seq, prev, stat.st_size, stat.st_ino, stat.st_mtime_ns)
        self._write_anchor(seq, prev, stat.st_size)
        return records[-1]

    def _move_torn(self, fd: int, offset: int, torn: bytes) -> None:
        """Keep the torn bytes in the sidecar (durably), then cut them off the log."""
        entry = {
            "at": now_iso(),
            "file": str(self.path),
            "offset": offset,
            "bytes": len(torn),
            "sha256": sha256_hex(torn),
            "text": torn.decode("utf-8", errors="replace"),
            "base64": base64.b64encode(torn).decode("ascii"),
        }
        append_line(self.torn_path, json.dumps(entry, sort_keys=True, separators=(",", ":")))
        try:
            os.ftruncate(fd, offset)
            os.fsync(fd)
        except OSError as exc:
            raise path_error(self.path, exc) from exc
        log.warning(
            "%s: moved %d torn byte(s) at offset %d to %s",
            self.path,
            len(torn),
            offset,
            self.torn_path,
        )

    def _load_anchor(self) -> tuple[tuple[int, str] | None, str | None]:
        """The anchor's (seq, hash), or why it is not valid; (None, None) when there is none.

        An anchor that is empty or zeros is none: written without fsync, that is
        what a crash right after an append can leave.
        """
        try:
            data = read_state_bytes(self.head_path)
        except ValueError as exc:  # not a regular file of ours
            return None, str(exc)
        except OSError as exc:
            return None, f"{self.head_path}: {exc.strerror}"
        if data is None:
            return None, None  # older state directories have none yet
        if not data.strip(b"\x00 \t\r\n"):
            return None, None
        try:
            link = _anchor_link(json.loads(data))
        except ValueError:
            return None, f"{self.head_path}: not valid JSON"
        if link is None:
            return None, f"{self.head_path}: no seq and hash"
        return link, None

    def _anchor_mismatch(self, seq: int, head: str) -> AnchorMismatch | None:
        """Why the log's head contradicts its anchor, or None when it does not."""
        found: AnchorMismatch = {"found_seq": seq, "found_hash": head}
        link, error = self._load_anchor()
        if error is not None:
            if not self.head_path.is_file():
                log.warning("cannot read the audit anchor: %s", error)
                return None
            return {"reason": "anchor invalid", "error": error, **found}
        if link is None:
            return None
        anchor_seq, anchor_hash = link
        if anchor_seq > seq:
            reason = "emptied" if seq == 0 else "truncated"
        elif anchor_seq == seq and anchor_hash != head:
            reason = "rewritten"
        else:
            return None  # in step, or lagging behind (a crash or a full disk)
        return {"reason": reason, "anchor_seq": anchor_seq, "anchor_hash": anchor_hash, **found}

    def _write_anchor(self, seq: int, head: str, size: int) -> None:
        try:
            # No fsync: the line itself is durable already, and an anchor that
            # lags (or is empty after a crash) is accepted; rename keeps it whole.
            write_json(self.head_path, {"seq": seq, "hash": head, "size": size}, durable=False)
        except OSError as exc:
            # The line is durable; an anchor that lags is accepted by verify().
            log.warning("%s: the anchor lags behind seq %d: %s", self.head_path, seq, exc)

    # -- read ---------------------------------------------------------------
    def tail(self, max_bytes: int = 256 * 1024) -> list[AuditRecord]:
        """The last records (whole lines within the last `max_bytes`), oldest first."""
        try:
            fd = open_file(self.path, os.O_RDONLY)
        except (FileNotFoundError, UnsafeFile):
            return []  # an unsafe log is reported by verify() and trueup.journal.damage
        try:
            size = os.fstat(fd).st_size
            start = max(0, size - max_bytes)
            if start > 0:  # one byte more: is the first line whole?
                chunk = _pread_exact(fd, size - start + 1, start - 1)
                chunk = chunk[chunk.find(b"\n") + 1 :] if b"\n" in chunk else b""
            else:
                chunk = _pread_exact(fd, size, 0)
        finally:
            os.close(fd)
        out = []
        for raw in chunk.split(b"\n")[:-1]:  # the last piece is empty or torn
            record, _ = _parse_line(raw)
            if record is not None:
                out.append(record)
        return out

    def _read(self) -> tuple[bytes | None, tuple[int, str] | None, str | None]:
        """The log's bytes (None when missing), its anchor and why the anchor is invalid.

        Read under a shared flock, so no append is half-way through. Raises
        `UnsafeFile` when the log is not a regular file of ours.
        """
        try:
            fd = open_file(self.path, os.O_RDONLY)
        except FileNotFoundError:
            fd = -1
        try:
            if fd >= 0:
                fcntl.flock(fd, fcntl.LOCK_SH)
            anchor, anchor_error = self._load_anchor()
            data = _pread_exact(fd, os.fstat(fd).st_size, 0) if fd >= 0 else None
            return data, anchor, anchor_error
        finally:
            if fd >= 0:
                os.close(fd)

    @staticmethod
    def _lines(data: bytes) -> list[_Line]:
        pieces = data.split(b"\n")
        torn = pieces.pop()  # empty when the log ends with a newline
        out = []
        for number, raw in enumerate(pieces, start=1):
            record, problem = _parse_line(raw)
            out.append(_Line(number, raw, record, problem))
        if torn:
            out.append(
                _Line(
                    len(pieces) + 1,
                    torn,
                    None,
                    f"incomplete last line ({len(torn)} bytes, no newline): a write torn by a "
                    "crash; the next append moves it to audit.torn",
                )
            )
        return out

    def records(self) -> list[AuditRecord | UnparseableLine]:
        """Every line, oldest first; a line that is no record is `{"unparseable": text}`."""
        try:
            data, _, _ = self._read()
        except UnsafeFile:
            return []
        if data is None:
            return []
        return [
            line.record
            if line.record is not None
            else {"unparseable": line.raw.decode("utf-8", errors="replace")}
            for line in self._lines(data)
        ]

    def verify(self) -> list[AuditProblem]:
        """Every line whose chain breaks; the first names where tampering starts."""
        try:
            data, anchor, anchor_error = self._read()
        except UnsafeFile as exc:
            return [AuditProblem(0, exc.problem)]
        lines = self._lines(data or b"")
        problems: list[AuditProblem] = []
        prev = GENESIS
        expected_seq = 1
        last_seq = 0
        hashes: dict[int, tuple[int, str]] = {}
        for line in lines:
            number, record = line.number, line.record
            if record is None:
                problems.append(AuditProblem(number, line.problem or "not a record (edited)"))
                prev, expected_seq = "?", expected_seq + 1
                continue
            seq = record.get("seq")
            if record.get("hash") != _hash(record):
                problems.append(AuditProblem(number, "content does not match its hash (edited)"))
            elif seq != expected_seq or not _is_int(seq):
                problems.append(
                    AuditProblem(
                        number,
                        f"sequence {seq} where {expected_seq} was expected "
                        "(a line was removed, inserted or reordered)",
                    )
                )
            elif record.get("prev") != prev and prev != "?":
                problems.append(
                    AuditProblem(number, "does not chain to the line before (removed or reordered)")
                )
            elif record.get("event") == ANCHOR_MISMATCH:
                problems.append(AuditProblem(number, _mismatch_text(record.get("details"))))
            prev = str(record.get("hash"))
            if isinstance(seq, int) and not isinstance(seq, bool):
                last_seq, expected_seq = seq, seq + 1
                hashes[seq] = (number, prev)
            else:
                expected_seq += 1
        after = len(lines) + 1
        if anchor_error is not None:
            problems.append(
                AuditProblem(
                    after, f"its anchor (audit.head) is not valid (edited): {anchor_error}"
                )
            )
        elif anchor is not None:
            anchor_seq, anchor_hash = anchor
            if anchor_seq > last_seq and not lines:
                state = "missing" if data is None else "empty"
                problems.append(
                    AuditProblem(
                        1,
                        f"audit.jsonl is {state} but its anchor (audit.head) records seq "
                        f"{anchor_seq}: the log was emptied",
                    )
                )
            elif anchor_seq > last_seq:
                problems.append(
                    AuditProblem(
                        after,
                        f"audit.jsonl ends at seq {last_seq} but its anchor (audit.head) records "
                        f"seq {anchor_seq}: lines were removed from the end (truncated)",
                    )
                )
            elif anchor_seq in hashes and hashes[anchor_seq][1] != anchor_hash:
                problems.append(
                    AuditProblem(
                        hashes[anchor_seq][0],
                        f"seq {anchor_seq} differs from its anchor (audit.head): the log was "
                        "rewritten from here",
                    )
                )
        return problems
