"""The audit log on ordinary bad data: long lines, torn tails, stray bytes, truncation."""

from __future__ import annotations

import base64
import errno
import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

import trueup.journal.audit as audit_module
from trueup.journal.audit import AuditLog


def _log(tmp_path: Path, n: int = 3) -> AuditLog:
    log = AuditLog(tmp_path / "audit.jsonl")
    for i in range(n):
        log.append("apply", "tester", version=i)
    return log


def _forget_cache() -> None:
    """What a new process sees: no cached head."""
    getattr(AuditLog, "_heads", {}).clear()


def _events(log: AuditLog) -> list[str]:
    return [str(r.get("event")) for r in log.records()]


def test_a_line_over_64k_does_not_break_the_next_append(tmp_path: Path) -> None:
    log = _log(tmp_path, 1)
    log.append("drift_healed", "startup", paths=["x" * 1024 * 1024])
    _forget_cache()
    record = log.append("apply", "tester", version=2)
    assert record["seq"] == 3
    assert log.verify() == []
    assert [r["seq"] for r in log.tail(max_bytes=4 * 1024 * 1024)] == [1, 2, 3]
    assert [r["seq"] for r in log.tail(max_bytes=1024)] == [3]


@pytest.mark.parametrize(
    "torn",
    [
        b'{"seq":4,"at":"2024',  # no newline
        b"garbage that is not json\n",  # a whole line, but no record
        b'{"seq":4,"event":"x\xff\xfe',  # not even UTF-8, no newline
        b"\x00\x00\x00\x00\x00\x00",  # zeros a crash left behind
    ],
)
def test_a_torn_last_line_is_moved_out_and_recorded(tmp_path: Path, torn: bytes) -> None:
    log = _log(tmp_path)
    path = tmp_path / "audit.jsonl"
    good = path.read_bytes()
    with path.open("ab") as handle:
        handle.write(torn)

    assert len(log.records()) == 4  # no exception
    assert [r["seq"] for r in log.tail()] == [1, 2, 3]
    problems = log.verify()
    assert [p.line for p in problems] == [4]

    record = log.append("apply", "tester", version=9)
    assert record["seq"] == 5
    assert _events(log) == ["apply", "apply", "apply", "audit_repaired", "apply"]
    repaired = log.records()[3]
    assert repaired["prev"] == json.loads(good.splitlines()[-1])["hash"]
    assert repaired["details"]["bytes"] == len(torn)
    assert repaired["details"]["offset"] == len(good)
    assert repaired["details"]["sidecar"] == str(tmp_path / "audit.torn")
    sidecar = [json.loads(x) for x in (tmp_path / "audit.torn").read_text().splitlines()]
    assert len(sidecar) == 1
    assert base64.b64decode(sidecar[0]["base64"]) == torn
    assert sidecar[0]["offset"] == len(good)
    assert path.read_bytes().startswith(good) and torn not in path.read_bytes()
    assert log.verify() == []


def test_a_line_that_is_not_utf8_is_reported_never_raised(tmp_path: Path) -> None:
    log = _log(tmp_path, 5)
    path = tmp_path / "audit.jsonl"
    lines = path.read_bytes().splitlines()
    lines[1] = lines[1].replace(b'"tester"', b'"test\xffr"')
    lines[3] = lines[3].replace(b'"apply"', b'"apply",}')
    path.write_bytes(b"\n".join(lines) + b"\n")
    records = log.records()
    assert len(records) == 5 and "unparseable" in records[1] and "unparseable" in records[3]
    assert [r["seq"] for r in log.tail()] == [1, 3, 5]
    problems = log.verify()
    assert [(p.line, p.problem) for p in problems[:2]] == [
        (2, "not valid UTF-8 (edited)"),
        (4, "not valid JSON (edited)"),
    ]
    assert log.append("apply", "tester")["seq"] == 6  # the chain goes on from the last line


def test_lines_that_are_json_but_no_record_do_not_crash_verify(tmp_path: Path) -> None:
    log = _log(tmp_path, 2)
    with (tmp_path / "audit.jsonl").open("a") as handle:
        handle.write('5\n{"seq": "x", "hash": 1}\n')
    problems = log.verify()
    assert [p.line for p in problems] == [3, 4]


def test_truncation_is_seen_and_survives_the_next_append(tmp_path: Path) -> None:
    log = _log(tmp_path, 5)
    path = tmp_path / "audit.jsonl"
    head = json.loads((tmp_path / "audit.head").read_text())
    assert head["seq"] == 5 and head["size"] == path.stat().st_size
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:3]) + "\n")
    problems = log.verify()
    assert [str(p) for p in problems] == [
        "audit.jsonl line 4: audit.jsonl ends at seq 3 but its anchor (audit.head) records "
        "seq 5: lines were removed from the end (truncated)"
    ]
    log.append("apply", "tester", version=9)
    assert _events(log)[3:] == ["audit_anchor_mismatch", "apply"]
    problems = log.verify()
    assert [p.line for p in problems] == [4]
    assert "truncated" in problems[0].problem and "seq 5" in problems[0].problem


@pytest.mark.parametrize("how", ["empty", "missing"])
def test_an_emptied_log_is_seen(tmp_path: Path, how: str) -> None:
    log = _log(tmp_path, 3)
    path = tmp_path / "audit.jsonl"
    if how == "empty":
        path.write_bytes(b"")
    else:
        path.unlink()
    problems = log.verify()
    assert len(problems) == 1 and "emptied" in problems[0].problem, problems
    assert f"is {how}" in problems[0].problem
    log.append("apply", "tester")
    assert _events(log) == ["audit_anchor_mismatch", "apply"]
    assert "emptied" in log.verify()[0].problem


def test_a_rewritten_end_is_seen(tmp_path: Path) -> None:
    log = _log(tmp_path, 3)
    path = tmp_path / "audit.jsonl"
    lines = path.read_text().splitlines()
    forged = json.loads(lines[2])
    forged["details"] = {"version": 99}
    forged["hash"] = audit_module._hash(forged)
    lines[2] = json.dumps(forged)
    path.write_text("\n".join(lines) + "\n")
    problems = log.verify()
    assert [p.line for p in problems] == [3] and "rewritten" in problems[0].problem


def test_a_missing_anchor_is_fine_and_written_by_the_next_append(tmp_path: Path) -> None:
    log = _log(tmp_path, 3)
    (tmp_path / "audit.head").unlink()
    assert log.verify() == []
    _forget_cache()
    log.append("apply", "tester")
    assert json.loads((tmp_path / "audit.head").read_text())["seq"] == 4
    assert log.verify() == []


def test_an_invalid_anchor_is_reported(tmp_path: Path) -> None:
    log = _log(tmp_path, 2)
    (tmp_path / "audit.head").write_text("{not json")
    problems = log.verify()
    assert len(problems) == 1 and "anchor (audit.head) is not valid" in problems[0].problem


@pytest.mark.parametrize("left", [b"", b"\x00" * 60])
def test_an_anchor_a_crash_left_empty_counts_as_missing(tmp_path: Path, left: bytes) -> None:
    log = _log(tmp_path, 2)
    (tmp_path / "audit.head").write_bytes(left)  # written without fsync, then a crash
    assert log.verify() == []
    _forget_cache()
    log.append("apply", "tester")
    assert _events(log) == ["apply"] * 3
    assert json.loads((tmp_path / "audit.head").read_text())["seq"] == 3


def test_a_lagging_anchor_is_accepted(tmp_path: Path) -> None:
    log = _log(tmp_path, 3)
    anchor = (tmp_path / "audit.head").read_text()
    log.append("apply", "tester")
    log.append("apply", "tester")
    (tmp_path / "audit.head").write_text(anchor)  # as if a crash came before the anchor
    assert log.verify() == []
    _forget_cache()
    log.append("apply", "tester")
    assert _events(log).count("audit_anchor_mismatch") == 0
    assert log.verify() == []


def test_a_full_disk_for_the_anchor_does_not_fail_the_append(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _log(tmp_path, 2)

    def full(path: Path, value: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, f"{path}: No space left on device")

    monkeypatch.setattr(audit_module, "write_json", full)
    assert log.append("apply", "tester")["seq"] == 3
    monkeypatch.undo()
    assert json.loads((tmp_path / "audit.head").read_text())["seq"] == 2
    assert log.verify() == []
    log.append("apply", "tester")
    assert json.loads((tmp_path / "audit.head").read_text())["seq"] == 4
    assert log.verify() == []
    assert [n for n in os.listdir(tmp_path) if "tmp" in n] == []


def test_a_failed_append_leaves_no_partial_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _log(tmp_path, 2)
    path = tmp_path / "audit.jsonl"
    before = path.read_bytes()
    real_write = os.write
    calls = 0

    def half_then_full(fd: int, data: Any) -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            return real_write(fd, bytes(data[:10]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(OSError, match=f"{path}: No space left on device"):
        log.append("apply", "tester")
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert log.verify() == []
    assert log.append("apply", "tester")["seq"] == 3
    assert log.verify() == []


def test_bad_details_change_nothing(tmp_path: Path) -> None:
    log = _log(tmp_path, 1)
    path = tmp_path / "audit.jsonl"
    with path.open("ab") as handle:
        handle.write(b'{"seq":2,"at')
    before = path.read_bytes()
    with pytest.raises(TypeError):
        log.append("apply", "tester", thing=object())
    assert path.read_bytes() == before
    assert not (tmp_path / "audit.torn").exists()


def test_a_normal_append_reads_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = _log(tmp_path, 2)
    scans = 0
    reads = 0
    real_scan, real_pread = audit_module._scan_tail, os.pread

    def counting_scan(fd: int, size: int) -> Any:
        nonlocal scans
        scans += 1
        return real_scan(fd, size)

    def counting_pread(fd: int, length: int, offset: int) -> bytes:
        nonlocal reads
        reads += 1
        return real_pread(fd, length, offset)

    monkeypatch.setattr(audit_module, "_scan_tail", counting_scan)
    monkeypatch.setattr(os, "pread", counting_pread)
    for _ in range(5):
        AuditLog(tmp_path / "audit.jsonl").append("apply", "tester")
    assert (scans, reads) == (0, 0)
    with (tmp_path / "audit.jsonl").open("ab") as handle:  # another writer was here
        handle.write(b"x")
    log.append("apply", "tester")
    assert scans == 1
    monkeypatch.undo()
    assert log.verify() == []


def test_concurrent_appends_from_threads_and_processes_chain(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    AuditLog(path).append("start")

    def writer(n: int) -> None:
        for i in range(20):
            AuditLog(path).append("apply", f"t{n}", i=i)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    pid = os.fork()
    if pid == 0:  # another process, its own cache
        try:
            writer(99)
        finally:
            os._exit(0)
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    os.waitpid(pid, 0)
    log = AuditLog(path)
    assert log.verify() == []
    assert len(log.records()) == 1 + 20 * 5
