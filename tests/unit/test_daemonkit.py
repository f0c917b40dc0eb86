"""The daemon-subsystem kit: run records, the daemon's own check, ensure-or-reload, and every
run-directory read and write through `sources.files` (so the fakes see it)."""

from __future__ import annotations

import ast
import errno
import signal
from pathlib import Path
from typing import TypedDict

import pytest

from trueup.model.health import SubsystemHealth
from trueup.subsystems.base import Step, StepError
from trueup.subsystems.daemonkit import (
    RunRecord,
    check,
    ensure_or_reload,
    failed_daemon,
    read_json,
    read_text,
    step_failures,
    write_file,
)
from trueup.system.daemonspec import DaemonError, DaemonSpec, DaemonStatus
from trueup.system.fake import FakeDaemons, FakeFiles, FakeNetlink, FakeRunner
from trueup.system.runner import Completed
from trueup.system.sources import Sources

ROOT = Path(__file__).resolve().parents[2]


class Record(TypedDict, total=False):
    zones: dict[str, list[str]]
    serial: int


def test_a_run_record_is_read_whole_and_updated_in_one_private_write(tmp_path: Path) -> None:
    files = FakeFiles()
    path = tmp_path / "run" / "knot" / "trueup-dns.json"
    record: RunRecord[Record] = RunRecord(path)
    assert record.read(files) == {}  # missing: empty

    def add(state: Record) -> None:
        state["serial"] = 2
        state.setdefault("zones", {})["lan.test."] = ["a"]

    assert record.update(files, add) == {"serial": 2, "zones": {"lan.test.": ["a"]}}
    assert path.read_text() == '{"serial": 2, "zones": {"lan.test.": ["a"]}}'
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.parent.stat().st_mode & 0o777 == 0o700
    assert files.private_writes == [path]
    path.write_text("{damaged")
    assert record.read(files) == {}  # damaged: empty, the next write replaces it


def test_a_record_in_insertion_order_keeps_it(tmp_path: Path) -> None:
    files = FakeFiles()
    path = tmp_path / "applied.json"
    RunRecord[Record](path, sort_keys=False, durable=False).write(
        files, {"zones": {"b": [], "a": []}, "serial": 1}
    )
    assert path.read_text() == '{"zones": {"b": [], "a": []}, "serial": 1}'


def test_run_directory_reads_never_follow_a_link(tmp_path: Path) -> None:
    files = FakeFiles()
    secret = tmp_path / "host-file"
    secret.write_text('{"not": "ours"}')
    (tmp_path / "config").symlink_to(secret)
    assert read_text(files, tmp_path / "config") is None
    assert read_json(files, tmp_path / "config") == {}
    assert read_text(files, tmp_path / "missing") is None


def test_a_failing_write_fails_as_the_host_would(tmp_path: Path) -> None:
    files = FakeFiles()
    path = tmp_path / "keepalived.conf"
    files.fail_on[str(path)] = OSError(errno.ENOSPC, f"{path}: no space left")
    with pytest.raises(OSError, match="no space left"):
        write_file(files, path, "x")
    assert not path.exists()


def _sources(tmp_path: Path, runner: FakeRunner) -> Sources:
    return Sources(FakeNetlink({}), files=FakeFiles(), runner=runner, daemons=FakeDaemons(tmp_path))


def test_the_daemons_own_check_changes_nothing_when_it_refuses(tmp_path: Path) -> None:
    candidate = tmp_path / "haproxy.cfg.new"
    argv = ["haproxy", "-c", "-f", str(candidate)]
    refused = Completed(tuple(argv), 1, "", "[ALERT] bad bind\n")
    sources = _sources(tmp_path, FakeRunner({tuple(argv): refused}))
    done = check(sources, candidate, "frontend x\n", argv, keep=True)
    assert done.returncode == 1 and "bad bind" in done.stderr
    assert not candidate.exists()
    assert sources.runner.calls == [tuple(argv)]  # type: ignore[attr-defined]
    accepted = Completed(tuple(argv), 0, "valid\n", "")
    sources = _sources(tmp_path, FakeRunner({tuple(argv): accepted}))
    assert check(sources, candidate, "frontend x\n", argv, keep=True).returncode == 0
    assert candidate.read_text() == "frontend x\n"  # kept: the caller renames it into place
    assert check(sources, candidate, "frontend y\n", argv).returncode == 0
    assert not candidate.exists()  # a scratch copy: removed


def test_ensure_starts_a_stopped_daemon_and_reloads_a_running_one(tmp_path: Path) -> None:
    sources = _sources(tmp_path, FakeRunner())
    daemons = sources.daemons
    assert isinstance(daemons, FakeDaemons)
    spec = DaemonSpec("keepalived", ("keepalived", "-n"))
    order: list[str] = []
    assert ensure_or_reload(sources, spec, signal.SIGHUP, before_reload=lambda: order.append("x"))
    assert daemons.events == [("ensure", "keepalived")] and order == []
    assert not ensure_or_reload(
        sources, spec, signal.SIGHUP, before_reload=lambda: order.append("written")
    )
    assert daemons.events[1:] == [
        ("ensure", "keepalived"),
        (f"signal:{signal.SIGHUP}", "keepalived"),
    ]
    assert order == ["written"]
    daemons.signal = lambda name, sig: False  # type: ignore[method-assign]
    with pytest.raises(DaemonError, match="stopped before it could be reloaded"):
        ensure_or_reload(
            sources, spec, signal.SIGHUP, gone="it stopped before it could be reloaded"
        )


def test_a_steps_failures_name_the_step() -> None:
    step = Step("dns", "start", "spec.dns.running")

    class ControlError(RuntimeError):
        pass

    for error in (DaemonError("knotd exited"), OSError(errno.EACCES, "denied"), ControlError("no")):
        with pytest.raises(StepError, match=r"^dns: start"), step_failures(step, ControlError):
            raise error
    with pytest.raises(ValueError), step_failures(step):
        raise ValueError("unknown step")


def test_a_daemon_that_does_not_run_is_failed_in_its_own_words(tmp_path: Path) -> None:
    class Failed(FakeDaemons):
        def status(self, name: str) -> DaemonStatus:
            return DaemonStatus(name, False, last_error="exited with status 1: bind failed")

    sources = Sources(netlink=FakeNetlink(), daemons=FakeDaemons(tmp_path))
    assert failed_daemon(sources, "knot") is None  # nothing says why: no condition
    sources = Sources(netlink=FakeNetlink(), daemons=Failed(tmp_path))
    assert failed_daemon(sources, "knot") == (
        SubsystemHealth.FAILED,
        "knot is not running: exited with status 1: bind failed",
    )


def _direct_io(path: Path) -> list[str]:
    """Names that read or write files without `sources.files`."""
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in (
            "trueup.system.atomicfile",
            "trueup.system.safefile",
        ):
            found += [f"{node.module}.{a.name}" for a in node.names]
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("read_text", "write_text", "read_bytes", "write_bytes", "unlink")
        ):
            found.append(f"line {node.lineno}: .{node.func.attr}()")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "open"
        ):
            found.append(f"line {node.lineno}: open()")
    return found


@pytest.mark.parametrize("subsystem", ["dhcp", "dns", "ha", "proxy", "wireguard", "routing"])
def test_daemon_subsystems_reach_their_run_directory_only_through_sources_files(
    subsystem: str,
) -> None:
    modules = sorted((ROOT / "trueup" / "subsystems" / subsystem).glob("*.py"))
    found = {str(m.relative_to(ROOT)): _direct_io(m) for m in modules}
    assert {m: names for m, names in found.items() if names} == {}
