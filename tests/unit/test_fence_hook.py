"""The DHCP fence behind one subsystem hook: `follow_fence`, found through the registry.

The CLI (`trueup dhcp fence hold|lift`) and the restore (`fence_kea`,
`assert_allocator`) both call it; neither imports the DHCP subsystem's internals.
"""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path
from typing import Any

import pytest

import trueup.subsystems.dhcp.allocator as allocator
from trueup.subsystems.dhcp.keaconfig import has_fence
from trueup.subsystems.dhcp.subsystem import DhcpSubsystem
from trueup.subsystems.registry import fence_follower
from trueup.system.fence import hold_fence
from trueup.system.kea import KeaError
from trueup.system.pidrecord import proc_start_time

ROOT = Path(__file__).resolve().parents[2]
CONFIG = {"Dhcp4": {"subnet4": [], "interfaces-config": {"interfaces": ["lan0"]}}}


def _run_dir(state_dir: Path, family: int = 4) -> Path:
    run = state_dir / "run" / f"kea-dhcp{family}"
    run.mkdir(parents=True)
    (run / f"kea-dhcp{family}.conf").write_text(json.dumps(CONFIG))
    return run


def _config(run: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((run / "kea-dhcp4.conf").read_text())
    return loaded


def test_the_dhcp_subsystem_follows_the_dhcp_fence() -> None:
    assert isinstance(fence_follower("dhcp"), DhcpSubsystem)
    with pytest.raises(LookupError, match="no subsystem follows the 'vpn' fence"):
        fence_follower("vpn")


def test_the_file_kea_starts_from_follows_the_record_without_a_running_kea(
    tmp_path: Path,
) -> None:
    run = _run_dir(tmp_path)
    hook = fence_follower("dhcp")
    assert hook.follow_fence(tmp_path) == []  # no Kea runs: nothing told
    assert not has_fence(_config(run))
    hold_fence(tmp_path, "dhcp", "restore", "full restore running")
    assert hook.follow_fence(tmp_path) == []
    assert has_fence(_config(run))
    assert (run / "kea-dhcp4.conf").stat().st_mode & 0o777 == 0o600
    # `fenced` overrides the record (the restore enforces before it records).
    assert hook.follow_fence(tmp_path, fenced=False) == []
    assert not has_fence(_config(run))


def _running_kea(run: Path) -> int:
    """A pid record naming this very process, as the supervisor writes it."""
    pid = os.getpid()
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
    record = {"pid": pid, "argv": [a.decode() for a in argv], "start_time": proc_start_time(pid)}
    (run / "kea-dhcp4.pid").write_text(json.dumps(record))
    return pid


def test_a_running_kea_is_told_and_what_it_did_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _run_dir(tmp_path)
    _running_kea(run)
    told: list[bool | None] = []

    def enforce(paths: Any, state_dir: Path, pid: int, **kw: Any) -> str:
        told.append(kw["fenced"])
        return "disabled" if kw["fenced"] else "enabled"

    monkeypatch.setattr(allocator, "enforce", enforce)
    followed = fence_follower("dhcp").follow_fence(tmp_path, fenced=True)
    assert [(f.daemon, f.state, f.problem) for f in followed] == [("kea-dhcp4", "disabled", "")]
    assert told == [True]


def test_a_kea_that_does_not_take_the_fence_is_reported_or_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _run_dir(tmp_path)
    pid = _running_kea(run)

    def enforce(paths: Any, state_dir: Path, pid: int, **kw: Any) -> str:
        raise KeaError("config-set refused")

    monkeypatch.setattr(allocator, "enforce", enforce)
    hook = fence_follower("dhcp")
    (followed,) = hook.follow_fence(tmp_path)
    assert (followed.state, followed.problem, followed.ended) == ("", "config-set refused", False)
    with pytest.raises(KeaError, match=rf"kea-dhcp4 \(pid {pid}\) did not take the fence"):
        hook.follow_fence(tmp_path, fenced=True, end_hung=True)  # not hung: never ended


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_the_cli_and_the_backup_import_no_subsystem_internals() -> None:
    files = [ROOT / "trueup/cli/dhcp.py", *sorted((ROOT / "trueup/backup").glob("*.py"))]
    inside = {
        str(path.relative_to(ROOT)): sorted(
            name
            for name in _imports(path)
            if name.startswith("trueup.subsystems") and name != "trueup.subsystems.registry"
        )
        for path in files
    }
    assert {path: names for path, names in inside.items() if names} == {}
