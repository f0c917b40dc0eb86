"""The CLI tells the truth: each common mistake is a clear error or a clear line.

A missing state directory, no agent running, an agent dying mid-call, drift
evidence, plan's old → new values, a failed atomic apply, `ack --for 0` and
`ack --clear`, refusals that a later apply answered, `--version` and shell
completion. The agent is the fake of `test_cli_fast` (a unix-socket HTTP
server) or an engine over `FakeNetlink`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import trueup
from tests.routers import base_document
from tests.unit.test_cli_fast import (  # noqa: F401  (fixtures)
    STATUS,
    FakeAgent,
    _clean_env,
    agent,
    fast_path,
    short_dir,
    typer_path,
)
from tests.unit.test_loop import ADDRESSES, Rig
from trueup.cli import entry, fast
from trueup.cli.output import print_plan, readable, render_findings, render_status
from trueup.journal.state import StateDir
from trueup.model.document import parse_document
from trueup.model.reasons import ReasonCode
from trueup.reconcile.changes import Refused
from trueup.reconcile.classify import _describe
from trueup.reconcile.engine import Engine
from trueup.reconcile.status import gather, refusals_since_last_write
from trueup.subsystems.base import Difference
from trueup.system.fake import FakeNetlink
from trueup.system.netlink import NetlinkError

Outcome = tuple[int, str, str]
OTHER_LAN = [{"name": "lan0", "mtu": 1300, "addresses": ["203.0.113.1/24"]}]


def console(argv: list[str], capsys: pytest.CaptureFixture[str]) -> Outcome:
    """`trueup ARGV` through the console entry: the fast path, then typer."""
    capsys.readouterr()
    try:
        entry.main(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    out, err = capsys.readouterr()
    return code, out, err


# -- a state directory that does not exist --------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["status"],
        ["status", "-o", "json"],
        ["drift"],
        ["plan", "{doc}"],
        ["apply", "{doc}"],
        ["rollback"],
        ["reconcile"],
        ["confirm"],
        ["ack", "addresses", "--for", "1h", "--reason", "r"],
        ["evidence", "--out", "{tmp}/e.tar.gz"],
        ["doctor"],
        ["preflight"],
        ["audit", "verify"],
        ["agent", "token"],
    ],
    ids=lambda argv: " ".join(argv[:2]),
)
def test_a_state_directory_that_does_not_exist_is_an_error(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = tmp_path / "doc.yaml"
    doc.write_text(yaml.safe_dump(base_document()))
    typo = tmp_path / "stat-dir"  # a typo of the agent's
    full = [a.format(doc=doc, tmp=tmp_path) for a in argv] + ["--state-dir", str(typo)]
    code, out, err = console(full, capsys)
    assert code == 1, (out, err)
    assert out == ""
    assert err.count("\n") == 1, err
    assert f"state directory {typo} does not exist" in err
    assert "--state-dir" in err and "TRUEUP_STATE_DIR" in err
    assert "`trueup agent run`" in err and "`trueup apply --init`" in err
    assert not typo.exists()  # nothing created


def test_the_environment_s_state_directory_is_checked_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRUEUP_STATE_DIR", str(tmp_path / "nope"))
    code, _, err = console(["drift"], capsys)
    assert code == 1 and f"{tmp_path / 'nope'} does not exist" in err
    (tmp_path / "file").write_text("")
    code, _, err = console(["status", "--state-dir", str(tmp_path / "file")], capsys)
    assert code == 1 and "is not a directory" in err


# -- no agent running ---------------------------------------------------------------


def test_status_without_an_agent_says_so_and_what_it_means(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    StateDir(state).ensure()
    code, out, err = console(["status", "--state-dir", str(state)], capsys)
    assert code == 0, err
    first = out.splitlines()[0]
    assert first.startswith(f"WARNING: no agent is running on {state}")
    assert "healing is off" in first
    assert "last known" in out and "trueup agent run" in out
    code, out, _ = console(["status", "--state-dir", str(state), "-o", "json"], capsys)
    assert code == 0 and json.loads(out)["agent"]["running"] is False


def test_status_with_an_agent_that_does_not_answer_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An agent holds the state directory (its pid record) but its socket does not answer."""
    state = tmp_path / "state"
    StateDir(state).ensure()
    (state / "agent.pid").write_text(json.dumps({"pid": os.getpid(), "started_at": "t0"}))
    code, out, err = console(["status", "--state-dir", str(state)], capsys)
    assert code == 0, err
    assert out.startswith(f"WARNING: the agent (pid {os.getpid()}) on {state} does not answer")
    assert "no agent is running" not in out
    code, out, _ = console(["status", "--state-dir", str(state), "-o", "json"], capsys)
    agent_section = json.loads(out)["agent"]
    assert agent_section["running"] is True and agent_section["answering"] is False


def test_status_from_an_agent_says_it_runs(
    agent: FakeAgent,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    running = {**STATUS, "agent": {**STATUS["agent"], "running": True}}
    agent.answers[("GET", "/v1/status")] = (200, running)
    argv = ["status", "--state-dir", str(agent.state_dir)]
    fast_outcome = fast_path(argv, capsys)
    assert fast_outcome == typer_path(argv, capsys, monkeypatch)
    assert "WARNING" not in fast_outcome[1]


# -- an agent that stops answering ----------------------------------------------------


def test_debug_prints_the_traceback_and_the_line(
    agent: FakeAgent,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    agent.answers[("POST", "/v1/confirm")] = None
    argv = ["confirm", "--state-dir", str(agent.state_dir)]
    code, _, err = typer_path(argv, capsys, monkeypatch)
    assert code == 1 and err.count("\n") == 1
    assert "stopped answering" in err and "is it running?" in err and "--debug" in err
    code, _, err = typer_path(["--debug", *argv], capsys, monkeypatch)
    assert code == 1 and "Traceback (most recent call last)" in err
    assert err.rstrip().splitlines()[-1].startswith("trueup: the agent stopped answering")


# -- status: drift records, attribution, back-off, breaker, acknowledgements ----------

HUGE = {"entries": [{"name": f"rule-{n}", "dev": None, "via": "192.0.2.1"} for n in range(400)]}


def _rich_status() -> dict[str, Any]:
    status = json.loads(json.dumps(STATUS))
    sub = status["subsystems"]["addresses"]
    sub["differences"] = [
        {
            "subsystem": "addresses",
            "path": "spec.routes[to=192.0.2.0/24]",
            "desired": {"to": "192.0.2.0/24", "via": "203.0.113.254", "dev": None},
            "observed": HUGE,
        }
    ]
    sub["drift"] = {
        "since": "2026-11-30T10:00:01.000Z",
        "paths": ["spec.routes[to=192.0.2.0/24]"],
        "detected_by": "event",
        "attribution": [
            {
                "message": "RTM_DELROUTE",
                "kind": "route",
                "received_at": "2026-11-30T10:00:00.998Z",
                "destination": "192.0.2.0/24",
                "sender_port": 4242,
                "sender": "ip (pid 4242)",
            }
        ],
    }
    sub.update(
        breaker="open",
        consecutive_failures=3,
        backoff_seconds=8.0,
        next_attempt_at="2026-11-30T10:00:09.000Z",
        retry_budget={"used": 3, "limit": 5, "window_seconds": 600},
        acknowledged_until="2026-11-30T12:00:00.000Z",
        acknowledgement={
            "until_at": "2026-11-30T12:00:00.000Z",
            "reason": "maintenance",
            "actor": "api",
        },
    )
    return status


def test_the_status_table_shows_drift_attribution_healing_and_acknowledgements() -> None:
    text = render_status(_rich_status())
    assert "drift:" in text and "addresses since 2026-11-30T10:00:01.000Z" in text
    assert "detected by event" in text
    assert "changed by: RTM_DELROUTE 192.0.2.0/24 from ip (pid 4242) (netlink port 4242)" in text
    assert "healing:" in text
    assert "breaker open, 3 consecutive failure(s), back-off 8s" in text
    assert "next attempt at 2026-11-30T10:00:09.000Z" in text
    assert "acknowledged:" in text
    assert "addresses: healing paused until 2026-11-30T12:00:00.000Z" in text
    assert " by api: maintenance; drift is still detected" in text
    assert "trueup ack addresses --clear" in text
    assert "pending confirmation: version 4 rolls back at 2026-11-30T10:05:00+00:00" in text


def test_drift_evidence_is_readable_and_bounded() -> None:
    text = render_status(_rich_status())
    assert "{'" not in text and "None" not in text  # not Python's repr
    assert "desired:  {to: 192.0.2.0/24, via: 203.0.113.254}" in text
    assert max(len(line) for line in text.splitlines()) < 400
    assert "`-o json` shows all" in text
    assert readable({"a": [1, True, None], "b": None}) == "{a: [1, true, null]}"
    finding = {"code": "STATE_DRIFT_DETECTED", "detail": "x" * 20000, "paths": []}
    lines = render_findings([finding])
    assert max(len(line) for line in lines) < 400 and "-o json" in lines[1]


def test_a_difference_is_described_without_python_repr() -> None:
    diff = Difference(
        "routes",
        "spec.routes",
        None,
        None,
        missing=[{"to": "192.0.2.0/24", "via": "203.0.113.254", "dev": None}],
    )
    text = _describe(diff)
    assert text == "spec.routes: missing {to: 192.0.2.0/24, via: 203.0.113.254}"


def test_a_missed_confirmation_is_on_the_status_table() -> None:
    status = json.loads(json.dumps(STATUS))
    status["versions"].update(applied=5, origin="confirm-timeout")
    assert "confirmation: MISSED" in render_status(status)


# -- plan: old → new, management changes ------------------------------------------------


@pytest.fixture
def kernel() -> FakeNetlink:
    return FakeNetlink({"mgmt0": 1500, "lan0": 1500})


@pytest.fixture
def engine(tmp_path: Path, kernel: FakeNetlink) -> Engine:
    state = StateDir(tmp_path / "state")
    state.ensure()
    return Engine(state, netlink_factory=lambda: kernel)


def test_plan_shows_old_and_new_values(engine: Engine, capsys: pytest.CaptureFixture[str]) -> None:
    assert engine.apply_document(parse_document(base_document())).ok
    lower = base_document(interfaces=OTHER_LAN)
    plans = {p.subsystem: p for p in engine.plan(parse_document(lower))}
    step = plans["links"].steps[0]
    assert plans["links"].step_json(step)["old"] == 1400
    assert plans["links"].step_json(step)["new"] == 1300
    body = {
        "plans": [
            {
                "subsystem": p.subsystem,
                "steps": [p.step_json(s) for s in p.steps],
                "noop": p.noop_reasons,
                "error": p.error,
            }
            for p in plans.values()
        ],
        "management_changes": ["removes management address 198.51.100.2/24 from mgmt0"],
        "observed_by": {"agent_pid": 1, "state_dir": "/s", "applied_version": 1},
    }
    capsys.readouterr()
    assert print_plan(body, "table") == 2
    out, err = capsys.readouterr()
    assert "  ~ links: set-mtu lan0: 1400 → 1300" in out
    assert "! this changes management access: apply with --confirm-within SECONDS" in err, err


# -- a failed atomic apply --------------------------------------------------------------


def test_a_failed_atomic_apply_names_the_version_that_remains(
    engine: Engine,
    kernel: FakeNetlink,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from trueup.cli.output import print_apply

    engine.apply_document(parse_document(base_document()))
    kernel.fail_on["add route to 192.0.2.128/25"] = NetlinkError("add route", "Network is down")
    bad = base_document(routes=[{"to": "192.0.2.128/25", "via": "203.0.113.254"}])
    result = engine.apply_document(parse_document(bad)).to_json()
    assert result["outcome"] == "rolled_back" and result["attempted_version"] == 2
    capsys.readouterr()
    assert print_apply(result, "table") == 1
    out, _ = capsys.readouterr()
    assert "version 2 was not applied; version 1 remains (rolled back: routes: " in out
    assert "Network is down" in out


# -- refusals that a later apply answered -------------------------------------------------


def _codes(engine: Engine) -> set[str]:
    return {f["code"] for f in gather(engine)["reason_codes"]}


def test_a_refusal_disappears_once_a_later_apply_succeeds(engine: Engine) -> None:
    assert engine.apply_document(parse_document(base_document())).ok
    with pytest.raises(Refused):
        engine.apply_document(parse_document(base_document(interfaces=OTHER_LAN)), expect_version=0)
    assert ReasonCode.CONCURRENT_MODIFICATION.value in _codes(engine)
    assert engine.apply_document(parse_document(base_document(interfaces=OTHER_LAN))).ok
    assert ReasonCode.CONCURRENT_MODIFICATION.value not in _codes(engine)


def test_a_refusal_stays_after_the_write_it_lost_to(engine: Engine) -> None:
    """A write that began before the refusal (the winner, holding the lock) commits after it:
    the loser's change is still not on the device, so the refusal stays listed."""
    assert engine.apply_document(parse_document(base_document())).ok
    with pytest.raises(Refused):
        engine.apply_document(parse_document(base_document(interfaces=OTHER_LAN)), expect_version=0)
    assert engine.apply_document(parse_document(base_document(interfaces=OTHER_LAN))).ok
    winner = engine.state.journal.transactions()[-1].txn
    begun = {t.txn: str(t.begin["at"]) for t in engine.state.journal.transactions()}
    assert refusals_since_last_write(engine, begun=begun) == []
    began_before = {**begun, winner: "2000-01-01T00:00:00.000Z"}
    (refusal,) = refusals_since_last_write(engine, begun=began_before)
    assert refusal["details"]["code"] == ReasonCode.CONCURRENT_MODIFICATION.value


def test_refusals_are_answered_only_by_writes_that_began_after_them(engine: Engine) -> None:
    with pytest.raises(Refused):
        engine.apply_document(parse_document(base_document()), expect_version=5)
    assert len(refusals_since_last_write(engine)) == 1
    assert engine.apply_document(parse_document(base_document())).ok
    assert refusals_since_last_write(engine) == []


# -- ack: a duration that is not positive, and --clear --------------------------------------


def test_ack_for_zero_is_an_error_and_sends_nothing(
    agent: FakeAgent,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    argv = ["ack", "addresses", "--for", "0", "--reason", "x", "--state-dir", str(agent.state_dir)]
    assert fast.run(argv) is None  # handed to typer, which refuses it
    code, out, err = console(argv, capsys)
    assert code == 1 and out == ""
    assert "--for 0: an acknowledgement needs a positive duration" in err
    assert agent.calls("/v1/ack") == []


def test_an_ack_the_agent_refuses_exits_1_on_both_paths(
    agent: FakeAgent,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    agent.answers[("POST", "/v1/ack")] = (200, {"ok": False, "message": "agent still starting"})
    argv = ["ack", "addresses", "--for", "1h", "--reason", "x", "--state-dir", str(agent.state_dir)]
    fast_outcome = fast_path(argv, capsys)
    assert fast_outcome == typer_path(argv, capsys, monkeypatch)
    assert fast_outcome == (1, "", "trueup: agent still starting\n")


def test_ack_clear_withdraws_through_the_agent(
    agent: FakeAgent,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    agent.answers[("DELETE", "/v1/ack")] = (
        200,
        {"ok": True, "cleared": True, "message": "addresses: acknowledgement withdrawn"},
    )
    argv = ["ack", "addresses", "--clear", "--state-dir", str(agent.state_dir)]
    code, out, err = console(argv, capsys)
    assert code == 0, err
    assert out == "addresses: acknowledgement withdrawn\n"
    (call,) = agent.calls("/v1/ack")
    assert call["method"] == "DELETE" and call["query"] == {
        "subsystem": ["addresses"],
        "actor": [f"cli:{os.getuid()}"],
    }
    code, _, err = console([*argv, "--for", "1h"], capsys)
    assert code == 1 and "--clear takes no --for or --reason" in err
    code, _, err = console(["ack", "addresses", "--state-dir", str(agent.state_dir)], capsys)
    assert code == 1 and "--for DURATION and --reason TEXT" in err


def test_the_loop_withdraws_an_acknowledgement_and_audits_it(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    assert rig.apply()["ok"]
    assert rig.loop.acknowledge("addresses", 3600, "maintenance", actor="test")["ok"]
    rig.delete_address()
    assert "acknowledged until" in rig.loop.run_pass().held["addresses"]
    answer = rig.loop.clear_acknowledgement("addresses", actor="test")
    assert answer["ok"] and answer["cleared"]
    assert rig.policies()["acknowledged_until"] is None
    cleared = rig.audit("ack_cleared")
    assert len(cleared) == 1 and cleared[0]["details"]["subsystem"] == "addresses"
    assert rig.loop.run_pass().healed["addresses"]  # healing resumes at once
    assert rig.has_address()
    assert rig.new_loop().status_inputs()["policies"]["addresses"]["acknowledged_until"] is None
    again = rig.loop.clear_acknowledgement("addresses", actor="test")
    assert again["ok"] and not again["cleared"] and len(rig.audit("ack_cleared")) == 1
    assert ADDRESSES  # the rig's path, as test_loop uses it


# -- --version and shell completion ----------------------------------------------------------


def test_version_names_the_cli_and_the_running_agent(
    agent: FakeAgent,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, out, _ = console(["--version"], capsys)
    assert code == 0 and out == f"trueup {trueup.__version__}\n"
    running = {**STATUS, "agent": {**STATUS["agent"], "version": "9.9.9"}}
    agent.answers[("GET", "/v1/status")] = (200, running)
    monkeypatch.setenv("TRUEUP_STATE_DIR", str(agent.state_dir))
    code, out, _ = console(["--version"], capsys)
    assert code == 0
    assert out == (f"trueup {trueup.__version__}\nagent 9.9.9 (pid 4242, {agent.state_dir})\n")


def test_shell_completion_is_typers(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert fast.run(["--show-completion"]) is None
    assert fast.run(["--install-completion"]) is None
    monkeypatch.setenv("SHELL", "/bin/bash")
    monkeypatch.setattr(sys, "argv", ["trueup"])
    code, out, err = console(["--show-completion", "bash"], capsys)
    assert code == 0, err
    assert "_TRUEUP_COMPLETE" in out and "complete" in out
    # A completion request goes to typer whatever words it completes.
    monkeypatch.setenv("_TRUEUP_COMPLETE", "complete_bash")
    monkeypatch.setenv("COMP_WORDS", "trueup sta")
    monkeypatch.setenv("COMP_CWORD", "1")
    code, out, _ = console([], capsys)
    assert code == 0 and "status" in out.split()
    assert os.environ["_TRUEUP_COMPLETE"] == "complete_bash"


def test_a_pending_confirmation_shows_without_an_agent(engine: Engine) -> None:
    from trueup.journal.confirm import write_pending

    assert engine.apply_document(parse_document(base_document())).ok
    write_pending(
        engine.state,
        {
            "state": "pending",
            "version": 2,
            "confirmed_version": 1,
            "deadline": 1.0,
            "deadline_at": "2026-11-30T10:05:00.000Z",
        },
    )
    status = gather(engine)
    assert status["pending_confirmation"] == {
        "version": 2,
        "deadline": "2026-11-30T10:05:00.000Z",
        "rollback_to": 1,
    }
    assert "pending confirmation: version 2 rolls back at 2026-11-30T10:05:00.000Z" in (
        render_status(status)
    )


def test_the_status_table_shows_routing_sessions_and_adjacencies_down_ones_too() -> None:
    status = json.loads(json.dumps(STATUS))
    status["subsystems"]["routing"] = {
        "tier": "routing",
        "health": "ok",
        "system": {
            "daemons": ["zebra", "bgpd", "ospfd"],
            "bgp": {
                "198.51.100.2": [
                    {
                        "family": "ipv4Unicast",
                        "remote_as": 64513,
                        "state": "Established",
                        "prefixes_received": 3,
                        "prefixes_sent": 1,
                        "description": "upstream",
                    }
                ],
                "198.51.100.6": [{"family": "ipv4Unicast", "remote_as": 64514, "state": "Active"}],
            },
            "ospf": [{"neighbor_id": "192.0.2.2", "state": "Full/DR", "interface": "wan0"}],
        },
    }
    text = render_status(status)
    assert "routing:  daemons zebra, bgpd, ospfd" in text
    assert "  bgp   198.51.100.2 AS 64513 upstream: ipv4Unicast Established (3 in/1 out)" in text
    assert "  bgp   198.51.100.6 AS 64514: ipv4Unicast Active\n" in text
    assert "  ospf  192.0.2.2 Full/DR on wan0" in text
