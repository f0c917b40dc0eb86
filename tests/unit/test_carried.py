"""Failing subsystems carried by writes that leave them unchanged, and settled once in sync.

The loop's `Rig` (FakeNetlink, fake clock): `addresses` fails because the
fake kernel refuses addresses on lan0, until the test lets it.
"""

from __future__ import annotations

import errno
import threading
from pathlib import Path
from typing import Any

from tests.routers import base_document
from tests.unit.test_loop import LAN, Rig
from trueup.model.document import parse_document
from trueup.reconcile.status import build_status
from trueup.system.netlink import NetlinkError

LAN6 = "2001:db8:1::1/64"


def _failing_addresses(tmp_path: Path) -> Rig:
    """A rig whose first (best-effort) apply left `addresses` failing."""
    rig = Rig(tmp_path)
    rig.net.fail_on["on lan0"] = NetlinkError("add address", "Permission denied", errno.EPERM)
    answer = rig.requests.apply(parse_document(base_document(routes=[])), mode="best-effort")
    assert answer["outcome"] == "partial" and "addresses" in answer["failed"], answer
    assert "addresses" in rig.engine.failing
    return rig


def _with_route(**spec: Any) -> dict[str, Any]:
    document = base_document(routes=[{"to": "192.0.2.0/24", "via": "198.51.100.1"}], **spec)
    return document


def _health(rig: Rig, name: str) -> tuple[str, str]:
    entry = build_status(rig.engine, loop=rig.loop.view()).to_json()["subsystems"][name]
    return entry["health"], entry["reason"]


def test_an_atomic_apply_carries_a_failing_subsystem_it_leaves_unchanged(tmp_path: Path) -> None:
    rig = _failing_addresses(tmp_path)
    answer = rig.requests.apply(parse_document(_with_route()), actor="test")
    assert answer["ok"] and answer["outcome"] == "committed", answer
    assert "addresses" in answer["carried"], answer
    assert rig.state.applied().carried.keys() == {"addresses"}
    health, reason = _health(rig, "addresses")
    assert health == "failed" and "Permission denied" in reason, reason


def test_a_carried_subsystem_that_recovers_by_itself_is_failing_no_more(tmp_path: Path) -> None:
    rig = _failing_addresses(tmp_path)
    assert rig.requests.apply(parse_document(_with_route()), actor="test")["ok"]
    # Someone else puts the addresses in place: in sync, and nothing left to heal.
    rig.net.fail_on.clear()
    rig.net.add_address("lan0", LAN)
    rig.net.add_address("lan0", LAN6)
    report = rig.loop.run_pass()
    assert not report.healed and not report.txns, report
    assert _health(rig, "addresses")[0] == "ok"
    assert "addresses" not in rig.engine.failing
    assert not rig.state.applied().carried
    assert rig.audit("failure_settled")[-1]["details"]["subsystems"] == ["addresses"]

    # The next write converges it as usual instead of carrying a failure that is gone.
    document = _with_route()
    document["spec"]["routes"].append({"to": "198.51.100.128/25", "via": "198.51.100.1"})
    answer = rig.requests.apply(parse_document(document), actor="test")
    assert answer["ok"] and not answer.get("carried"), answer
    assert _health(rig, "addresses")[0] == "ok"


def test_a_partial_failure_seen_in_sync_settles_the_applied_record(tmp_path: Path) -> None:
    rig = _failing_addresses(tmp_path)
    rig.net.fail_on.clear()
    rig.net.add_address("lan0", LAN)
    rig.net.add_address("lan0", LAN6)
    rig.loop.run_pass()
    applied = rig.state.applied().to_json()
    assert applied["outcome"] == "committed" and not applied["failed"], applied
    assert _health(rig, "addresses")[0] == "ok"


def test_the_loop_does_not_spin_while_a_write_waits_for_another_process(tmp_path: Path) -> None:
    """A write waiting for a lock held by another process: the engine is idle, the loop sleeps."""
    rig = Rig(tmp_path)
    asked = []
    wanted = rig.engine.writer_wanted

    def counting() -> bool:
        asked.append(1)
        return wanted()

    rig.engine.writer_wanted = counting  # type: ignore[method-assign]
    done = threading.Event()
    with rig.engine.wanting():
        waiter = threading.Thread(target=lambda: (rig.loop._await_writers(), done.set()))
        waiter.start()
        released = threading.Event()
        released.wait(0.5)  # the write "waits" this long; the loop must sleep meanwhile
        assert not done.is_set()
    waiter.join(10)
    assert done.is_set(), "the loop did not go on once the write was done"
    # A sleeping loop asks about 10 times in 0.5 s; a spinning one tens of thousands.
    assert len(asked) < 500, len(asked)


def test_a_failing_subsystem_whose_heal_was_deferred_is_still_shown_failed(
    tmp_path: Path,
) -> None:
    rig = _failing_addresses(tmp_path)
    # The applied record no longer names it (a write replaced it), but its last
    # convergence failed and no heal has run since: waiting for the writer is no cure.
    record = rig.state.applied().to_json()
    record.pop("failed", None)
    record["outcome"] = "committed"
    rig.state.set_applied(record)
    health, reason = _health(rig, "addresses")
    assert health == "failed" and "Permission denied" in reason, reason


def test_a_heal_abandoned_for_an_operators_write_is_retried_soon_not_at_the_resync(
    tmp_path: Path,
) -> None:
    """A heal that yields to a write (one made outside the loop, such as a restore through
    the agent, wakes nothing) is tried again within `RETRY_SOON`, not after a resync."""
    from trueup.reconcile.engine.run import PREEMPTED
    from trueup.reconcile.loop import RETRY_SOON

    rig = Rig(tmp_path)
    assert rig.apply()["ok"]
    rig.loop.run_pass()
    rig.delete_address()
    # The write comes once the heal has looked (its before-images taken): it yields mid-way.
    running = lambda: rig.engine.running  # noqa: E731
    rig.engine.preempted = lambda: bool((run := running()) and run.before)  # type: ignore[method-assign]
    report = rig.loop.run_pass()
    assert report.waiting.get("addresses") == PREEMPTED, report
    assert not rig.has_address()
    assert rig.loop._timeout() <= RETRY_SOON + 0.01, rig.loop._timeout()

    del rig.engine.preempted  # the write is done: the next pass heals
    report = rig.loop.run_pass()
    assert "addresses" in report.healed, report
    assert rig.has_address()
