"""The reconcile loop's bounds with FakeNetlink and a fake clock: no root, no waiting."""

from __future__ import annotations

import errno
import random
from pathlib import Path
from typing import Any

import pytest

from tests.routers import base_document
from trueup.journal.confirm import read_pending, write_pending
from trueup.journal.state import StateDir
from trueup.model.document import parse_document
from trueup.reconcile.confirm import decide, settle_at_startup, unsafe_management_changes
from trueup.reconcile.engine import Engine
from trueup.reconcile.healing import Governor, HealingOptions
from trueup.reconcile.loop import ReconcileLoop
from trueup.reconcile.requests import Requests
from trueup.system.events import FakeEventSource, NetlinkEvent
from trueup.system.fake import FakeNetlink
from trueup.system.netlink import NetlinkError

LAN = "203.0.113.1/24"
ADDRESSES = "spec.interfaces[lan0].addresses"
ITEM = f"{ADDRESSES}[{LAN}]"


class Clock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Rig:
    def __init__(self, tmp_path: Path, options: HealingOptions | None = None) -> None:
        self.clock = Clock()
        self.net = FakeNetlink({"mgmt0": 1500, "lan0": 1500})
        self.state = StateDir(tmp_path / "state")
        self.state.ensure()
        self.engine = Engine(self.state, netlink_factory=lambda: self.net)
        self.events = FakeEventSource()
        self.options = options or HealingOptions(jitter=0.0)
        self.loop = self.new_loop()

    def new_loop(self) -> ReconcileLoop:
        loop = ReconcileLoop(
            self.engine,
            options=self.options,
            events=self.events,
            clock=self.clock,
            rng=random.Random(4),
        )
        self.events.start(loop._on_event)
        return loop

    @property
    def requests(self) -> Requests:
        """The agent's route for operator requests, into this rig's loop."""
        return Requests(self.engine, lambda: self.loop)

    def apply(self, **spec: Any) -> dict[str, Any]:
        document = parse_document(base_document(routes=[], **spec))
        return self.requests.apply(document, actor="test")

    def delete_address(self, sender_port: int = 4242) -> None:
        self.net.del_address("lan0", LAN)
        self.events.emit(
            NetlinkEvent(
                "address",
                "RTM_DELADDR",
                self.clock(),
                ifname="lan0",
                address=LAN,
                sender_port=sender_port,
                sender="ip",
            )
        )

    def has_address(self) -> bool:
        return any(a.prefix == LAN for a in self.net.addrs)

    def policies(self) -> dict[str, Any]:
        entry: dict[str, Any] = self.loop.status_inputs()["policies"]["addresses"]
        return entry

    def audit(self, event: str) -> list[dict[str, Any]]:
        return [r for r in self.state.audit.records() if r["event"] == event]


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    rig = Rig(tmp_path)
    assert rig.apply()["ok"]
    return rig


# -- the governor alone ------------------------------------------------------
def test_backoff_doubles_from_base_to_cap_with_jitter_and_resets_after_success() -> None:
    governor = Governor(HealingOptions(breaker_threshold=100, retry_budget=100), random.Random(1))
    now = 1000.0
    nominal = []
    for _ in range(11):
        governor.record_failure("links", now, "boom", ["p"])
        heal = governor.of("links")
        nominal.append(heal.backoff_seconds)
        assert heal.next_attempt_at is not None
        delay = heal.next_attempt_at - now
        assert 0.8 * heal.backoff_seconds <= delay <= min(300, 1.2 * heal.backoff_seconds)
        assert governor.blocked("links", now) is not None
        assert governor.blocked("links", heal.next_attempt_at) is None
    assert nominal == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]
    governor.record_success("links", now)
    assert governor.of("links").backoff_seconds == 0
    governor.record_failure("links", now, "boom", ["p"])
    assert governor.of("links").backoff_seconds == 1


def test_breaker_opens_after_threshold_and_half_opens_after_cooldown() -> None:
    governor = Governor(HealingOptions(breaker_threshold=3, breaker_cooldown=600, jitter=0))
    opened = [governor.record_failure("routes", float(t), "unreachable", ["p"]) for t in range(3)]
    assert opened == [False, False, True]
    reason = governor.blocked("routes", 10.0)
    assert reason is not None and "circuit breaker open" in reason
    assert governor.blocked("routes", 602.0) is None  # cool-down over: one attempt allowed
    assert governor.of("routes").breaker == "half-open"
    governor.record_failure("routes", 602.0, "still unreachable", ["p"])
    assert governor.of("routes").breaker == "open"
    governor.reset(["routes"])
    assert governor.of("routes").breaker == "closed"
    assert governor.blocked("routes", 603.0) is None


def test_retry_budget_limits_attempts_per_window() -> None:
    governor = Governor(HealingOptions(retry_budget=2, retry_window=60))
    governor.record_attempt("addresses", 0.0)
    governor.record_attempt("addresses", 1.0)
    reason = governor.blocked("addresses", 2.0)
    assert reason is not None and "retry budget" in reason
    assert governor.blocked("addresses", 61.0) is None


def test_flaps_count_only_changes_written_outside_the_kernel() -> None:
    governor = Governor(HealingOptions(flap_threshold=3, flap_window=60))
    gone: dict[str, Any] = {ADDRESSES: []}
    for t in range(5):  # the kernel flushing it (no writer) never makes it contested
        assert governor.observe("addresses", gone, float(2 * t), {}) == []
        assert governor.observe("addresses", {}, float(2 * t + 1), {}) == []
    writer = {ADDRESSES: "RTM_DELADDR from ip (port 77)"}
    newly = []
    for t in range(10, 13):
        newly += governor.observe("addresses", gone, float(2 * t), writer)
        governor.observe("addresses", {}, float(2 * t + 1), {})
    assert [path for path, _ in newly] == [ADDRESSES]
    assert "someone else is writing" in newly[0][1]["reason"]
    assert "ip" in newly[0][1]["reason"]


# -- the loop over FakeNetlink -----------------------------------------------
def test_auto_heals_with_attribution_notify_only_reports(rig: Rig) -> None:
    rig.delete_address()
    report = rig.loop.run_pass()
    assert report.healed["addresses"]
    assert rig.has_address()
    healed = rig.audit("reconcile")[-1]["details"]
    assert healed["outcome"] == "healed"
    assert healed["attribution"][0]["message"] == "RTM_DELADDR"
    assert healed["attribution"][0]["sender"] == "ip"

    assert rig.apply(convergence={"default": "notify"})["ok"]
    rig.delete_address()
    report = rig.loop.run_pass()
    assert "addresses" not in report.healed
    assert "policy notify" in report.held["addresses"]
    assert not rig.has_address()
    inputs = rig.loop.status_inputs()
    assert inputs["attribution"]["addresses"][0]["message"] == "RTM_DELADDR"
    assert "addresses" in inputs["drift_since"]
    assert inputs["policies"]["addresses"]["policy"] == "notify"


def test_resync_finds_drift_without_any_event(rig: Rig) -> None:
    rig.net.del_address("lan0", LAN)
    rig.clock.advance(60)
    report = rig.loop.run_pass()
    assert report.healed["addresses"]
    drift = rig.audit("reconcile")[-1]["details"]["attribution"][0]
    assert drift["message"] is None and "resync" in drift["detail"]


def test_unhealable_drift_backs_off_opens_breaker_and_new_apply_closes_it(tmp_path: Path) -> None:
    rig = Rig(tmp_path, HealingOptions(jitter=0.0, breaker_threshold=3))
    assert rig.apply()["ok"]
    rig.net.fail_on["add address"] = NetlinkError("add address", "No such device", errno.ENODEV)
    rig.delete_address()
    backoffs = []
    for _ in range(3):
        report = rig.loop.run_pass()
        assert "addresses" in report.failed
        backoffs.append(rig.policies()["backoff_seconds"])
        held = rig.loop.run_pass().held["addresses"]  # before the back-off passes: held
        assert "backing off" in held or "breaker" in held
        rig.clock.advance(rig.policies()["backoff_seconds"] * 1.01)
    assert backoffs == [1, 2, 4]
    assert rig.policies()["breaker"] == "open"
    failure = rig.loop.status_inputs()["reconcile_failures"]["addresses"]
    assert failure["breaker"] == "open" and "No such device" in failure["detail"]
    assert "circuit breaker open" in rig.loop.run_pass().held["addresses"]
    assert len(rig.audit("breaker_opened")) == 1

    del rig.net.fail_on["add address"]
    assert rig.apply(interfaces=[{"name": "lan0", "mtu": 1450, "addresses": [LAN]}])["ok"]
    assert rig.policies()["breaker"] == "closed"
    assert rig.loop.status_inputs()["reconcile_failures"] == {}
    assert rig.has_address()


def test_reconcile_now_closes_the_breaker_and_heals(tmp_path: Path) -> None:
    rig = Rig(tmp_path, HealingOptions(jitter=0.0, breaker_threshold=1))
    assert rig.apply()["ok"]
    rig.net.fail_on["add address"] = NetlinkError("add address", "busy", errno.EBUSY)
    rig.delete_address()
    rig.loop.run_pass()
    assert rig.policies()["breaker"] == "open"
    del rig.net.fail_on["add address"]
    result = rig.loop.reconcile_now("addresses", actor="test")
    assert result["ok"] and result["breakers_closed"] == ["addresses"]
    assert rig.has_address()
    assert rig.policies()["breaker"] == "closed"


def test_competing_writer_is_contested_and_no_longer_healed(rig: Rig) -> None:
    for _ in range(3):
        rig.delete_address()
        rig.loop.run_pass()  # heals
        rig.loop.run_pass()  # sees it back in sync
        rig.clock.advance(1)
    assert rig.policies()["contested"] == [ITEM]  # the one address, not the list
    assert not rig.has_address()  # the third return was not healed
    rig.clock.advance(120)
    report = rig.loop.run_pass()
    assert report.drift["addresses"] == [ADDRESSES]  # detection continues
    assert "contested" in report.held["addresses"]
    assert not rig.has_address()
    assert "someone else is writing" in rig.policies()["reason"]
    assert rig.audit("contested")[0]["details"]["path"] == ITEM
    # it survives a restart of the agent
    assert rig.new_loop().status_inputs()["policies"]["addresses"]["contested"] == [ITEM]


def test_ack_stops_healing_until_it_expires_by_itself(rig: Rig) -> None:
    answer = rig.loop.acknowledge("addresses", 3600, "maintenance", actor="test")
    assert answer["ok"]
    rig.delete_address()
    report = rig.loop.run_pass()
    assert "acknowledged until" in report.held["addresses"]
    assert report.drift["addresses"] == [ADDRESSES]
    assert rig.policies()["acknowledged_until"] == answer["until"]
    assert rig.new_loop().status_inputs()["policies"]["addresses"]["acknowledged_until"]
    rig.clock.advance(3599)
    assert "addresses" not in rig.loop.run_pass().healed
    assert rig.loop._timeout() <= 1.01  # the loop wakes itself at the expiry
    rig.clock.advance(1)
    assert rig.loop.run_pass().healed["addresses"]
    assert rig.has_address()
    assert [r["event"] for r in rig.state.audit.records()].count("ack_expired") == 1
    assert rig.policies()["acknowledged_until"] is None


# -- confirm-or-rollback --------------------------------------------------------
def test_confirm_within_the_window_keeps_the_version(rig: Rig) -> None:
    document = parse_document(base_document(routes=[], interfaces=[{"name": "lan0"}]))
    result = rig.requests.apply(document, actor="test", confirm_within=30)
    assert result["ok"] and result["pending_confirmation"]["version"] == 2
    assert read_pending(rig.state) is not None
    rig.clock.advance(10)
    assert rig.loop.confirm(actor="test")["ok"]
    assert read_pending(rig.state) is None
    rig.clock.advance(60)
    rig.loop.run_pass()
    assert rig.state.applied().version == 2
    assert not rig.has_address()


def test_missed_confirmation_rolls_back_to_the_last_confirmed_version(rig: Rig) -> None:
    document = parse_document(base_document(routes=[], interfaces=[{"name": "lan0"}]))
    assert rig.requests.apply(document, actor="test", confirm_within=30)["ok"]
    assert not rig.has_address()
    rig.clock.advance(31)
    rig.loop.run_pass()
    assert rig.state.applied().version == 3
    assert rig.has_address()
    assert read_pending(rig.state) is None
    assert rig.audit("confirm_timeout")[0]["details"]["rolled_back_to_revision"] == 1
    assert not rig.loop.confirm(actor="test")["ok"]


def test_unsafe_management_change_is_refused_without_confirm_within(rig: Rig) -> None:
    spec = base_document(routes=[])
    spec["spec"]["management"]["addresses"] = ["198.51.100.9/24"]
    result = rig.requests.apply(parse_document(spec), actor="test")
    assert not result["ok"] and result["outcome"] == "refused"
    assert "removes management address 198.51.100.2/24" in result["failed"]["management"]
    assert rig.state.applied().version == 1
    previous = parse_document(base_document())
    assert unsafe_management_changes(previous, previous) == []


def test_settle_at_startup_rolls_back_expired_and_drops_stale(rig: Rig) -> None:
    document = parse_document(base_document(routes=[], interfaces=[{"name": "lan0"}]))
    assert rig.requests.apply(document, actor="test", confirm_within=30)["ok"]
    pending = read_pending(rig.state)
    assert pending is not None
    assert decide(pending, 2, rig.clock() + 1) == "waiting"
    assert decide(pending, 1, rig.clock() + 1) == "stale"
    assert decide(pending, 5, rig.clock() + 1) == "superseded"
    with rig.engine.writer("recovery", "test"):
        assert "awaits confirmation" in str(settle_at_startup(rig.engine, rig.clock() + 1))
        detail = settle_at_startup(rig.engine, rig.clock() + 31)
    assert detail is not None and "rolled back to revision 1" in detail
    assert rig.has_address()
    # A crash during a guarded apply that recovery rolled back leaves a stale record.
    write_pending(
        rig.state, {**pending, "state": "applying", "version": None, "confirmed_version": 3}
    )
    with rig.engine.writer("recovery", "test"):
        assert "stale" in str(settle_at_startup(rig.engine, rig.clock()))
    assert read_pending(rig.state) is None


# -- dependencies: a dependent waits, it does not fail --------------------------------
def test_routes_wait_on_acknowledged_addresses_and_never_open_the_breaker(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path, HealingOptions(jitter=0.0, breaker_threshold=2))
    routes = [{"to": "192.0.2.0/24", "via": "203.0.113.254"}]
    assert rig.requests.apply(parse_document(base_document(routes=routes)), actor="test")["ok"]
    assert rig.loop.acknowledge("addresses", 3600, "rewiring lan0", actor="test")["ok"]
    rig.delete_address()  # the kernel flushes the route through it as well
    assert not [r for r in rig.net.route_table if r.to == "192.0.2.0/24"]
    for _ in range(5):
        report = rig.loop.run_pass()
        rig.clock.advance(30)
        assert "addresses" not in report.healed and "routes" not in report.failed
        assert report.waiting["routes"].startswith("waiting on addresses: acknowledged")
    routes_entry = rig.loop.status_inputs()["policies"]["routes"]
    assert routes_entry["breaker"] == "closed" and routes_entry["consecutive_failures"] == 0
    assert not rig.audit("breaker_opened")
    # Once addresses converge, routes heal in the same transaction.
    report = rig.loop.reconcile_now("addresses", actor="test")
    assert report["ok"], report
    report = rig.loop.run_pass()
    assert rig.has_address()
    assert [r for r in rig.net.route_table if r.to == "192.0.2.0/24"]


def test_a_failing_dependency_makes_its_dependents_wait_inside_the_heal(rig: Rig) -> None:
    routes = [{"to": "192.0.2.0/24", "via": "203.0.113.254"}]
    assert rig.requests.apply(parse_document(base_document(routes=routes)), actor="test")["ok"]
    rig.net.fail_on["add address"] = NetlinkError("add address", "No such device", errno.ENODEV)
    rig.delete_address()
    report = rig.loop.run_pass()
    assert "addresses" in report.failed
    assert report.waiting["routes"].startswith("waiting on addresses")
    assert "routes" not in report.failed
    assert rig.loop.status_inputs()["policies"]["routes"]["consecutive_failures"] == 0
    waiting = [r for r in rig.audit("reconcile") if r["details"]["outcome"] == "waiting"]
    assert waiting and waiting[-1]["details"]["subsystem"] == "routes"


def test_a_subsystem_that_cannot_be_observed_does_not_stop_the_pass(rig: Rig) -> None:
    from trueup.system.fake import FakeFiles

    class Unreadable(FakeFiles):
        def read(self, path: str) -> str | None:
            raise PermissionError(13, f"{path}: Permission denied")

    rig.engine.files = Unreadable()
    document = parse_document(base_document(routes=[], sysctl={"net.ipv4.ip_forward": 1}))
    result = rig.requests.apply(document, actor="test", mode="best-effort")
    assert result["outcome"] == "partial"
    rig.delete_address()
    report = rig.loop.run_pass()
    assert "Permission denied" in report.unobservable["sysctl"]
    assert report.healed["addresses"] and rig.has_address()


def test_a_tick_is_not_a_notification_and_looks_only_where_it_was_asked(rig: Rig) -> None:
    from trueup.system.fake import FakeFiles

    rig.loop._on_event(NetlinkEvent("tick", "tick", rig.clock()))
    assert rig.loop.counters["ticks"] == 1 and rig.loop.counters["events"] == 0
    assert rig.apply()["ok"]
    assert rig.loop._ticking() == []  # no spec.sysctl: a tick costs nothing
    rig.engine.files = FakeFiles({"/proc/sys/net/ipv4/ip_forward": "0\n"})
    document = parse_document(base_document(routes=[], sysctl={"net.ipv4.ip_forward": 1}))
    assert rig.requests.apply(document, actor="test")["ok"]
    assert rig.loop._ticking() == ["sysctl"]
    rig.engine.files.files["/proc/sys/net/ipv4/ip_forward"] = "0\n"  # type: ignore[attr-defined]
    rig.delete_address()  # drift elsewhere is left to its own notification
    report = rig.loop.run_pass(names=["sysctl"])
    assert report.healed == {"sysctl": report.healed["sysctl"]}
    assert not rig.has_address()


def test_a_guarded_apply_that_committed_before_a_crash_can_still_be_confirmed(rig: Rig) -> None:
    assert rig.apply()["ok"]
    # The record is written before the apply; the crash came after its commit.
    write_pending(
        rig.state,
        {
            "state": "applying",
            "version": None,
            "confirmed_version": 1,
            "deadline": rig.clock() + 60,
            "deadline_at": "2027-01-15T08:00:00.000Z",
            "actor": "test",
            "created_at": "2027-01-15T07:59:00.000Z",
        },
    )
    assert rig.apply(interfaces=[{"name": "lan0"}])["ok"]  # version 2 commits
    loop = rig.new_loop()  # the restart
    assert read_pending(rig.state)["state"] == "pending"
    answer = loop.confirm(actor="test")
    assert answer["ok"] and answer["version"] == 2


def test_a_failing_recovery_of_an_open_transaction_does_not_stop_the_pass(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    applied = rig.engine.applied_document()
    assert applied is not None
    rig.engine.state.journal.begin(
        kind="apply",
        version=2,
        subsystems=["addresses"],
        all_subsystems=["addresses"],
        scope={
            "interfaces": ["lan0"],
            "tables": [254],
            "management_interface": "mgmt0",
            "management_owned": [],
            "management_default_routes": [],
        },
        before={},
        previous_applied=rig.engine.state.applied().to_json(),
    )

    def broken(**_: Any) -> None:
        raise RuntimeError("a preparation nobody expected to raise")

    monkeypatch.setattr(rig.engine, "recover", broken)
    rig.delete_address()
    report = rig.loop.run_pass()  # the timer's recovery fails; the pass still heals
    assert report.skipped is None and not report.failed, report
    assert rig.has_address()  # the heal recovered and converged it (no exception escaped)
