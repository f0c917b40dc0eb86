"""Atomic files, the journal, the audit chain, the writer lock."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from trueup.journal.atomic import read_json, write_json
from trueup.journal.audit import AuditLog
from trueup.journal.journal import Journal
from trueup.journal.lock import LockBusy, WriterLock, lock_holder
from trueup.journal.state import StateDir, StateDirError


def test_atomic_write_leaves_no_temp_files(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    write_json(path, {"a": 1})
    write_json(path, {"a": 2})
    assert read_json(path) == {"a": 2}
    assert os.listdir(tmp_path) == ["x.json"]
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_journal_open_transaction_and_torn_tail(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    first = journal.begin(kind="apply", version=1)
    journal.record(first, "commit")
    second = journal.begin(kind="apply", version=2)
    journal.record(second, "applied", subsystem="links")
    with (tmp_path / "journal.jsonl").open("a") as handle:
        handle.write('{"txn": "' + second + '", "type": "comm')  # torn by a crash
    open_txn = journal.open_transaction()
    assert open_txn is not None and open_txn.txn == second
    assert open_txn.summary()["applied"] == ["links"]
    assert journal.last().txn == second  # type: ignore[union-attr]


@pytest.mark.parametrize("tamper", ["edit", "delete", "reorder", "insert"])
def test_audit_verify_names_first_broken_line(tmp_path: Path, tamper: str) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    for n in range(5):
        log.append("apply", "tester", version=n)
    assert log.verify() == []
    lines = (tmp_path / "audit.jsonl").read_text().splitlines()
    if tamper == "edit":
        lines[2] = lines[2].replace('"version":2', '"version":9')
    elif tamper == "delete":
        del lines[2]
    elif tamper == "reorder":
        lines[2], lines[3] = lines[3], lines[2]
    else:
        forged = json.loads(lines[1])
        lines.insert(2, json.dumps(forged))
    (tmp_path / "audit.jsonl").write_text("\n".join(lines) + "\n")
    problems = log.verify()
    assert problems and problems[0].line == 3, problems


def test_writer_lock_refuses_second_writer(tmp_path: Path) -> None:
    path = tmp_path / "lock"
    with WriterLock(path, "apply"):
        assert lock_holder(path) == {"pid": os.getpid(), "purpose": "apply"}
        with pytest.raises(LockBusy), WriterLock(path, "other"):
            pass
    assert lock_holder(path) is None
    with WriterLock(path, "again"):
        pass


def test_state_dir_refuses_newer_schema(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "s")
    state.ensure()
    write_json(tmp_path / "s" / "state.json", {"schema": 99})
    with pytest.raises(StateDirError, match="newer trueup"):
        state.ensure()


def test_tampered_revision_is_detected(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "s")
    state.ensure()
    state.save_revision(1, {"spec": {"a": 1}})
    assert state.tampered_revisions() == []
    record = read_json(tmp_path / "s" / "revisions" / "00000001.json")
    record["document"]["spec"]["a"] = 2
    (tmp_path / "s" / "revisions" / "00000001.json").write_text(json.dumps(record))
    assert state.tampered_revisions() == [str(tmp_path / "s" / "revisions" / "00000001.json")]


def test_compaction_keeps_large_journals_below_the_threshold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import trueup.journal.journal as journal_module

    monkeypatch.setattr(journal_module, "_COMPACT_BYTES", 64 * 1024)
    journal = Journal(tmp_path / "journal.jsonl")
    image = {"firewall": {f"rule[{i}]": "x" * 100 for i in range(150)}}  # ~16 KiB each
    txns = []
    for _ in range(12):
        txn = journal.begin(version=1, before=image)  # type: ignore[call-arg]
        journal.record(txn, "commit")
        txns.append(txn)
    size = (tmp_path / "journal.jsonl").stat().st_size
    # Compacted at a begin to half the threshold, then appended to: bounded, instead of
    # 50 transactions of before-images rewritten on every begin.
    assert size < 2 * 64 * 1024
    kept = [t.txn for t in journal.transactions()]
    assert kept == txns[-len(kept) :] and 2 <= len(kept) < len(txns)
