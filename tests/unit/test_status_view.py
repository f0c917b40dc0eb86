"""The loop's status view and the one status builder, over a FakeNetlink: no root."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import trueup
from tests.routers import base_document
from trueup.journal.state import StateDir
from trueup.model.document import parse_document
from trueup.reconcile.attribution import DriftBook
from trueup.reconcile.changes import Change
from trueup.reconcile.engine import Engine
from trueup.reconcile.healing import Governor, HealingOptions
from trueup.reconcile.status import AgentInfo, build_status, drift_report, gather
from trueup.reconcile.view import LoopActivity, LoopView, build_view
from trueup.system.fake import FakeNetlink

NOW = 1_800_000_000.0
NAMES = ["management", "links", "addresses", "routes"]
ROUTE = "spec.routes[table=254,to=192.0.2.0/24,metric=0]"
OPTIONS = HealingOptions(jitter=0.0, breaker_threshold=2, retry_budget=10, retry_window=60)
STATUS_KEYS = [
    "device",
    "observed_at",
    "versions",
    "management",
    "subsystems",
    "journal",
    "state_directory",
    "reason_codes",
    "fences",
    "restore",
    "limitations",
]


def _view(
    governor: Governor,
    drift: DriftBook | None = None,
    waiting: dict[str, str] | None = None,
    policy: str = "auto",
    pending: dict[str, Any] | None = None,
) -> LoopView:
    document = parse_document(base_document(convergence={"default": policy}))
    return build_view(
        NAMES,
        document=document,
        governor=governor,
        options=OPTIONS,
        drift=drift or DriftBook(),
        waiting=waiting or {},
        pending_confirmation=pending,
        activity=LoopActivity(event_source="fake", counters={"passes": 3, "events": 7}),
        now=NOW,
    )


def test_a_quiet_subsystem_is_active_with_a_closed_breaker() -> None:
    view = _view(Governor(OPTIONS))
    entry = view.policies["links"]
    assert entry["policy"] == "auto" and entry["healing"] == "active"
    assert entry["breaker"] == "closed" and entry["consecutive_failures"] == 0
    assert entry["retry_budget"] == {"used": 0, "limit": 10, "window_seconds": 60}
    assert entry["acknowledged_until"] is None and entry["contested"] == []
    assert "drift" not in entry and "reason" not in entry
    assert view.reconcile_failures == {}
    assert view.status_extra() == {
        "pending_confirmation": None,
        "confirmation": None,
        "reconcile_loop": {
            "event_source": "fake",
            "resync_seconds": 60.0,
            "last_pass_at": None,
            "last_resync_at": None,
            "passes": 3,
            "events": 7,
        },
        "drift_history": [],
        "acknowledgements_ended": [],
    }


def test_failures_open_the_breaker_and_are_reported_with_their_paths() -> None:
    governor = Governor(OPTIONS)
    for at in (NOW - 20, NOW - 10):
        governor.record_attempt("addresses", at)
        governor.record_failure("addresses", at, "No such device", ["p"])
    drift = DriftBook()
    drift.start("addresses", NOW - 30, "event").paths = ["p"]
    view = _view(governor, drift)
    entry = view.policies["addresses"]
    assert entry["breaker"] == "open" and entry["consecutive_failures"] == 2
    assert "circuit breaker open" in entry["healing"]
    assert entry["retry_budget"]["used"] == 2
    assert entry["drift"]["paths"] == ["p"] and entry["drift"]["detected_by"] == "event"
    failure = view.reconcile_failures["addresses"]
    assert failure["breaker"] == "open" and failure["paths"] == ["p"]
    assert "No such device" in failure["detail"]
    assert view.drift_since == {"addresses": "2027-01-15T07:59:30.000Z"}


def test_acks_contested_paths_waits_and_notify_are_explained() -> None:
    governor = Governor(OPTIONS)
    governor.acknowledge("addresses", NOW, 3600, "maintenance", "test")
    governor.of("routes").contested = {ROUTE: {"reason": "someone else is writing it"}}
    drift = DriftBook()
    drift.start("links", NOW, "resync")
    view = _view(governor, drift, waiting={"links": "waiting on management: …"})
    assert view.policies["addresses"]["acknowledged_until"] == "2027-01-15T09:00:00.000Z"
    assert view.policies["addresses"]["acknowledgement"]["reason"] == "maintenance"
    assert view.policies["routes"]["contested"] == [ROUTE]
    assert view.policies["routes"]["reason"] == "someone else is writing it"
    assert view.policies["links"]["waiting"] == "waiting on management: …"
    assert view.policies["links"]["healing"] == "waiting on management: …"
    notify = _view(Governor(OPTIONS), policy="notify")
    assert notify.policies["links"]["healing"] == "notify: detection only"


def test_status_inputs_keep_their_shape() -> None:
    pending = {"version": 4, "deadline": "…", "rollback_to": 3}
    inputs = _view(Governor(OPTIONS), pending=pending).status_inputs()
    assert list(inputs) == [
        "reconcile_failures",
        "drift_since",
        "attribution",
        "policies",
        "extra",
    ]
    assert inputs["extra"]["pending_confirmation"] == pending


# -- the one builder ------------------------------------------------------------
@pytest.fixture
def engine(tmp_path: Path) -> Engine:
    state = StateDir(tmp_path / "state")
    state.ensure()
    kernel = FakeNetlink({"mgmt0": 1500, "lan0": 1500})
    engine = Engine(state, netlink_factory=lambda: kernel)
    assert engine.transact(Change(parse_document(base_document()), actor="test")).ok
    return engine


def test_without_an_agent_status_has_only_the_core_sections(engine: Engine) -> None:
    status = gather(engine, control_plane_version=1)
    assert list(status) == STATUS_KEYS
    assert status["versions"]["applied"] == 1 and status["versions"]["control_plane"] == 1
    assert status["management"]["ready"] is True
    assert drift_report(status)["in_sync"] is True


def test_the_agent_s_inputs_each_land_in_their_section(engine: Engine) -> None:
    forgotten: list[str] = []
    view = _view(Governor(OPTIONS), pending={"version": 2, "deadline": "…", "rollback_to": 1})
    status = build_status(
        engine,
        control_plane_version=1,
        loop=view,
        startup_health={
            "links": {"health": "failed", "reason": "deadline", "since": "t"},  # healed since
            "routes": {"health": "pending", "reason": "waiting for a daemon", "since": "t"},
            "no-such-plugin": {"health": "failed", "reason": "not loaded", "since": "t"},  # unknown
        },
        forget_startup_verdict=forgotten.append,
        management={"ready": False, "phase": "running", "addresses": ["x"], "listeners": {}},
        agent=AgentInfo(
            pid=42,
            started_at="t0",
            state_dir="/s",
            startup=[{"name": "load"}],
            extra={"plugins": []},
            config_error="bad file",
        ),
        control_plane={"url": "https://cp", "connected": True},
    ).to_json()
    assert list(status) == [
        *STATUS_KEYS,
        "pending_confirmation",
        "confirmation",
        "reconcile_loop",
        "drift_history",
        "acknowledgements_ended",
        "agent",
        "control_plane",
    ]
    assert status["pending_confirmation"]["version"] == 2
    assert status["reconcile_loop"]["passes"] == 3
    assert forgotten == ["links"]
    assert status["subsystems"]["links"]["health"] == "ok"
    assert status["subsystems"]["routes"]["health"] == "pending"
    assert status["subsystems"]["routes"]["breaker"] == "closed"  # from the loop's view
    management = status["management"]
    assert management["ready"] is False and management["phase"] == "running"
    assert management["addresses"] == ["198.51.100.2/24"]  # the document's, not the probe's
    assert status["agent"] == {
        "running": True,
        "version": trueup.__version__,
        "pid": 42,
        "started_at": "t0",
        "state_dir": "/s",
        "startup": [{"name": "load"}],
        "startup_drift": [],
        "plugins": [],
        "config_error": "bad file",
        "damaged_state": [],
    }
    assert status["control_plane"]["connected"] is True


def test_heal_failures_in_the_view_fail_the_subsystem(engine: Engine) -> None:
    governor = Governor(OPTIONS)
    governor.record_failure("routes", NOW, "unreachable", [ROUTE])
    status = build_status(engine, loop=_view(governor)).to_json()
    assert status["subsystems"]["routes"]["health"] == "failed"
    codes = [f["code"] for f in status["reason_codes"]]
    assert "STATE_RECONCILIATION_FAILED" in codes
