"""State-directory identities: what is one, what is refused, what creates, adopts and binds one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.unit.test_cli_truth import console
from trueup.agent.fastboot import AgentOptions, agent_run_problem, config_device
from trueup.journal.identity import creation_problem, device_mismatch, problem
from trueup.journal.state import StateDir


def _events(root: Path) -> list[str]:
    return [record["event"] for record in StateDir(root).audit.records()]


def test_a_state_directory_is_one_stat_and_anything_else_is_named(tmp_path: Path) -> None:
    state = tmp_path / "state"
    StateDir(state).ensure()
    assert problem(state) is None
    empty = tmp_path / "empty"
    empty.mkdir()
    assert f"{empty} is not a trueup state directory: it is empty" in str(problem(empty))
    parent = tmp_path / "demo-state"
    StateDir(parent / "agent").ensure()
    (parent / "api-token").write_text("x")
    assert "looks like a parent of state directories: it holds agent/" in str(problem(parent))
    assert f"did you mean --state-dir {parent / 'agent'}?" in str(problem(parent))
    other = tmp_path / "home"
    other.mkdir()
    for index in range(7):
        (other / f"file{index}").write_text("")
    said = str(problem(other))
    assert "holds other files, no state.json: file0, file1, file2, file3, file4 and 2 more" in said
    for message in (problem(empty), problem(parent), problem(other)):
        assert "`trueup agent run` and `trueup apply --init` create one" in str(message)
    assert "does not exist" in str(problem(tmp_path / "missing"))


def test_trueup_state_from_before_identities_is_a_state_directory(tmp_path: Path) -> None:
    old = tmp_path / "old"
    old.mkdir()
    (old / "applied.json").write_text(json.dumps({"version": 3}))
    assert problem(old) is None
    assert creation_problem(old) is None


def test_only_a_parent_of_state_directories_or_a_file_cannot_become_one(tmp_path: Path) -> None:
    assert creation_problem(tmp_path / "new") is None
    (tmp_path / "empty").mkdir()
    assert creation_problem(tmp_path / "empty") is None
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "desired.yaml").write_text("")
    assert creation_problem(tmp_path / "docs") is None
    StateDir(tmp_path / "parent" / "agent").ensure()
    assert "looks like a parent" in str(creation_problem(tmp_path / "parent"))
    (tmp_path / "file").write_text("")
    assert "is not a directory" in str(creation_problem(tmp_path / "file"))


def test_creating_records_who_and_binds_the_device_once(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "state")
    state.ensure(created_by="trueup apply --init", device=None)
    identity = state.identity()
    assert identity["device"] is None and identity["created"]["by"] == "trueup apply --init"
    assert {"at", "trueup", "host"} <= set(identity["created"])
    assert _events(state.root) == ["state_dir_created"]
    state.ensure(created_by="trueup agent run", device="edge-01")
    state.ensure(created_by="trueup agent run", device="edge-02")  # never rebound
    assert state.identity()["device"] == "edge-01"
    assert state.identity()["created"]["by"] == "trueup apply --init"
    assert _events(state.root) == ["state_dir_created", "state_dir_device"]
    assert "belongs to device edge-01; the document is for edge-02" in str(
        device_mismatch(state.root, "edge-02")
    )
    assert device_mismatch(state.root, "edge-01") is None


def test_agent_run_adopts_a_state_directory_from_before_identities(tmp_path: Path) -> None:
    root = tmp_path / "state"
    root.mkdir()
    (root / "state.json").write_text(json.dumps({"schema": 1}))
    state = StateDir(root)
    state.ensure()  # any other writer leaves it as it is
    assert "created" not in state.identity()
    state.ensure(created_by="trueup agent run", device="edge-01", actor="agent")
    identity = state.identity()
    assert identity["created"]["adopted"] is True and identity["device"] == "edge-01"
    assert _events(root) == ["state_dir_adopted", "state_dir_device"]


def test_agent_run_refuses_another_devices_document_before_anything(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "state")
    state.ensure(created_by="trueup agent run", device="edge-01")
    yaml_doc = tmp_path / "other.yaml"
    yaml_doc.write_text(yaml.safe_dump({"apiVersion": "trueup/v1", "metadata": {"device": "x"}}))
    json_doc = tmp_path / "other.json"
    json_doc.write_text(json.dumps({"metadata": {"device": "edge-02"}}))
    assert config_device(yaml_doc) == "x" and config_device(json_doc) == "edge-02"
    refused = agent_run_problem(AgentOptions(state_dir=state.root, config=json_doc))
    assert "belongs to device edge-01; the document is for edge-02" in str(refused)
    parent = agent_run_problem(AgentOptions(state_dir=tmp_path, config=json_doc))
    assert "looks like a parent" in str(parent)


@pytest.mark.parametrize(
    "argv",
    [["status"], ["drift"], ["secret", "list"], ["audit", "verify"], ["dhcp", "leases"]],
    ids=" ".join,
)
def test_the_cli_refuses_an_empty_folder_and_writes_nothing(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = console([*argv, "--state-dir", str(tmp_path)], capsys)
    assert code == 1 and out == ""
    assert f"{tmp_path} is not a trueup state directory: it is empty" in err
    assert list(tmp_path.iterdir()) == []


def test_device_names_the_device_every_command_expects(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    StateDir(tmp_path).ensure(created_by="trueup agent run", device="edge-01")
    # Recorded first, so that teardown leaves TRUEUP_DEVICE unset whatever the commands set.
    monkeypatch.setenv("TRUEUP_DEVICE", "")
    monkeypatch.delenv("TRUEUP_DEVICE")
    code, _, err = console(
        ["--device", "edge-02", "secret", "list", "--state-dir", str(tmp_path)], capsys
    )
    assert code == 1
    assert "belongs to device edge-01; --device (TRUEUP_DEVICE) names edge-02" in err
    monkeypatch.delenv("TRUEUP_DEVICE", raising=False)  # the root option sets it for the command
    code, _, err = console(
        ["--device", "edge-01", "secret", "list", "--state-dir", str(tmp_path)], capsys
    )
    assert code == 0, err


def test_the_first_secret_set_is_audited(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    value = tmp_path / "value.txt"
    value.write_text("s3cret\n")
    parent = tmp_path / "parent"
    StateDir(parent / "agent").ensure()
    # A parent of state directories is refused, nothing stored.
    code, _, err = console(
        ["secret", "set", "k", "--from-file", str(value), "--state-dir", str(parent)], capsys
    )
    assert code == 1 and "is not a trueup state directory" in err
    assert sorted(p.name for p in parent.iterdir()) == ["agent"]
    # A new router's empty directory: the first key makes it a state directory, audited.
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    code, _, err = console(
        ["secret", "set", "k", "--from-file", str(value), "--state-dir", str(fresh)], capsys
    )
    assert code == 0, err
    events = [r["event"] for r in StateDir(fresh).audit.records()]
    assert events[0] == "state_dir_created", events
    records = [r for r in StateDir(fresh).audit.records() if r["event"] == "secret_set"]
    assert len(records) == 1 and records[0]["details"]["name"] == "k"
    assert "s3cret" not in (fresh / "audit.jsonl").read_text()
