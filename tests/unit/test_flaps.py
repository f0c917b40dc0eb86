"""Flap detection, management fights, writer attribution and link storms, over the fakes.

FakeNetlink and a fake clock (the `system/` seam): no root, no waiting.
"""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_loop import LAN, Rig
from trueup.reconcile.attribution import UNIDENTIFIED, item_paths, outside_writer, writers
from trueup.reconcile.engine.execute import pinned as _pinned
from trueup.reconcile.healing import MANAGEMENT_BACKOFF_CAP, Governor, HealingOptions
from trueup.subsystems.base import Difference, Scope
from trueup.system import rawnl, rtnl
from trueup.system.events import NetlinkEvent, event_from_message
from trueup.system.netlink import NetlinkError

MGMT = "198.51.100.2/24"
MGMT_ITEM = f"spec.management.addresses[{MGMT}]"
V6 = "2001:db8:1::1/64"
LAN_ADDRESSES = "spec.interfaces[lan0].addresses"


def _event(
    message: str,
    at: float,
    *,
    ifname: str = "lan0",
    address: str | None = None,
    port: int = 0,
    flags: tuple[str, ...] = ("permanent",),
    kind: str = "address",
) -> NetlinkEvent:
    detail: dict[str, Any] = {"address_flags": list(flags)} if kind == "address" else {}
    return NetlinkEvent(
        kind,
        message,
        at,
        ifname=ifname,
        address=address,
        sender_port=port,
        sender="ip" if port else None,
        detail=detail,
    )


def _delete(rig: Rig, ifname: str, prefix: str, port: int = 4242) -> None:
    rig.net.del_address(ifname, prefix)
    rig.events.emit(_event("RTM_DELADDR", rig.clock(), ifname=ifname, address=prefix, port=port))


def _has(rig: Rig, ifname: str, prefix: str) -> bool:
    return any(a.ifname == ifname and a.prefix == prefix for a in rig.net.addrs)


def _policy(rig: Rig, name: str) -> dict[str, Any]:
    entry: dict[str, Any] = rig.loop.status_inputs()["policies"][name]
    return entry


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    rig = Rig(tmp_path, HealingOptions(jitter=0.0, flap_threshold=3, flap_window=60))
    document = {"interfaces": [{"name": "lan0", "mtu": 1400, "addresses": [LAN, V6]}]}
    assert rig.apply(**document)["ok"]
    return rig


# -- attribution -------------------------------------------------------------
def test_ipv6_port_zero_deletion_of_a_permanent_address_is_an_unidentified_writer() -> None:
    deleted = _event("RTM_DELADDR", 100.0, address=V6)
    assert outside_writer(deleted) == UNIDENTIFIED
    assert "kernel" not in UNIDENTIFIED and "port 0" in UNIDENTIFIED
    # the kernel's own: a link change around it, a failed DAD, an IPv4 or non-permanent one
    link_down = _event("RTM_NEWLINK", 100.5, kind="link", port=77)
    assert outside_writer(deleted, [link_down, deleted]) is None
    assert (
        outside_writer(_event("RTM_DELADDR", 100.0, address=V6, flags=("permanent", "dadfailed")))
        is None
    )
    assert outside_writer(_event("RTM_DELADDR", 100.0, address=V6, flags=())) is None
    assert outside_writer(_event("RTM_DELADDR", 100.0, address=LAN)) is None
    assert outside_writer(_event("RTM_DELADDR", 100.0, address=LAN, port=77)) == "ip"


def test_the_kernels_own_ipv6_announcements_blame_nobody() -> None:
    # A link-local address (addrconf's) and the end of DAD (the same address announced
    # again, after a `tentative` announcement) are the kernel's, however long after the link.
    link_local = _event("RTM_NEWADDR", 100.0, address="fe80::1/64")
    assert outside_writer(link_local) is None
    assert outside_writer(_event("RTM_DELADDR", 100.0, address="fe80::1/64")) is None
    tentative = _event("RTM_NEWADDR", 100.0, address=V6, flags=("permanent", "tentative"))
    done = _event("RTM_NEWADDR", 103.0, address=V6)
    assert outside_writer(done, [tentative, done]) is None
    # A deletion in between: the next announcement is a new address again.
    deleted = _event("RTM_DELADDR", 101.0, address=V6)
    assert outside_writer(done, [tentative, deleted, done]) == UNIDENTIFIED
    assert outside_writer(deleted, [tentative, deleted, done]) == UNIDENTIFIED


def test_a_writer_is_named_with_its_port_once() -> None:
    scope = Scope(interfaces=frozenset({"lan0"}), management_interface="mgmt0")
    diff = Difference("addresses", LAN_ADDRESSES, [LAN, V6], [LAN], missing=[V6])
    found = writers([diff], scope, {"address"}, [(1, _event("RTM_DELADDR", 20.0, address=V6))])
    assert found[f"{LAN_ADDRESSES}[{V6}]"] == f"RTM_DELADDR from {UNIDENTIFIED}"
    named = _event("RTM_DELADDR", 20.0, address=V6, port=77)
    found = writers([diff], scope, {"address"}, [(1, named)])
    assert found[f"{LAN_ADDRESSES}[{V6}]"] == "RTM_DELADDR from ip (port 77)"


def test_writers_name_the_one_address_not_the_interface() -> None:
    scope = Scope(interfaces=frozenset({"lan0"}), management_interface="mgmt0")
    diff = Difference("addresses", LAN_ADDRESSES, [LAN, V6], [LAN], missing=[V6])
    assert item_paths([diff]) == {f"{LAN_ADDRESSES}[{V6}]": "absent"}
    events = [
        (1, _event("RTM_NEWLINK", 10.0, kind="link", port=99)),  # names lan0, not the address
        (2, _event("RTM_DELADDR", 20.0, address=V6)),
    ]
    found = writers([diff], scope, {"address", "link"}, events)
    assert list(found) == [f"{LAN_ADDRESSES}[{V6}]"]
    assert UNIDENTIFIED in found[f"{LAN_ADDRESSES}[{V6}]"]
    # a link writer alone never makes the address "written"
    assert writers([diff], scope, {"address", "link"}, events[:1]) == {}


def test_a_contested_item_pins_only_itself() -> None:
    desired = {LAN_ADDRESSES: sorted([LAN, V6]), "other": 1}
    observed = {LAN_ADDRESSES: [LAN], "other": 2}
    target = _pinned(desired, observed, [f"{LAN_ADDRESSES}[{V6}]"])
    assert target == {LAN_ADDRESSES: [LAN], "other": 1}
    # an extra contested item stays; the missing one is still added
    target = _pinned(
        {LAN_ADDRESSES: [LAN]},
        {LAN_ADDRESSES: ["203.0.113.9/24"]},
        [f"{LAN_ADDRESSES}[203.0.113.9/24]"],
    )
    assert target == {LAN_ADDRESSES: sorted([LAN, "203.0.113.9/24"])}


# -- the governor: management is never held ------------------------------------
def test_management_breaker_never_opens_and_backoff_stays_short() -> None:
    governor = Governor(HealingOptions(breaker_threshold=2, retry_budget=2, jitter=0.2))
    for t in range(20):
        assert governor.record_failure("management", float(t), "boom", ["p"]) is False
        governor.record_attempt("management", float(t))
        heal = governor.of("management")
        assert heal.breaker == "closed"
        assert heal.next_attempt_at is not None
        assert heal.next_attempt_at - t <= MANAGEMENT_BACKOFF_CAP
    governor.acknowledge("management", 0.0, 3600, "ignored", "test")
    assert governor.blocked("management", 20.0 + MANAGEMENT_BACKOFF_CAP) is None


def test_management_is_fought_never_contested() -> None:
    governor = Governor(HealingOptions(flap_threshold=3, flap_window=60))
    writer = {MGMT_ITEM: "RTM_DELADDR from ip (port 7)"}
    newly = []
    for t in range(6):
        newly += governor.observe("management", {MGMT_ITEM: "absent"}, float(2 * t), writer)
        governor.observe("management", {}, float(2 * t + 1), {})
    assert governor.contested("management") == {}
    assert [(path, record["kind"]) for path, record in newly] == [(MGMT_ITEM, "fought")]
    fought = governor.of("management").fought[MGMT_ITEM]
    assert fought["flips"] == 6 and "keeps restoring" in fought["reason"]
    # quiet for the flap window: no longer reported
    assert governor.expire_contested(10.0 + 59) == []
    assert [p for _, p, _ in governor.expire_contested(10.0 + 60)] == [MGMT_ITEM]


# -- the loop ----------------------------------------------------------------
def test_a_writer_fighting_management_is_restored_every_time_and_reported(rig: Rig) -> None:
    reports: list[int] = []
    rig.loop.on_fought.append(lambda: reports.append(1))
    for _ in range(8):
        _delete(rig, "mgmt0", MGMT)
        rig.loop.run_pass()
        assert _has(rig, "mgmt0", MGMT)  # restored, every time
        rig.loop.run_pass()
        rig.clock.advance(0.1)
    policy = _policy(rig, "management")
    assert policy["contested"] == []
    assert MGMT_ITEM in policy["fought"] and "keeps restoring" in policy["reason"]
    assert reports == [1]  # reported upstream once, when the fight was found
    assert [r["details"]["path"] for r in rig.audit("management_fought")] == [MGMT_ITEM]
    assert rig.audit("contested") == []
    refused = rig.loop.acknowledge("management", 3600, "quiet please", actor="test")
    assert not refused["ok"] and "always restores" in refused["message"]


def test_a_contested_address_does_not_stop_healing_of_its_neighbours(rig: Rig) -> None:
    item = f"{LAN_ADDRESSES}[{V6}]"
    for _ in range(3):
        _delete(rig, "lan0", V6, port=0)  # IPv6: the kernel names no sender
        rig.loop.run_pass()
        rig.loop.run_pass()
        rig.clock.advance(1)
    assert _policy(rig, "addresses")["contested"] == [item]
    writer = rig.audit("contested")[0]["details"]["writer"]
    assert UNIDENTIFIED in writer and "kernel" not in writer
    assert not _has(rig, "lan0", V6)
    _delete(rig, "lan0", LAN)  # another address on the same interface
    report = rig.loop.run_pass()
    assert report.healed["addresses"]
    assert _has(rig, "lan0", LAN)
    assert not _has(rig, "lan0", V6)  # still left alone


def test_a_contested_path_clears_once_its_writer_is_quiet_for_the_flap_window(rig: Rig) -> None:
    item = f"{LAN_ADDRESSES}[{LAN}]"
    for _ in range(3):
        _delete(rig, "lan0", LAN)
        rig.loop.run_pass()
        rig.loop.run_pass()
        rig.clock.advance(1)
    assert _policy(rig, "addresses")["contested"] == [item]
    rig.clock.advance(30)
    rig.loop.run_pass()
    assert not _has(rig, "lan0", LAN)
    assert rig.loop.governor.next_due(rig.clock()) is not None  # the loop wakes for it
    rig.clock.advance(31)
    report = rig.loop.run_pass()
    assert report.healed["addresses"]
    assert _has(rig, "lan0", LAN)
    assert _policy(rig, "addresses")["contested"] == []
    assert [r["details"]["path"] for r in rig.audit("contested_cleared")] == [item]


def test_a_route_heal_failing_while_its_link_changes_waits_and_does_not_count(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path, HealingOptions(jitter=0.0, breaker_threshold=2))
    document = {"interfaces": [{"name": "lan0", "mtu": 1400, "addresses": [LAN]}]}
    assert rig.apply(**document)["ok"]
    error = NetlinkError("add address", "Network is unreachable", errno.ENETUNREACH)

    def link_goes_down_while_healing(*_args: Any) -> None:
        rig.events.emit(_event("RTM_NEWLINK", rig.clock(), kind="link", port=99))
        raise error

    rig.net.fail_on["add address"] = error
    original = rig.net.add_address
    rig.net.add_address = link_goes_down_while_healing  # type: ignore[method-assign]
    for _ in range(4):
        rig.net.del_address("lan0", LAN)
        report = rig.loop.run_pass()
        assert "addresses" not in report.failed
        assert "changed" in report.waiting["addresses"]
    assert _policy(rig, "addresses")["breaker"] == "closed"
    assert _policy(rig, "addresses")["consecutive_failures"] == 0
    rig.net.add_address = original  # type: ignore[method-assign]
    del rig.net.fail_on["add address"]
    assert rig.loop.run_pass().healed["addresses"]


def test_an_open_breaker_half_opens_when_a_managed_link_returns(tmp_path: Path) -> None:
    rig = Rig(tmp_path, HealingOptions(jitter=0.0, breaker_threshold=1, breaker_cooldown=600))
    assert rig.apply()["ok"]
    rig.net.fail_on["add address"] = NetlinkError("add address", "busy", errno.EBUSY)
    rig.net.del_address("lan0", LAN)
    assert "addresses" in rig.loop.run_pass().failed
    assert _policy(rig, "addresses")["breaker"] == "open"
    del rig.net.fail_on["add address"]
    assert "circuit breaker open" in rig.loop.run_pass().held["addresses"]
    rig.events.emit(_event("RTM_NEWLINK", rig.clock(), kind="link", port=99))
    report = rig.loop.run_pass()  # well within the cool-down
    assert report.healed["addresses"]
    assert _has(rig, "lan0", LAN)
    assert _policy(rig, "addresses")["breaker"] == "closed"


def test_a_failure_without_evidence_names_paths_and_no_other_writer(rig: Rig) -> None:
    healer = rig.loop.healer
    diff = Difference("addresses", LAN_ADDRESSES, [LAN], [], missing=[LAN])
    error = f"still differs after 3 passes: {LAN_ADDRESSES}"
    rig.loop.drifts.pass_context = (
        Scope(interfaces=frozenset({"lan0"}), management_interface="mgmt0"),
        0,
    )
    assert healer._blame("addresses", error, {"addresses": [diff]}) == error
    rig.events.emit(_event("RTM_DELADDR", rig.clock(), address=LAN, port=4242))
    blamed = healer._blame("addresses", error, {"addresses": [diff]})
    assert blamed.startswith(error) and "something else is changing it" in blamed
    assert "RTM_DELADDR from ip" in blamed


def test_trueups_own_writes_are_never_another_writer() -> None:
    own = NetlinkEvent(
        "route", "RTM_NEWROUTE", 1.0, destination="192.0.2.0/24", sender_port=4321, own=True
    )
    assert outside_writer(own) is None
    assert own.to_json()["sender"] == "trueup (this agent, outside a transaction)"
    named = NetlinkEvent(
        "route",
        "RTM_NEWROUTE",
        1.0,
        destination="192.0.2.0/24",
        sender_port=4321,
        own=True,
        writer="trueup heal 20261130T100000Z-abc123",
    )
    assert outside_writer(named) is None
    assert named.to_json()["sender"] == "trueup heal 20261130T100000Z-abc123"


def test_a_returning_link_restarts_the_retry_budget() -> None:
    governor = Governor(HealingOptions(retry_budget=2, retry_window=600))
    governor.record_attempt("routes", 0.0)
    governor.record_attempt("routes", 1.0)
    assert "retry budget" in (governor.blocked("routes", 2.0) or "")
    governor.link_returned("routes", 2.0)
    assert governor.blocked("routes", 2.0) is None


def test_an_interrupted_heal_is_reported_after_recovery(tmp_path: Path) -> None:
    from tests.routers import base_document
    from trueup.journal.state import StateDir
    from trueup.model.document import parse_document
    from trueup.model.reasons import ReasonCode
    from trueup.reconcile.engine import Engine
    from trueup.reconcile.engine import observe as observing
    from trueup.reconcile.status import gather
    from trueup.system.fake import FakeNetlink

    kernel = FakeNetlink({"mgmt0": 1500, "lan0": 1500})
    state = StateDir(tmp_path / "state")
    state.ensure()
    engine = Engine(state, netlink_factory=lambda: kernel)
    engine.apply_document(parse_document(base_document()))
    scope_json = json.loads(json.dumps(state.journal.transactions()[0].begin["scope"]))
    with engine.sources() as net:
        current = observing.observe(engine, net, Scope.from_json(scope_json))
    # A heal killed mid-way: a `reconcile` begin, no terminal record.
    state.journal.begin(
        kind="reconcile",
        version=1,
        subsystems=["addresses"],
        scope=scope_json,
        before=current,
        previous_applied=state.applied().to_json(),
    )
    assert engine.recover() is not None
    findings = gather(engine)["reason_codes"]
    assert [f["code"] for f in findings] == [ReasonCode.APPLY_NOT_COMPLETED.value]
    assert findings[0]["detail"].startswith("heal ") and "interrupted" in findings[0]["detail"]
    # the next apply starts over
    engine.apply_document(parse_document(base_document(routes=[])))
    assert gather(engine)["reason_codes"] == []


def test_a_recovered_heal_is_reported_but_is_not_drift() -> None:
    from trueup.reconcile.status import drift_report

    finding = {
        "code": "STATE_APPLY_NOT_COMPLETED",
        "evidence": {
            "transaction": {"kind": "reconcile", "recovered": True},
            "recovery_complete": True,
        },
    }
    status = {
        "subsystems": {},
        "reason_codes": [finding],
        "observed_at": "t",
        "versions": {"applied": 1},
    }
    assert drift_report(status)["in_sync"] is True
    # a recovery that could not converge everything back is drift
    finding["evidence"]["recovery_complete"] = False
    assert drift_report(status)["in_sync"] is False


def test_a_contested_item_of_a_list_of_objects_pins_only_itself() -> None:
    rule_a, rule_b, rule_x = {"n": 1}, {"n": 2}, {"n": 9}
    path = "spec.firewall.rules"
    contested = f'{path}[{{"n":9}}]'
    target = _pinned({path: [rule_a, rule_b]}, {path: [rule_a, rule_x]}, [contested])
    assert target == {path: [rule_a, rule_b, rule_x]}  # the extra one stays, the rest converge


def _v6_notification(message: str, prefix: str = V6) -> NetlinkEvent:
    """An IPv6 address notification as the kernel sends it: port 0, a permanent address."""
    encoded = rawnl.add_address_request(1, 2, prefix)
    encoded = encoded[:18] + bytes([0x80]) + encoded[19:]  # ifa_flags: IFA_F_PERMANENT
    kind = rawnl.RTM_NEWADDR if message == "RTM_NEWADDR" else rawnl.RTM_NEWADDR + 1
    event = event_from_message(kind, encoded, 0, 100.0, {2: "lan0"})
    assert event is not None and event.message == message
    return event


def test_trueups_own_ipv6_address_writes_are_never_another_writer() -> None:
    """The kernel names no sender for IPv6 address changes: trueup's own are known as its own."""
    prefix = "2001:db8:7::1/64"
    assert outside_writer(_v6_notification("RTM_NEWADDR", prefix)) == UNIDENTIFIED
    rtnl.note_own_address_write("RTM_NEWADDR", prefix)
    added = _v6_notification("RTM_NEWADDR", prefix)
    assert added.own and outside_writer(added) is None
    # DAD completing announces it again: still trueup's own add
    assert outside_writer(_v6_notification("RTM_NEWADDR", prefix)) is None
    # someone deleting it right after is another writer, and ends the claim
    assert outside_writer(_v6_notification("RTM_DELADDR", prefix)) == UNIDENTIFIED
    assert outside_writer(_v6_notification("RTM_NEWADDR", prefix)) == UNIDENTIFIED


def test_management_contested_by_an_older_agent_is_restored_after_an_upgrade(rig: Rig) -> None:
    """A `reconcile.json` from before management was exempt names its paths contested."""
    old = {
        "value": "absent",
        "flips": 3,
        "since": "2026-11-01T00:00:00Z",
        "writer": "RTM_DELADDR from ip (port 7)",
        "reason": "someone else is writing it; trueup stopped healing it",
    }
    saved = rig.loop.governor.to_json()
    saved["subsystems"].setdefault("management", {})["contested"] = {
        "spec.management.addresses": old
    }
    rig.state.write("reconcile.json", saved)
    loop = rig.new_loop()
    assert loop.governor.contested("management") == {}
    assert "spec.management.addresses" in loop.governor.of("management").fought
    _delete(rig, "mgmt0", MGMT)
    loop.run_pass()
    assert _has(rig, "mgmt0", MGMT)


def test_a_fought_management_finding_never_advises_ack_or_reconcile() -> None:
    from trueup.reconcile.status import _fought_findings

    record = {"flips": 5, "since": "2026-01-01T00:00:00.000Z", "writer": "RTM_DELADDR from ip"}
    (finding,) = _fought_findings({MGMT_ITEM: record})
    assert finding.subsystem == "management" and finding.paths == [MGMT_ITEM]
    assert "trueup ack" not in finding.action and "trueup reconcile" not in finding.action
    assert "keeps restoring" in finding.action


def test_a_mistyped_knob_keeps_its_default_and_is_named(caplog: pytest.LogCaptureFixture) -> None:
    env = {
        "TRUEUP_FLAP_THRESHOLD": "abc",
        "TRUEUP_RESYNC_SECONDS": "0",
        "TRUEUP_RETRY_BUDGET": "0.5",
        "TRUEUP_BREAKER_COOLDOWN": "-1",
        "TRUEUP_FLAP_WINDOW": "nan",
        "TRUEUP_BACKOFF_JITTER": "0",
        "TRUEUP_BREAKER_THRESHOLD": "7",
    }
    with caplog.at_level("ERROR", logger="trueup.reconcile"):
        options = HealingOptions.from_env(env)
    d = HealingOptions()
    assert options.flap_threshold == d.flap_threshold
    assert options.resync_seconds == d.resync_seconds
    assert options.retry_budget == d.retry_budget
    assert options.breaker_cooldown == d.breaker_cooldown
    assert options.flap_window == d.flap_window
    assert options.jitter == 0.0 and options.breaker_threshold == 7
    logged = " ".join(r.getMessage() for r in caplog.records)
    for name in ("FLAP_THRESHOLD", "RESYNC_SECONDS", "RETRY_BUDGET", "BREAKER_COOLDOWN"):
        assert f"TRUEUP_{name}=" in logged, logged
