"""One route for an operator's requests, one builder per kind of change, one plan body."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from tests.routers import base_document
from tests.unit.test_loop import Rig
from trueup.model.document import parse_document
from trueup.reconcile.changes import Change
from trueup.reconcile.planning import plan_answer
from trueup.reconcile.requests import Requests

LAN0 = {"name": "lan0", "mtu": 1300, "addresses": ["203.0.113.1/24", "2001:db8:1::1/64"]}
TRUEUP = Path(__file__).resolve().parents[2] / "trueup"
# `Change(` as a call, not `PathChange(` or `class Change(`.
_BUILT = re.compile(r"(?<![\w.])Change\(")


class Recording:
    """A handler that keeps what it was handed."""

    def __init__(self) -> None:
        self.writes: list[tuple[Change, float | None]] = []

    def write(self, change: Change, confirm_within: float | None) -> dict[str, Any]:
        self.writes.append((change, confirm_within))
        return {"ok": True}

    def confirm(
        self, *, actor: str = "api", version: int | None = None, reason: str | None = None
    ) -> dict[str, Any]:
        return {"ok": True, "confirmed_by": actor}

    def reconcile_now(self, subsystem: str | None, *, actor: str = "api") -> dict[str, Any]:
        return {"ok": True, "subsystem": subsystem}

    def acknowledge(
        self, subsystem: str, seconds: float, reason: str, *, actor: str = "api"
    ) -> dict[str, Any]:
        return {"ok": True, "subsystem": subsystem}

    def clear_acknowledgement(self, subsystem: str, *, actor: str = "api") -> dict[str, Any]:
        return {"ok": True, "subsystem": subsystem}


def test_only_the_changes_module_builds_a_change() -> None:
    builders = []
    for path in sorted(TRUEUP.rglob("*.py")):
        if path == TRUEUP / "reconcile" / "changes.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if _BUILT.search(line) and not line.lstrip().startswith("class "):
                builders.append(f"{path.relative_to(TRUEUP.parent)}:{number}: {line.strip()}")
    assert builders == [], "build it with a Change constructor (Change.apply, Change.heal, …)"


def test_a_write_before_the_loop_runs_goes_to_the_engine_without_a_window(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path)
    before = Requests(rig.engine, lambda: None)
    document = parse_document(base_document(routes=[]))
    refused = before.apply(document, actor="test", confirm_within=30)
    assert refused["ok"] is False and refused["outcome"] == "refused"
    assert "--confirm-within is available once it runs" in refused["message"]
    assert rig.state.audit.records()[-1]["event"] == "apply_refused"
    answer = before.apply(document, actor="test")
    assert answer["ok"] and answer["version"] == 1
    assert "pending_confirmation" not in answer


def test_once_the_loop_runs_every_request_goes_to_it(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    assert rig.requests.apply(parse_document(base_document(routes=[])), actor="test")["ok"]
    changed = parse_document(base_document(routes=[], interfaces=[LAN0]))
    assert rig.requests.apply(changed, actor="test")["version"] == 2
    handler = Recording()
    requests = Requests(rig.engine, lambda: handler)
    document = parse_document(base_document(routes=[]))
    requests.apply(document, actor="ops", mode="best-effort", confirm_within=20, override="lab")
    requests.rollback(None, actor="ops")
    applied, rollback = handler.writes
    assert applied[1] == 20 and rollback[1] is None
    assert (applied[0].kind, applied[0].origin, applied[0].mode) == (
        "apply",
        "local-cli",
        "best-effort",
    )
    assert applied[0].override == "lab" and applied[0].actor == "ops"
    # The one rollback: the accepted revision again as a new version, expecting what is applied.
    assert (rollback[0].kind, rollback[0].origin, rollback[0].new_version) == (
        "rollback",
        "rollback",
        True,
    )
    assert rollback[0].expect_version == 2 and rollback[0].source == "revision 1"
    assert requests.confirm(actor="ops") == {"ok": True, "confirmed_by": "ops"}
    assert requests.reconcile("addresses")["subsystem"] == "addresses"
    # Nothing reached the engine: version 2 is still the applied one.
    assert rig.state.applied().version == 2


def test_the_agent_and_the_cli_answer_plan_with_one_body(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    assert rig.requests.apply(parse_document(base_document(routes=[])), actor="test")["ok"]
    changed = parse_document(base_document(routes=[], interfaces=[LAN0]))
    agent = rig.requests.plan(changed).to_json()
    cli = plan_answer(
        rig.engine, changed, previous=rig.engine.applied_document(), agent_pid=None
    ).to_json()
    assert agent.keys() == cli.keys()
    assert agent["observed_by"].keys() == cli["observed_by"].keys()
    assert agent["observed_by"]["agent_pid"] == os.getpid()
    assert cli["observed_by"]["agent_pid"] is None
    assert cli["observed_by"]["applied_version"] == 1
    assert agent["plans"] == cli["plans"] and agent["changes"] is True
