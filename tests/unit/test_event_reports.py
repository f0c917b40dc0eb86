"""Reports follow events: the loop says when what an operator sees changes, the pacer
coalesces (one report a second at most, the first at once; a 429 backs off and keeps
the change), and the report carries the drift history and the router's acknowledgements.
All on fake clocks, FakeNetlink and a fake control-plane client: no root, no waiting."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.unit.test_loop import ADDRESSES, Rig
from trueup.agent.cpclient import ControlPlaneRefused, ControlPlaneUnavailable
from trueup.agent.cpreport import ReportPacer, report_from_status
from trueup.agent.cpsync import SyncLoop
from trueup.agent.reportwatch import StatusWatch


# -- the pacer ----------------------------------------------------------------------
def test_first_change_goes_at_once_the_rest_within_a_second_heartbeat_otherwise() -> None:
    pacer = ReportPacer(heartbeat=30.0, min_interval=1.0)
    assert pacer.due_at() == 0.0  # the first report: now
    pacer.taken()
    pacer.sent(100.0)
    assert pacer.due_at() == 130.0  # nothing changed: the heartbeat
    pacer.request()  # a change 0.2 s after a report ...
    assert pacer.due_at() == 101.0  # ... waits out the second, not the heartbeat
    pacer.request()  # more changes meanwhile are the same report
    pacer.taken()
    pacer.sent(101.0)
    assert pacer.due_at() == 131.0
    pacer.request()  # a change after a quiet interval goes at once
    assert pacer.due_at() <= 105.0


def test_a_429_holds_reports_for_retry_after_and_keeps_the_change() -> None:
    pacer = ReportPacer(heartbeat=30.0, min_interval=1.0)
    pacer.taken()
    pacer.sent(100.0)
    pacer.request()
    pacer.taken()
    pacer.throttled(101.0, 7.0)
    assert pacer.requested  # the state still has to go
    assert pacer.due_at() == 108.0
    pacer.request()
    assert pacer.due_at() == 108.0  # a new change does not jump the back-off
    pacer.throttled(108.0, None)  # no Retry-After: at least the minimum interval
    assert pacer.due_at() == 109.0


class FakeClient:
    url = "http://cp.test"

    def __init__(self, answers: list[Exception | None]) -> None:
        self.answers = answers
        self.sent: list[dict[str, Any]] = []

    def report(self, payload: dict[str, Any]) -> None:
        answer = self.answers.pop(0) if self.answers else None
        if answer is not None:
            raise answer
        self.sent.append(payload)


def _sync(client: FakeClient, state: dict[str, Any], clock: list[float]) -> SyncLoop:
    return SyncLoop(
        client,  # type: ignore[arg-type]
        lambda document, version: None,
        lambda: dict(state),
        heartbeat_interval=30.0,
        clock=lambda: clock[0],
    )


def test_a_throttled_report_is_not_dropped_the_next_carries_the_latest_state() -> None:
    clock = [100.0]
    state = {"drift": "seen"}
    client = FakeClient([ControlPlaneRefused(429, "slow down", retry_after=5.0)])
    sync = _sync(client, state, clock)
    assert sync.send_report() is False
    assert sync.reports_throttled == 1 and client.sent == []
    assert sync.pacer.due_at() == 105.0
    state["drift"] = "healed"  # meanwhile the drift healed
    clock[0] = 105.0
    assert sync.send_report() is True
    assert client.sent[-1]["drift"] == "healed"


def test_an_unavailable_control_plane_keeps_the_change_asked_for() -> None:
    clock = [100.0]
    client = FakeClient([ControlPlaneUnavailable("down")])
    sync = _sync(client, {}, clock)
    sync._stop.set()  # no back-off wait in a unit test
    assert sync.send_report() is False
    assert sync.pacer.requested


def test_request_report_brings_the_next_report_forward() -> None:
    clock = [100.0]
    client = FakeClient([])
    sync = _sync(client, {}, clock)
    assert sync.send_report()
    assert sync.pacer.due_at() == 130.0
    sync.request_report()
    assert sync.pacer.due_at() == 101.0


# -- what asks for a report -----------------------------------------------------------
def test_the_loop_says_when_drift_is_seen_and_healed_and_by_whom(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    assert rig.apply()["ok"]
    changes: list[int] = []
    rig.loop.run_pass()  # the first pass reads the applied document's policies
    rig.loop.on_change.append(lambda: changes.append(1))
    rig.loop.run_pass()
    assert changes == []  # a pass that changes nothing an operator sees asks for nothing
    rig.delete_address()
    report = rig.loop.run_pass()
    assert report.healed["addresses"]
    assert changes  # drift seen (and healed) in that pass
    seen = len(changes)
    rig.loop.run_pass()  # in sync again: the drift record ends
    assert len(changes) > seen
    (record,) = rig.loop.status_inputs()["extra"]["drift_history"]
    assert record["subsystem"] == "addresses" and record["paths"] == [ADDRESSES]
    assert record["ended_at"] is not None
    assert record["healed_by"]["by"] == "trueup" and record["healed_by"]["action"] == "heal"
    assert record["healed_by"]["txn"] == report.txns[-1]
    assert record["attribution"][0]["sender"] == "ip"


def test_an_acknowledgement_set_and_expired_asks_for_reports(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    assert rig.apply()["ok"]
    changes: list[int] = []
    rig.loop.on_change.append(lambda: changes.append(1))
    assert rig.loop.acknowledge("addresses", 60, "INC-1", actor="test")["ok"]
    assert len(changes) == 1
    rig.clock.advance(61)
    rig.loop.run_pass()
    assert len(changes) == 2
    (ended,) = rig.loop.status_inputs()["extra"]["acknowledgements_ended"]
    assert ended["subsystem"] == "addresses" and ended["ended"] == "expired"
    assert ended["reason"] == "INC-1"


def test_the_watch_asks_for_a_report_when_the_facts_change() -> None:
    facts = {"fences": [], "open_transaction": None}
    asked: list[int] = []
    watch = StatusWatch(lambda: dict(facts), lambda: asked.append(1))
    assert watch.check() is False  # the first look is the baseline
    assert watch.check() is False
    facts["open_transaction"] = "txn-1"  # a transaction began
    assert watch.check() is True
    facts["fences"] = ["dhcp"]
    assert watch.check() is True
    assert len(asked) == 2


# -- what the report carries ----------------------------------------------------------
def test_the_report_carries_drift_history_with_writer_and_healer_and_acks() -> None:
    status = {
        "versions": {"applied": 1},
        "subsystems": {
            "addresses": {
                "health": "ok",
                "acknowledgement": {
                    "until_at": "2030-01-01T00:00:00.000Z",
                    "reason": "INC-9",
                    "actor": "api",
                    "at": "2029-12-31T23:00:00.000Z",
                },
            }
        },
        "drift_history": [
            {
                "subsystem": "addresses",
                "since": "2029-12-31T23:10:00.000Z",
                "ended_at": "2029-12-31T23:10:00.120Z",
                "paths": [ADDRESSES],
                "detected_by": "event",
                "attribution": [
                    {"message": "RTM_DELADDR", "sender": "ip", "sender_port": 4242},
                    {"message": "RTM_NEWADDR", "sender": "trueup (this agent)"},
                ],
                "healed_by": {"by": "trueup", "action": "heal", "txn": "t-1"},
            }
        ],
        "acknowledgements_ended": [
            {"subsystem": "routes", "until": "x", "by": "api", "reason": "r", "ended": "expired"}
        ],
    }
    report = report_from_status(status)
    (record,) = report["drift_history"]
    assert record["healed_at"] == "2029-12-31T23:10:00.120Z"
    assert record["changed_by"] == ["RTM_DELADDR from ip"]  # trueup's own write is no writer
    assert record["healed_by"]["txn"] == "t-1"
    acks = {a["subsystem"]: a for a in report["acknowledgements"]}
    assert acks["addresses"]["state"] == "active" and acks["addresses"]["reason"] == "INC-9"
    assert acks["routes"]["state"] == "expired"


def test_the_report_is_bounded() -> None:
    many = [
        {"subsystem": "addresses", "since": f"2029-01-01T00:00:{i:02d}.000Z", "paths": ["p"] * 80}
        for i in range(40)
    ]
    report = report_from_status({"drift_history": many})
    assert len(report["drift_history"]) == 20
    assert len(report["drift_history"][0]["paths"]) == 50
    assert report["drift_history"][0]["paths_total"] == 80


def test_an_acknowledgement_with_a_long_reason_or_actor_does_not_stop_reports() -> None:
    # `trueup ack --reason` and the agent API's actor take any length; the report model
    # takes at most 10,000 and 200 characters: the report carries them cut, never fails.
    status = {
        "versions": {"applied": 1},
        "subsystems": {
            "addresses": {
                "health": "ok",
                "acknowledgement": {
                    "until_at": "2030-01-01T00:00:00.000Z",
                    "reason": "r" * 20_000,
                    "actor": "a" * 500,
                    "at": "2029-12-31T23:00:00.000Z",
                },
            }
        },
        "acknowledgements_ended": [
            {"subsystem": "routes", "by": "b" * 300, "reason": "x" * 10_001, "ended": "withdrawn"}
        ],
    }
    report = report_from_status(status)
    acks = {a["subsystem"]: a for a in report["acknowledgements"]}
    assert len(acks["addresses"]["reason"]) == 10_000 and acks["addresses"]["reason"][-1] == "…"
    assert len(acks["addresses"]["by"]) == 200
    assert acks["routes"]["state"] == "withdrawn" and len(acks["routes"]["by"]) == 200
