"""No state or run file is opened through a link, or used unless it is a regular file of ours.

A victim file outside the directory (standing for /etc/shadow) is linked in
place of a state file; whatever the agent does with that name, the victim's
bytes and mode stay as they were, and the refusal names the path.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

import pytest

from trueup.journal.agentlock import take_agent_lock
from trueup.journal.atomic import StateFileError, append_line, read_json, write_json
from trueup.journal.audit import AuditLog
from trueup.journal.journal import Journal
from trueup.journal.lock import LockError, WriterLock
from trueup.journal.management import (
    management_facts,
    read_management,
    write_management,
)
from trueup.system.atomicfile import write_atomic
from trueup.system.daemon import DaemonSupervisor
from trueup.system.daemonspec import DaemonError, DaemonSpec
from trueup.system.fence import read_fence
from trueup.system.safefile import (
    UnsafeFile,
    ensure_dir,
    open_file,
    read_file,
    unsafe_entries,
)
from trueup.system.secretstore import SecretError, read_secret


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "outside" / "shadow"
    path.parent.mkdir()
    path.write_bytes(b"root:$6$secret:19000:0:99999:7:::\n")
    path.chmod(0o640)
    return path


def fingerprint(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return hashlib.sha256(path.read_bytes()).hexdigest(), st.st_size, st.st_mode


@pytest.fixture
def state(tmp_path: Path) -> Path:
    root = tmp_path / "state"
    root.mkdir(mode=0o700)
    return root


def link(state: Path, name: str, victim: Path) -> Path:
    path = state / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(victim)
    return path


# -- the primitives ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "flags",
    [
        os.O_RDONLY,
        os.O_WRONLY | os.O_APPEND | os.O_CREAT,
        os.O_RDWR | os.O_CREAT,
        os.O_WRONLY | os.O_TRUNC,
    ],
    ids=["read", "append", "lock", "truncate"],
)
def test_a_link_is_refused_whatever_the_open(state: Path, victim: Path, flags: int) -> None:
    before = fingerprint(victim)
    path = link(state, "agent.pid", victim)
    with pytest.raises(UnsafeFile) as refused:
        open_file(path, flags)
    assert str(path) in str(refused.value) and "symbolic link" in str(refused.value)
    assert str(victim) in refused.value.problem
    assert fingerprint(victim) == before


def test_a_directory_a_fifo_and_a_hard_link_are_refused(state: Path, victim: Path) -> None:
    (state / "applied.json").mkdir()
    with pytest.raises(UnsafeFile, match="a directory, not a regular file"):
        read_file(state / "applied.json")
    fifo = state / "agent.log"
    os.mkfifo(fifo)
    done: list[BaseException] = []

    def open_it() -> None:
        try:
            open_file(fifo, os.O_RDONLY)
        except BaseException as exc:
            done.append(exc)

    opener = threading.Thread(target=open_it, daemon=True)
    opener.start()
    opener.join(30)  # never blocks: O_NONBLOCK
    assert not opener.is_alive()
    assert isinstance(done[0], UnsafeFile) and "a FIFO" in str(done[0])
    with pytest.raises(UnsafeFile, match="FIFO"):
        open_file(fifo, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    # A second name of a host file: readable, but never written or truncated.
    hard = state / "journal.jsonl"
    os.link(victim, hard)
    before = fingerprint(victim)
    with pytest.raises(UnsafeFile, match="2 hard links"):
        open_file(hard, os.O_WRONLY | os.O_TRUNC)
    assert fingerprint(victim) == before


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file away")
def test_a_file_of_another_user_is_refused(state: Path) -> None:
    path = state / "lock"
    path.write_text("{}")
    os.chown(path, 65534, 65534)
    with pytest.raises(UnsafeFile, match="owned by uid 65534"):
        open_file(path, os.O_RDWR)
    assert unsafe_entries(state) == [(str(path), "owned by uid 65534, not by the agent (uid 0)")]


def test_ensure_dir_refuses_a_link_at_either_level(state: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (state / "run").symlink_to(elsewhere)
    with pytest.raises(UnsafeFile, match="symbolic link"):
        ensure_dir(state / "run" / "kea-dhcp4", levels=2)
    assert list(elsewhere.iterdir()) == []
    (state / "fences").write_text("")
    with pytest.raises(UnsafeFile, match="a regular file, not a directory"):
        ensure_dir(state / "fences")
    assert ensure_dir(state / "secrets").is_dir()


def test_an_atomic_write_never_replaces_or_follows_a_link(state: Path, victim: Path) -> None:
    before = fingerprint(victim)
    path = link(state, "applied.json", victim)
    with pytest.raises(UnsafeFile):
        write_atomic(path, b"{}")
    assert path.is_symlink() and fingerprint(victim) == before  # left as evidence
    # A temp file name planted as a link is not followed either.
    target = state / "reconcile.json"
    link(state, f".reconcile.json.tmp-{os.getpid()}", victim)
    write_json(target, {"ok": True})
    assert read_json(target) == {"ok": True}
    assert fingerprint(victim) == before
    (state / "state.json").mkdir()
    with pytest.raises(UnsafeFile, match="directory"):
        write_json(state / "state.json", {})


# -- the state files ---------------------------------------------------------------------
def test_a_linked_or_directory_state_file_reads_as_damaged(state: Path, victim: Path) -> None:
    victim.write_text('{"version": 99}')
    path = link(state, "applied.json", victim)
    with pytest.raises(StateFileError) as refused:
        read_json(path)
    assert refused.value.path == str(path) and "symbolic link" in refused.value.problem
    (state / "pending-confirm.json").mkdir()
    with pytest.raises(StateFileError, match="a directory"):
        read_json(state / "pending-confirm.json")


def test_the_journal_and_audit_log_refuse_a_link_and_say_so(state: Path, victim: Path) -> None:
    before = fingerprint(victim)
    journal = Journal(link(state, "journal.jsonl", victim))
    assert journal.records() == []
    assert "symbolic link" in journal.problems()[0]
    with pytest.raises(UnsafeFile):
        journal.begin(kind="apply")
    with pytest.raises(UnsafeFile):
        append_line(state / "journal.jsonl", "{}")
    audit = AuditLog(link(state, "audit.jsonl", victim))
    with pytest.raises(UnsafeFile):
        audit.append("applied")
    assert audit.tail() == [] and audit.records() == []
    assert "symbolic link" in str(audit.verify()[0])
    assert fingerprint(victim) == before


def test_the_writer_lock_is_never_taken_through_a_link(state: Path, victim: Path) -> None:
    before = fingerprint(victim)
    path = link(state, "lock", victim)
    with pytest.raises(LockError) as refused, WriterLock(path, "apply"):
        pass
    assert str(path) in str(refused.value) and "symbolic link" in str(refused.value)
    assert fingerprint(victim) == before


def test_the_agent_lock_records_its_pid_elsewhere_when_agent_pid_is_a_link(
    state: Path, victim: Path, tmp_path: Path
) -> None:
    before = fingerprint(victim)
    link(state, "agent.pid", victim)
    run_dir = tmp_path / "run-trueup"
    lock = take_agent_lock(state, run_dir=run_dir)
    try:
        assert lock.held and lock.record is not None and lock.record.parent == run_dir
        assert json.loads(lock.record.read_text())["pid"] == os.getpid()
        assert any("symbolic link" in note for note in lock.notes), lock.notes
    finally:
        lock.release()
    assert fingerprint(victim) == before


def test_fences_and_secrets_are_never_read_through_a_link(state: Path, victim: Path) -> None:
    victim.write_text(json.dumps({"owner": "x", "reason": "y", "since": "z"}))
    link(state, "fences/dhcp.json", victim)
    fence = read_fence(state, "dhcp")
    assert fence is not None and fence.owner == "unknown"  # fail closed: held
    assert "symbolic link" in fence.reason
    link(state, "secrets/wg-key", victim)
    with pytest.raises(SecretError, match="symbolic link"):
        read_secret(state, "wg-key")


def test_a_daemon_is_not_started_while_its_directory_holds_a_link(
    tmp_path: Path, victim: Path
) -> None:
    before = fingerprint(victim)
    run = tmp_path / "run"
    link(run, "sleeper/sleeper.kea.pid", victim)
    supervisor = DaemonSupervisor(run)
    try:
        with pytest.raises(DaemonError) as refused:
            supervisor.ensure(DaemonSpec("sleeper", ("/bin/sleep", "3600")))
        assert "sleeper.kea.pid" in str(refused.value) and "symbolic link" in str(refused.value)
        assert not supervisor.status("sleeper").running
    finally:
        supervisor.close()
    assert fingerprint(victim) == before


# -- management.json of any size trueup writes ---------------------------------------------
def test_a_large_management_record_is_read_back(state: Path) -> None:
    addresses = [f"2001:db8:{i // 65536:x}:{i % 65536:x}::1/64" for i in range(6000)]
    facts = management_facts(
        {"interface": "mgmt0", "addresses": addresses, "api": {"port": 7443}},
        version=3,
        digest="sha256:" + "0" * 64,
    )
    write_management(state, facts)
    assert (state / "management.json").stat().st_size > 64 * 1024
    read = read_management(state)
    assert read is not None and read["addresses"] == addresses


def test_a_management_record_over_the_read_limit_is_refused_at_write(
    state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same bound for both: whatever is written is read back.
    monkeypatch.setattr("trueup.journal.management._MAX_BYTES", 4096)
    addresses = [f"2001:db8::{i:x}/64" for i in range(400)]
    facts = management_facts(
        {"interface": "mgmt0", "addresses": addresses, "api": {"port": 7443}},
        version=3,
        digest=None,
    )
    with pytest.raises(ValueError, match=r"over the 4096 bytes the fast path reads back"):
        write_management(state, facts)
    assert not (state / "management.json").exists()
    write_management(state, {**facts, "addresses": addresses[:20]})
    assert read_management(state) is not None


def test_a_daemons_control_socket_is_no_damage(tmp_path: Path) -> None:
    import socket

    directory = tmp_path / "run" / "haproxy"
    directory.mkdir(parents=True)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(directory / "master.sock"))
        assert unsafe_entries(tmp_path / "run") == []
        os.mkfifo(directory / "fifo")
        assert [p for p, _ in unsafe_entries(tmp_path / "run")] == [str(directory / "fifo")]
