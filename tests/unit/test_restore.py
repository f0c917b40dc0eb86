"""The restore state machine over fakes at the `system/` seam: states, fence, resume, reboot."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.routers import base_document
from tests.unit.test_backup import LINKS, _lease_rows, _router
from trueup.backup.create import create_backup
from trueup.backup.format import LEASES
from trueup.backup.restore import RestoreRefused, resume, start_restore
from trueup.cli.output import render_status
from trueup.journal.restore import BOOT_ID_ENV, read_record
from trueup.journal.state import StateDir
from trueup.model.document import parse_document
from trueup.reconcile import faults
from trueup.reconcile.engine import Engine
from trueup.reconcile.status import gather
from trueup.system.fake import FakeDaemons, FakeNetlink
from trueup.system.fence import read_fence
from trueup.system.netlink import NetlinkError

ORDER = ["analyzed", "fenced", "staged", "awaiting_restart", "applying", "verifying", "completed"]


class Killed(BaseException):  # a SIGKILL: nothing may catch it as an error
    """Stands for the SIGKILL `TRUEUP_FAULT` sends (the integration tests send the real one)."""


@pytest.fixture
def boot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "boot_id"
    path.write_text("11111111-aaaa\n")
    monkeypatch.setenv(BOOT_ID_ENV, str(path))
    return path


def _engine(state: StateDir, kernel: FakeNetlink) -> Engine:
    return Engine(state, netlink_factory=lambda: kernel, daemons=FakeDaemons(state.root / "run"))


@pytest.fixture
def kernel() -> FakeNetlink:
    return FakeNetlink({"mgmt0": 1500, "lan0": 1500})


@pytest.fixture
def setup(tmp_path: Path, kernel: FakeNetlink, boot: Path) -> tuple[Engine, Path]:
    """A router with an archive of revision 2 (mtu 1300), then a revision 3 (mtu 1400) applied."""
    state = _router(tmp_path / "state", leases=_lease_rows(3))
    archive = tmp_path / "edge-01.tar"
    create_backup(state.root, archive, with_leases=True)
    engine = _engine(state, kernel)
    document = engine.applied_revision()
    assert document is not None
    changed = document.canonical()
    changed["metadata"].pop("version", None)
    changed["spec"]["interfaces"][0]["mtu"] = 1400
    assert engine.apply_document(parse_document(changed)).ok
    (state.root / "run" / "kea-dhcp4" / "kea-leases4.csv").write_text(_lease_rows(1))
    return engine, archive


def _leases(engine: Engine) -> Path:
    return engine.state.root / "run" / "kea-dhcp4" / "kea-leases4.csv"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_config_only_walks_every_state_lifts_the_fence_and_keeps_the_lease_file(
    setup: tuple[Engine, Path], kernel: FakeNetlink
) -> None:
    engine, archive = setup
    before = _sha(_leases(engine))
    record = start_restore(engine, archive, "config-only", {}, LINKS, actor="test")
    assert record["state"] == "completed", record
    assert [h["state"] for h in record["history"]] == ORDER
    assert read_fence(engine.state.root, "dhcp") is None
    assert _sha(_leases(engine)) == before, "config-only never touches the lease file"
    applied = engine.state.applied().to_json()
    assert applied["origin"] == "restore" and applied["version"] == 4
    document = engine.applied_revision()
    assert document is not None
    assert document.canonical()["spec"]["interfaces"][0]["mtu"] == 1300
    events = [
        json.loads(line)["event"] for line in engine.state.audit.path.read_text().splitlines()
    ]
    assert "restore_started" in events and "restore_completed" in events
    assert gather(engine)["restore"]["state"] == "completed"


@pytest.mark.parametrize("killed_at", ORDER)
def test_a_kill_at_every_transition_resumes_to_the_same_end(
    setup: tuple[Engine, Path],
    kernel: FakeNetlink,
    monkeypatch: pytest.MonkeyPatch,
    killed_at: str,
) -> None:
    engine, archive = setup
    real_hit = faults.hit

    def hit(point: str) -> None:
        if point == f"restore:{killed_at}":
            raise Killed(point)
        real_hit(point)

    monkeypatch.setattr(faults, "hit", hit)
    with pytest.raises(Killed):
        start_restore(engine, archive, "full", {}, LINKS, actor="test")
    record = read_record(engine.state.root)
    assert record is not None and record["state"] == killed_at
    if killed_at != "analyzed":  # from fenced to completed (before its lift), the fence holds
        fence = read_fence(engine.state.root, "dhcp")
        assert fence is not None and fence.owner == "restore" and archive.name in fence.reason
    monkeypatch.setattr(faults, "hit", real_hit)
    restarted = _engine(engine.state, kernel)  # the agent, restarted (same boot)
    done = resume(restarted)
    assert done is not None and done["state"] == "completed", done
    if killed_at != "completed":
        assert any(h.get("note") == "resumed (same boot)" for h in done["history"])
    assert read_fence(engine.state.root, "dhcp") is None
    assert _leases(engine).read_text() == _lease_rows(3), "full brings the archived leases back"
    copies = list(_leases(engine).parent.glob("kea-leases4.csv.pre-restore-*"))
    assert [c.read_text() for c in copies] == [_lease_rows(1)], "one dated copy of the old file"
    document = restarted.applied_revision()
    assert document is not None
    assert document.canonical()["spec"]["interfaces"][0]["mtu"] == 1300


def test_reboot_waits_in_awaiting_restart_until_the_boot_id_changes(
    setup: tuple[Engine, Path], kernel: FakeNetlink, boot: Path
) -> None:
    engine, archive = setup
    record = start_restore(engine, archive, "config-only", {}, LINKS, reboot=True)
    assert record["state"] == "awaiting_restart"
    assert "reboot" in record["next"]
    assert resume(_engine(engine.state, kernel))["state"] == "awaiting_restart"  # type: ignore[index]
    assert read_fence(engine.state.root, "dhcp") is not None
    status = gather(engine)["restore"]
    assert status["state"] == "awaiting_restart" and status["pending"] is True
    boot.write_text("22222222-bbbb\n")
    done = resume(_engine(engine.state, kernel))
    assert done is not None and done["state"] == "completed"
    assert any("reboot" in h.get("note", "") for h in done["history"])
    assert read_fence(engine.state.root, "dhcp") is None


def test_a_refused_archive_gets_no_record_and_no_fence(
    tmp_path: Path, setup: tuple[Engine, Path]
) -> None:
    engine, _archive = setup
    plain = tmp_path / "plain.tar"
    create_backup(engine.state.root, plain, with_leases=False)
    with pytest.raises(RestoreRefused, match="holds no leases") as refused:
        start_restore(engine, plain, "full", {}, LINKS)
    assert refused.value.problems and refused.value.problems[0]["entry"].startswith(LEASES)
    assert read_record(engine.state.root) is None
    assert read_fence(engine.state.root, "dhcp") is None


def test_other_interface_names_are_refused_without_map_and_applied_with_it(
    setup: tuple[Engine, Path],
) -> None:
    engine, archive = setup
    here = ["lo", "mgmt0", "eth1"]
    with pytest.raises(RestoreRefused, match="--map lan0=NEW"):
        start_restore(engine, archive, "config-only", {}, here)
    assert read_record(engine.state.root) is None


def test_a_second_restore_is_refused_while_one_is_pending(
    tmp_path: Path, setup: tuple[Engine, Path]
) -> None:
    engine, archive = setup
    start_restore(engine, archive, "config-only", {}, LINKS, reboot=True)
    other = tmp_path / "other.tar"
    other.write_bytes(archive.read_bytes())
    with pytest.raises(RestoreRefused, match="pending"):
        start_restore(engine, other, "config-only", {}, LINKS)


def test_a_failed_transaction_rolls_back_and_lifts_the_fence_only_when_back(
    setup: tuple[Engine, Path], kernel: FakeNetlink
) -> None:
    engine, archive = setup
    before = engine.state.applied().to_json()
    lease_text = _leases(engine).read_text()
    real_set_link = kernel.set_link

    def set_link_once(name: str, *, state: str | None = None, mtu: int | None = None) -> None:
        if mtu == 1300:  # the restored revision's change fails; the way back works
            raise NetlinkError(f"set link {name}", "refused by the fake kernel")
        real_set_link(name, state=state, mtu=mtu)

    kernel.set_link = set_link_once  # type: ignore[method-assign]
    record = start_restore(engine, archive, "full", {}, LINKS)
    assert record["state"] == "rolled_back", record
    assert "transaction" in record["problem"] or "refused" in record["problem"]
    assert engine.state.applied().digest == before["digest"]
    assert _leases(engine).read_text() == lease_text, "the previous lease file is back"
    assert read_fence(engine.state.root, "dhcp") is None
    assert record["fence_held"] is False


def test_an_archive_with_other_interface_names_is_applied_with_map(
    tmp_path: Path, setup: tuple[Engine, Path], kernel: FakeNetlink
) -> None:
    engine, _archive = setup
    other = StateDir(tmp_path / "other")
    other.ensure()
    elsewhere = Engine(other, netlink_factory=lambda: FakeNetlink({"mgmt0": 1500, "eth1": 1500}))
    document = base_document()
    document["spec"]["interfaces"][0]["name"] = "eth1"
    document["spec"]["interfaces"][0]["mtu"] = 1280
    assert elsewhere.apply_document(parse_document(document)).ok
    archive = tmp_path / "other.tar"
    create_backup(other.root, archive, with_leases=False)
    with pytest.raises(RestoreRefused, match="eth1"):
        start_restore(engine, archive, "config-only", {}, LINKS)
    assert read_record(engine.state.root) is None
    record = start_restore(engine, archive, "config-only", {"eth1": "lan0"}, LINKS)
    assert record["state"] == "completed", record
    applied = engine.applied_revision()
    assert applied is not None
    assert applied.canonical()["spec"]["interfaces"][0] == {
        **applied.canonical()["spec"]["interfaces"][0],
        "name": "lan0",
        "mtu": 1280,
    }
    assert kernel.link_state["lan0"].mtu == 1280


def test_the_management_guard_holds_a_restore_that_would_take_management_away(
    tmp_path: Path, setup: tuple[Engine, Path], kernel: FakeNetlink
) -> None:
    engine, _archive = setup
    other = StateDir(tmp_path / "moved")
    other.ensure()
    moved = Engine(other, netlink_factory=lambda: FakeNetlink({"mgmt0": 1500, "lan0": 1500}))
    document = base_document()
    document["spec"]["management"]["addresses"] = ["192.0.2.9/24"]
    document["spec"]["management"].pop("gateway", None)
    document["spec"]["routes"] = []
    assert moved.apply_document(parse_document(document), management_confirmed=True).ok
    archive = tmp_path / "moved.tar"
    create_backup(other.root, archive, with_leases=False)
    before = engine.state.applied().to_json()
    record = start_restore(engine, archive, "config-only", {}, LINKS)
    assert record["state"] == "rolled_back", record
    assert "management" in record["problem"]
    assert engine.state.applied().digest == before["digest"]
    assert "198.51.100.2/24" in {a.prefix for a in kernel.addrs if a.ifname == "mgmt0"}
    assert read_fence(engine.state.root, "dhcp") is None, "back at the previous revision"
    assert "previous revision" in record["next"]


def test_an_archive_changed_before_staging_stops_with_the_fence_held_until_put_back(
    setup: tuple[Engine, Path], kernel: FakeNetlink, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, archive = setup
    real_hit = faults.hit

    def hit(point: str) -> None:
        if point == "restore:analyzed":
            raise Killed(point)
        real_hit(point)

    monkeypatch.setattr(faults, "hit", hit)
    with pytest.raises(Killed):
        start_restore(engine, archive, "config-only", {}, LINKS)
    monkeypatch.setattr(faults, "hit", real_hit)
    original = archive.read_bytes()
    archive.write_bytes(original[:-1024])
    with pytest.raises(RestoreRefused, match="changed or vanished"):
        resume(_engine(engine.state, kernel))
    record = read_record(engine.state.root)
    assert record is not None and record["state"] == "fenced" and record["problem"]
    assert read_fence(engine.state.root, "dhcp") is not None
    shown = render_status(gather(engine))
    assert "restore:     fenced" in shown and "changed or vanished" in shown
    archive.write_bytes(original)
    done = resume(_engine(engine.state, kernel))
    assert done is not None and done["state"] == "completed" and "problem" not in done
    assert read_fence(engine.state.root, "dhcp") is None


def test_a_busy_writer_is_a_refusal_with_a_next_step_and_the_restore_resumes(
    setup: tuple[Engine, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer holding the device past the wait is a 409 with its next step, never a
    500: the record keeps its state, and `restore apply` again finishes it."""
    import threading

    from trueup.backup import restore

    engine, archive = setup
    monkeypatch.setattr(restore, "WRITER_WAIT", 0.2)
    taken, release = threading.Event(), threading.Event()

    def hold() -> None:
        with engine.state.writer_lock("apply", 0.0):
            taken.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert taken.wait(120)
        with pytest.raises(RestoreRefused, match="retries it by itself") as refused:
            start_restore(engine, archive, "config-only", {}, LINKS, actor="test")
        assert "writer" in str(refused.value) and "trueup restore apply" in str(refused.value)
        pending = read_record(engine.state.root)
        # Never `applying` with nothing applying it: the writer is taken before it is written.
        assert pending is not None and pending["state"] == "awaiting_restart", pending
        assert "writer" in pending["problem"]
        assert read_fence(engine.state.root, "dhcp") is not None
    finally:
        release.set()
        holder.join()
    record = start_restore(engine, archive, "config-only", {}, LINKS, actor="test")
    assert record["state"] == "completed", record
    assert read_fence(engine.state.root, "dhcp") is None


def test_missing_links_are_waited_for_reported_and_the_restore_goes_on_when_they_appear(
    setup: tuple[Engine, Path], kernel: FakeNetlink
) -> None:
    engine, archive = setup
    lan0 = kernel.link_state.pop("lan0")  # a link that comes late after a boot
    before = engine.state.applied().to_json()
    record = start_restore(engine, archive, "config-only", {}, LINKS, link_wait=0.0)
    assert record["state"] == "awaiting_restart", record
    assert record["waiting"]["links"] == ["lan0"] and record["waiting"]["since"]
    assert "waiting for links lan0 (since" in record["problem"]
    assert "waiting for links lan0" in record["next"]
    status = gather(engine)["restore"]
    assert status["pending"] is True and status["waiting"]["links"] == ["lan0"]
    assert "waiting for links lan0" in render_status(gather(engine))
    assert engine.state.applied().digest == before["digest"], "nothing applied meanwhile"
    assert read_fence(engine.state.root, "dhcp") is not None
    again = resume(_engine(engine.state, kernel), link_wait=0.0)  # still missing: still waiting
    assert again is not None and again["state"] == "awaiting_restart"
    assert again["waiting"]["since"] == record["waiting"]["since"], "the wait keeps its start"
    kernel.link_state["lan0"] = lan0
    done = resume(_engine(engine.state, kernel), link_wait=0.0)
    assert done is not None and done["state"] == "completed", done
    assert "waiting" not in done and "problem" not in done
    assert [h["state"] for h in done["history"] if "at" in h] == ORDER
    assert read_fence(engine.state.root, "dhcp") is None


def test_links_that_never_appear_end_the_wait_rolled_back_with_the_fence_lifted(
    setup: tuple[Engine, Path], kernel: FakeNetlink, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trueup.backup import restore

    engine, archive = setup
    monkeypatch.setattr(restore, "LINK_WAIT", 0.3)
    del kernel.link_state["lan0"]
    before = engine.state.applied().to_json()
    record = start_restore(engine, archive, "config-only", {}, LINKS, link_wait=5.0)
    assert record["state"] == "rolled_back", record
    assert "lan0 did not appear within 0.3 s" in record["problem"]
    assert engine.state.applied().digest == before["digest"]
    assert read_fence(engine.state.root, "dhcp") is None, "nothing was applied: the fence goes"
    assert record["fence_held"] is False


def test_a_rollback_that_keeps_the_fence_names_the_command_that_lifts_it() -> None:
    from trueup.journal.restore import next_step

    shown = next_step({"state": "rolled_back", "fence_held": True, "id": "abc"})
    assert "trueup dhcp fence lift --reason 'restore abc rolled back'" in shown


def test_the_fence_is_enforced_on_kea_before_it_is_recorded(
    setup: tuple[Engine, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from trueup.backup import restore

    engine, archive = setup
    seen: list[bool] = []

    def fence_kea(engine: Engine) -> None:
        seen.append(read_fence(engine.state.root, "dhcp") is not None)

    monkeypatch.setattr(restore, "fence_kea", fence_kea)
    record = start_restore(engine, archive, "config-only", {}, LINKS)
    assert record["state"] == "completed"
    assert seen == [False], "Kea is told before the fence record (and `fenced`) is written"


def test_a_kea_that_does_not_take_the_fence_is_a_refusal_without_a_fence_record(
    setup: tuple[Engine, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from trueup.backup import restore
    from trueup.system.kea import KeaError

    engine, archive = setup

    def fence_kea(engine: Engine) -> None:
        raise KeaError("kea-dhcp4 (pid 4242) did not take the fence: no answer")

    monkeypatch.setattr(restore, "fence_kea", fence_kea)
    with pytest.raises(RestoreRefused, match="did not take the fence"):
        start_restore(engine, archive, "config-only", {}, LINKS)
    record = read_record(engine.state.root)
    assert record is not None and record["state"] == "analyzed"
    assert "did not take the fence" in record["problem"] and "by itself" in record["problem"]
    assert read_fence(engine.state.root, "dhcp") is None, "never recorded while Kea may serve"
    monkeypatch.undo()
    done = resume(engine)
    assert done is not None and done["state"] == "completed"


def test_any_failure_of_a_step_is_a_refusal_with_a_next_step_never_an_error(
    setup: tuple[Engine, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from trueup.backup import restore

    engine, archive = setup

    def broken(*_args: object) -> None:
        raise RuntimeError("the staging disk went away")

    monkeypatch.setattr(restore, "_stage", broken)
    with pytest.raises(RestoreRefused, match="staging disk went away"):
        start_restore(engine, archive, "config-only", {}, LINKS)
    record = read_record(engine.state.root)
    assert record is not None and record["state"] == "fenced"
    assert "retries it by itself" in record["problem"]


def test_a_copy_cut_short_inside_its_lease_member_restores_config_only_and_refuses_full(
    setup: tuple[Engine, Path],
) -> None:
    engine, archive = setup
    data = archive.read_bytes()
    archive.write_bytes(data[: data.rfind(b"host1")])
    before = _sha(_leases(engine))
    with pytest.raises(RestoreRefused, match=f"{LEASES}/kea-leases4.csv"):
        start_restore(engine, archive, "full", {}, LINKS)
    assert read_record(engine.state.root) is None
    record = start_restore(engine, archive, "config-only", {}, LINKS)
    assert record["state"] == "completed", record
    assert _sha(_leases(engine)) == before
    document = engine.applied_revision()
    assert document is not None and document.canonical()["spec"]["interfaces"][0]["mtu"] == 1300


class _Agent:
    """What `RestoreKeeper` uses of the agent: its engine, state directory and stop hooks."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.state = engine.state
        self.on_stop: list[object] = []


def test_the_agent_retries_a_refused_restore_by_itself_once_the_writer_is_free(
    setup: tuple[Engine, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading
    import time

    from trueup.agent import restoring
    from trueup.agent.restoring import RestoreKeeper, restore_apply
    from trueup.backup import restore

    engine, archive = setup
    monkeypatch.setattr(restoring, "_links", lambda: LINKS)
    monkeypatch.setattr(restore, "WRITER_WAIT", 0.2)
    monkeypatch.setattr(RestoreKeeper, "FIRST", 0.1)
    agent = _Agent(engine)
    keeper = RestoreKeeper.start_for(agent)  # type: ignore[arg-type]
    taken, release = threading.Event(), threading.Event()

    def hold() -> None:
        with engine.state.writer_lock("apply", 0.0):
            taken.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert taken.wait(120)
        with pytest.raises(RestoreRefused, match="writer"):
            restore_apply(agent, str(archive), "config-only", {}, reboot=False, actor="t")  # type: ignore[arg-type]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # the keeper tries again and records its next try
            record = read_record(engine.state.root)
            if record is not None and record.get("retry"):
                break
            time.sleep(0.02)
        assert record is not None and record["state"] == "awaiting_restart"
        assert record["retry"]["attempts"] >= 1 and "retries by itself" in record["next"]
    finally:
        release.set()
        holder.join()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        record = read_record(engine.state.root)
        if record is not None and record["state"] == "completed":
            break
        time.sleep(0.05)
    keeper.stop()
    assert record is not None and record["state"] == "completed", record
    assert "retry" not in record
    assert read_fence(engine.state.root, "dhcp") is None


def test_the_cli_prints_a_non_json_answer_instead_of_crashing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from trueup.agent import client as agent_client
    from trueup.agent.client import Response
    from trueup.cli.main import app

    class Broken:
        timeout = 30.0

        def request(self, method: str, path: str, **_kwargs: object) -> Response:
            assert (method, path) == ("POST", "/v1/restore/apply")
            return Response(500, {}, b"Internal Server Error")

    monkeypatch.setattr(agent_client.AgentClient, "connect", staticmethod(lambda _d: Broken()))
    state = tmp_path / "state"
    StateDir(state).ensure()
    archive = tmp_path / "edge-01.tar"
    archive.write_bytes(b"")
    result = CliRunner().invoke(
        app,
        ["restore", "apply", str(archive), "--mode", "config-only", "--state-dir", str(state)],
    )
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "HTTP 500" in result.output and "Internal Server Error" in result.output


def test_a_config_only_restore_clears_the_local_override_it_replaces(
    setup: tuple[Engine, Path],
) -> None:
    from trueup.agent.cpclient import report_from_status
    from trueup.reconcile.changes import CONTROL_PLANE_FILE

    engine, archive = setup
    engine.state.write(CONTROL_PLANE_FILE, {"url": "https://cp.invalid", "version": 3})
    document = engine.applied_revision()
    assert document is not None
    changed = document.canonical()
    changed["metadata"].pop("version", None)
    changed["spec"]["interfaces"][0]["mtu"] = 1350
    assert engine.apply_document(parse_document(changed), override="lab test").ok
    assert engine.state.applied().override.reason == "lab test"

    record = start_restore(engine, archive, "config-only", {}, LINKS, actor="test")
    assert record["state"] == "completed", record
    applied = engine.state.applied().to_json()
    assert applied["origin"] == "restore" and applied["override"] is None
    status = gather(engine, control_plane_version=3)
    assert status["versions"]["override"] is None
    assert "local override" not in render_status(status)
    assert report_from_status(status)["override"] is None
