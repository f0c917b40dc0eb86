"""A broken state directory, over a FakeNetlink: damage named, writes refused, management kept.

Also the agent lock (one agent per state directory) and the console's
management override (`trueup management set`): laid over the applied
revision, guarded, cleared by a revision that carries it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.routers import REPO, base_document
from trueup.journal.agentlock import AgentRunning, agent_holder, take_agent_lock
from trueup.journal.confirm import read_pending, write_pending
from trueup.journal.damage import StateCheck
from trueup.journal.override import (
    OVERRIDE_FILE,
    ManagementOverride,
    read_override,
    write_override,
)
from trueup.journal.state import StateDir
from trueup.model.document import parse_document
from trueup.model.reasons import ReasonCode
from trueup.reconcile.changes import DamagedState, NeedsConfirmation
from trueup.reconcile.engine import Engine
from trueup.reconcile.engine.converge import converge_management
from trueup.reconcile.status import gather
from trueup.startup.orchestrator import Orchestrator
from trueup.startup.sources import management_source
from trueup.system.fake import FakeNetlink

LAN = [{"name": "lan0", "mtu": 1300, "addresses": ["203.0.113.1/24", "2001:db8:1::1/64"]}]


@pytest.fixture
def kernel() -> FakeNetlink:
    return FakeNetlink({"mgmt0": 1500, "lan0": 1500})


@pytest.fixture
def engine(tmp_path: Path, kernel: FakeNetlink) -> Engine:
    state = StateDir(tmp_path / "state")
    state.ensure()
    engine = Engine(state, netlink_factory=lambda: kernel)
    engine.apply_document(parse_document(base_document()))
    engine.apply_document(parse_document(base_document(interfaces=LAN)))
    return engine


def _garble(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] + b"\xff}{" + data[len(data) // 2 :])


def _flush_management(kernel: FakeNetlink) -> None:
    kernel.addrs = [a for a in kernel.addrs if a.ifname != "mgmt0"]
    kernel.route_table = []


# -- the agent lock -------------------------------------------------------------------
HOLD = """
import sys, time
from pathlib import Path
from trueup.journal.agentlock import take_agent_lock
take_agent_lock(Path(sys.argv[1]), run_dir=Path(sys.argv[2]))
print("locked", flush=True)
time.sleep(60)
"""


def _holder(root: Path, run_dir: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(root), str(run_dir)],
        stdout=subprocess.PIPE,
        text=True,
        env={"PYTHONPATH": str(REPO)},
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    return proc


@pytest.mark.parametrize("where", ["state directory", "cannot be created"])
def test_a_second_agent_is_refused_with_the_first_ones_pid(tmp_path: Path, where: str) -> None:
    run_dir = tmp_path / "run"
    root = tmp_path / "state"
    if where == "cannot be created":
        (tmp_path / "file").write_text("")
        root = tmp_path / "file" / "state"  # under a regular file: never a directory
    holder = _holder(root, run_dir)
    try:
        with pytest.raises(AgentRunning) as refused:
            take_agent_lock(root, run_dir=run_dir)
        assert refused.value.pid == holder.pid
        assert str(refused.value) == (
            f"another agent (pid {holder.pid}) runs on {root}; it keeps its socket and port"
        )
    finally:
        holder.kill()
        holder.wait()
    lock = take_agent_lock(root, run_dir=run_dir)  # the first one is gone
    try:
        assert take_agent_lock(root, run_dir=run_dir) is lock  # the same process: the same lock
        if where == "state directory":
            record = json.loads((root / "agent.pid").read_text())
            assert record["pid"] == lock.pid and record["started_at"]
            found = agent_holder(root, run_dir=run_dir)
            assert found is not None and found.to_json() == record
            # Nothing held open for writing: the file system can be remounted read-only.
            for fd in os.listdir("/proc/self/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/self/fd/{fd}").startswith(str(root)):
                        assert fcntl.fcntl(int(fd), fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY
        else:
            assert lock.notes and str(run_dir) in lock.notes[0]
    finally:
        lock.release()


# -- damage: named, and what it blocks ----------------------------------------------
PENDING = {
    "state": "pending",
    "version": 2,
    "confirmed_version": 1,
    "deadline": 4102444800.0,
    "deadline_at": "2100-01-01T00:00:00Z",
    "actor": "test",
    "created_at": "2026-01-01T00:00:00Z",
}
OVERRIDE = {
    "interface": "mgmt0",
    "addresses": ["198.51.100.3/24"],
    "gateway": "198.51.100.1",
    "set_at": "2026-01-01T00:00:00Z",
    "actor": "console:0",
    "reason": "test",
    "writer_lock": "held",
}
VALID = {
    "control-plane.json": {"url": "http://cp.invalid"},
    "pending-confirm.json": PENDING,
    "reconcile.json": {"subsystems": {}, "acks": {}},
    "management-override.json": OVERRIDE,
    "api-tokens.json": [],
}


@pytest.mark.parametrize(
    ("name", "blocks"),
    [
        ("state.json", "writes"),
        ("applied.json", "writes"),
        ("revisions/00000002.json", "writes"),
        ("revisions/00000001.json", "none"),
        ("control-plane.json", "writes"),
        ("pending-confirm.json", "writes"),
        ("reconcile.json", "heals"),
        ("management.json", "none"),
        ("management-override.json", "none"),
        ("journal.jsonl", "none"),
        ("api-tokens.json", "none"),
    ],
)
def test_each_damaged_file_is_named_with_what_it_blocks(
    engine: Engine, name: str, blocks: str
) -> None:
    root = engine.state.root
    path = root / name
    if not path.exists():
        path.write_text(json.dumps(VALID[name]))
    backup = path.read_bytes()
    _garble(path)
    check = StateCheck(engine.state)
    damaged = {d.path: d for d in check.damaged(deep=True)}
    assert str(path) in damaged, damaged
    assert damaged[str(path)].blocks == blocks
    # A repair (restored from a backup) is seen at once.
    path.write_bytes(backup)
    assert str(path) not in {d.path for d in check.damaged()}


def test_a_damaged_file_refuses_writes_naming_it_and_status_still_answers(
    engine: Engine, kernel: FakeNetlink
) -> None:
    applied = engine.state.root / "applied.json"
    _garble(applied)
    calls = len(kernel.calls)
    journal = (engine.state.root / "journal.jsonl").read_bytes()
    with pytest.raises(DamagedState) as refused:
        engine.apply_document(parse_document(base_document()))
    assert refused.value.code is ReasonCode.VERSION_SKEW
    assert str(applied) in str(refused.value) and "nothing was changed" in str(refused.value)
    with pytest.raises(DamagedState):
        engine.recover()
    assert len(kernel.calls) == calls
    assert (engine.state.root / "journal.jsonl").read_bytes() == journal
    assert applied.read_bytes().count(b"\xff") == 1  # left as evidence
    status = gather(engine)
    assert status["state_directory"]["writes_refused"] is True
    assert [d["path"] for d in status["state_directory"]["damaged"]] == [str(applied)]
    finding = next(f for f in status["reason_codes"] if str(applied) in f["detail"])
    assert finding["code"] == ReasonCode.VERSION_SKEW.value
    assert "move it aside" in finding["action"]


def test_a_damaged_pending_confirmation_is_read_from_the_journal(engine: Engine) -> None:
    record = {**PENDING, "deadline": time.time() - 1, "deadline_at": "2020-01-01T00:00:00Z"}
    write_pending(engine.state, record)
    _garble(engine.state.root / "pending-confirm.json")
    assert read_pending(engine.state) == record
    # Expired: management comes up as it was last confirmed.
    found = management_source(engine.state)
    assert found.kind == "revision" and found.source == "revision 1 (last confirmed)"


def test_journal_lines_that_are_no_records_are_reported_and_ignored(engine: Engine) -> None:
    journal = engine.state.journal
    count = len(journal.transactions())
    lines = len(journal.path.read_bytes().splitlines())
    with journal.path.open("ab") as handle:
        handle.write(b'{"not": "a record"}\n{"txn": "\xc3\x28"}\n{"txn": "x", "type": "be')
    assert len(journal.transactions()) == count
    problems = journal.problems()
    assert [p.split(":")[0] for p in problems] == [f"line {lines + n}" for n in (1, 2, 3)]
    assert "no txn or type" in problems[0] and "UTF-8" in problems[1]
    assert "incomplete" in problems[2]


# -- phase 0 and 1 over broken state --------------------------------------------------
@pytest.mark.parametrize(
    ("broken", "source"),
    [
        ((), "management.json (revision 2)"),
        (("applied.json",), "management.json (revision 2)"),
        (("management.json",), "revision 2"),
        (("management.json", "applied.json"), "revision 2"),
        (("management.json", "revisions/00000002.json"), "revision 1 (the newest accepted"),
    ],
)
def test_phase_1_brings_management_up_from_the_first_readable_source(
    engine: Engine, kernel: FakeNetlink, broken: tuple[str, ...], source: str
) -> None:
    for name in broken:
        _garble(engine.state.root / name)
    _flush_management(kernel)
    orchestrator = Orchestrator(engine)
    orchestrator.load()
    assert orchestrator.management() is True
    assert orchestrator.management_from.source.startswith(source)
    assert "198.51.100.2/24" in [a.prefix for a in kernel.addrs if a.ifname == "mgmt0"]
    damaged = {d.file for d in engine.check.damaged()}
    assert {Path(name).name for name in broken} <= damaged
    assert orchestrator.phases["load"].state == "done"


def test_a_damaged_file_is_logged_with_what_it_blocks_in_words(
    engine: Engine, kernel: FakeNetlink, caplog: pytest.LogCaptureFixture
) -> None:
    _garble(engine.state.root / "applied.json")
    caplog.set_level(logging.ERROR, logger="trueup.startup")
    Orchestrator(engine).load()
    (line,) = [r.getMessage() for r in caplog.records if "damaged state" in r.getMessage()]
    assert "applied.json" in line and "are refused until it is repaired" in line, line
    assert not line.endswith(("(none)", "(writes)", "(heals)")), line


def test_a_read_only_audit_log_never_fails_phase_1(
    engine: Engine, kernel: FakeNetlink, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError(30, "Read-only file system")

    _flush_management(kernel)
    orchestrator = Orchestrator(engine)
    orchestrator.load()
    monkeypatch.setattr(type(engine.state.audit), "append", refuse)
    assert orchestrator.management() is True
    assert "not audited" in orchestrator.phases["management"].detail


def test_phase_1_falls_back_to_the_installer_document(tmp_path: Path, kernel: FakeNetlink) -> None:
    state = StateDir(tmp_path / "state")
    state.ensure()
    engine = Engine(state, netlink_factory=lambda: kernel)
    fallback = tmp_path / "fallback.json"
    fallback.write_text(json.dumps(base_document()))
    orchestrator = Orchestrator(engine, fallback_path=str(fallback))
    orchestrator.load()
    assert orchestrator.management() is True
    assert orchestrator.management_from.kind == "fallback"


# -- the console override ---------------------------------------------------------------
def _override(state: StateDir) -> None:
    write_override(state.root, ManagementOverride.from_json(OVERRIDE))


def test_management_set_converges_the_management_tier_alone(
    engine: Engine, kernel: FakeNetlink
) -> None:
    kernel.add_address("mgmt0", "192.0.2.9/24")  # not trueup's: never removed
    previous = engine.applied_document()
    lan = sorted(a.prefix for a in kernel.addrs if a.ifname == "lan0")
    document = parse_document(
        base_document(
            management={
                "interface": "mgmt0",
                "addresses": ["198.51.100.3/24"],
                "gateway": "198.51.100.1",
            }
        )
    )
    steps = converge_management(engine, document, previous, actor="console", audit=False).steps
    assert [s.action for s in steps][:1] == ["add-address"]  # make before break
    mgmt = sorted(a.prefix for a in kernel.addrs if a.ifname == "mgmt0")
    assert mgmt == ["192.0.2.9/24", "198.51.100.3/24"]
    assert sorted(a.prefix for a in kernel.addrs if a.ifname == "lan0") == lan


def test_an_override_is_laid_over_the_revision_guarded_and_cleared(
    engine: Engine, kernel: FakeNetlink
) -> None:
    revision = engine.applied_document()
    _override(engine.state)
    document = engine.applied_document()
    assert document is not None
    assert document.spec.management.addresses == ["198.51.100.3/24"]
    assert document.spec.interfaces[0].mtu == 1300  # the rest of the revision stays
    converge_management(
        engine, document, revision, actor="console", audit=False
    )  # what `trueup management set` does
    # Lost again: a heal converges management to the override, not the revision.
    _flush_management(kernel)
    engine.apply_document(document, kind="reconcile", origin="reconcile")
    assert [a.prefix for a in kernel.addrs if a.ifname == "mgmt0"] == ["198.51.100.3/24"]
    status = gather(engine)
    assert status["management"]["override"]["in_effect"] is True
    skew = [f for f in status["reason_codes"] if f["subsystem"] == "management"]
    assert [f["code"] for f in skew] == [ReasonCode.VERSION_SKEW.value]
    # A revision without the override's facts would take the address away.
    with pytest.raises(NeedsConfirmation):
        engine.apply_document(parse_document(base_document(interfaces=LAN, routes=[])))
    carries = base_document(interfaces=LAN, routes=[])
    carries["spec"]["management"]["addresses"] = ["198.51.100.3/24"]
    result = engine.apply_document(parse_document(carries))
    assert result.ok
    assert read_override(engine.state.root) is None
    assert not (engine.state.root / OVERRIDE_FILE).exists()
    events = [r["event"] for r in engine.state.audit.records()]
    assert "management_override_cleared" in events
    assert gather(engine)["management"]["override"] is None


def test_phase_1_brings_the_override_up_first(engine: Engine, kernel: FakeNetlink) -> None:
    _override(engine.state)
    _flush_management(kernel)
    orchestrator = Orchestrator(engine)
    orchestrator.load()
    assert orchestrator.management() is True
    assert orchestrator.management_from.kind == "override"
    assert orchestrator.management_from.base == "management.json (revision 2)"
    assert [a.prefix for a in kernel.addrs if a.ifname == "mgmt0"] == ["198.51.100.3/24"]


# -- a link, a directory or a FIFO where a state or run file belongs ------------------------
UNSAFE = [
    ("applied.json", "writes"),
    ("state.json", "writes"),
    ("pending-confirm.json", "writes"),
    ("journal.jsonl", "writes"),
    ("audit.jsonl", "writes"),
    ("lock", "writes"),
    ("reconcile.json", "heals"),
    ("management.json", "none"),
    ("agent.pid", "none"),
    ("agent.log", "none"),
    ("audit.head", "none"),
    ("fences/dhcp.json", "none"),
    ("secrets/wg-key", "none"),
    ("run/kea-dhcp4/kea-dhcp4.pid", "none"),
    ("run/kea-dhcp4/kea-leases4.csv", "none"),
]


def _put(path: Path, kind: str, victim: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        path.unlink()
    if kind == "symlink":
        path.symlink_to(victim)
    elif kind == "directory":
        path.mkdir()
    else:
        os.mkfifo(path)


@pytest.mark.parametrize("kind", ["symlink", "directory", "fifo"])
@pytest.mark.parametrize(("name", "blocks"), UNSAFE)
def test_anything_but_a_file_of_ours_is_named_and_status_still_answers(
    engine: Engine, tmp_path: Path, name: str, blocks: str, kind: str
) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"host file\n")
    path = engine.state.root / name
    _put(path, kind, victim)
    damaged = {d.path: d for d in StateCheck(engine.state).damaged(deep=True)}
    assert str(path) in damaged, sorted(damaged)
    expected = {"symlink": "symbolic link", "directory": "a directory", "fifo": "a FIFO"}[kind]
    assert expected in damaged[str(path)].problem
    assert damaged[str(path)].blocks == blocks
    status = gather(engine)  # never raises: the API answers it
    assert str(path) in [d["path"] for d in status["state_directory"]["damaged"]]
    assert status["state_directory"]["writes_refused"] is (blocks == "writes")
    if blocks == "writes":
        with pytest.raises(DamagedState):
            engine.apply_document(parse_document(base_document()))
    assert victim.read_bytes() == b"host file\n"
    # Moved aside, it drops out at once.
    if kind == "directory":
        path.rmdir()
    else:
        path.unlink()
    assert str(path) not in {d.path for d in StateCheck(engine.state).damaged()}
