"""A link that does not exist yet is waited for, never failed: pending, outside the breaker.

FakeNetlink and a fake clock (the loop's `Rig`); the link "appears" when the
test adds it and emits its RTM_NEWLINK.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.routers import base_document
from tests.unit.test_loop import Rig
from trueup.model.document import parse_document
from trueup.model.health import SubsystemHealth, waiting_on_links
from trueup.reconcile.healing import HealingOptions
from trueup.subsystems.dhcp.subsystem import _testable
from trueup.system.events import NetlinkEvent
from trueup.system.netlink import LinkInfo


def _late_rig(tmp_path: Path, **spec: Any) -> Rig:
    """A rig whose lan0 does not exist yet, with the document applied best-effort."""
    rig = Rig(tmp_path, HealingOptions(jitter=0.0, breaker_threshold=2, retry_budget=3))
    del rig.net.link_state["lan0"]
    document = parse_document(base_document(routes=[], **spec))
    answer = rig.requests.apply(document, mode="best-effort", actor="test")
    assert answer["ok"], answer
    return rig


def _link_appears(rig: Rig) -> None:
    rig.net.link_state["lan0"] = LinkInfo("lan0", 9, "down", 1500, carrier=False)
    rig.events.emit(NetlinkEvent("link", "RTM_NEWLINK", rig.clock(), ifname="lan0"))


def test_a_missing_link_waits_and_never_counts_toward_breaker_or_budget(tmp_path: Path) -> None:
    rig = _late_rig(tmp_path)
    for _ in range(6):  # more passes than the breaker's threshold and the retry budget
        report = rig.loop.run_pass()
        rig.clock.advance(30)
        assert "links" not in report.failed and "addresses" not in report.failed, report
        assert report.waiting["links"].startswith("waiting on link lan0"), report.waiting
        assert report.waiting["addresses"].startswith("waiting on links"), report.waiting
    policies = rig.loop.status_inputs()["policies"]
    for name in ("links", "addresses"):
        assert policies[name]["breaker"] == "closed", policies[name]
        assert policies[name]["consecutive_failures"] == 0
        assert policies[name]["retry_budget"]["used"] == 0
    assert not rig.audit("breaker_opened")
    assert rig.loop.status_inputs()["reconcile_failures"] == {}
    waits = [r for r in rig.audit("reconcile") if r["details"]["outcome"] == "waiting"]
    assert waits and not [r for r in rig.audit("reconcile") if r["details"]["outcome"] == "failed"]

    # The link appears: the next pass (woken by its RTM_NEWLINK) converges it at once.
    _link_appears(rig)
    report = rig.loop.run_pass()
    assert report.healed.get("links") and report.healed.get("addresses"), report
    assert rig.net.link_state["lan0"].state == "up"
    assert rig.has_address()


def test_an_atomic_apply_still_refuses_a_missing_link(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    del rig.net.link_state["lan0"]
    answer = rig.apply()
    assert not answer["ok"]
    assert "waiting on link lan0" in str(answer["failed"]["links"])
    # The refusal says that nothing waits for it, and what to do instead.
    assert "an atomic apply cannot wait for it" in str(answer["failed"]["links"])
    assert "--mode best-effort" in str(answer["failed"]["links"])


def test_what_the_start_left_unfinished_heals_under_notify_then_notify_governs(
    tmp_path: Path,
) -> None:
    rig = _late_rig(tmp_path, convergence={"default": "notify"})
    rig.loop.finish_start(["links", "addresses"])
    report = rig.loop.run_pass()
    assert "policy notify" not in str(report.held), report.held
    assert report.waiting["links"].startswith("waiting on link lan0")

    _link_appears(rig)
    report = rig.loop.run_pass()
    assert report.healed.get("links") and report.healed.get("addresses"), report
    assert rig.has_address()
    rig.loop.run_pass()  # in sync: the start is finished for both

    # From here on notify governs: a later change is reported, not healed.
    rig.delete_address()
    report = rig.loop.run_pass()
    assert "policy notify" in report.held["addresses"]
    assert not rig.has_address()


def test_a_subsystem_still_pending_on_a_link_stays_in_the_start_although_in_sync(
    tmp_path: Path,
) -> None:
    rig = _late_rig(tmp_path, convergence={"default": "notify"})
    rig.loop.finish_start(["links"])
    rig.loop.run_pass()
    assert "links" in rig.loop._starting  # lan0 is still missing: pending, not done


def test_waiting_on_links_names_them() -> None:
    assert waiting_on_links([]) is None
    assert waiting_on_links(["lan0"]) == (SubsystemHealth.PENDING, "waiting on link lan0")
    assert waiting_on_links(["lan0", "lan1"]) == (
        SubsystemHealth.PENDING,
        "waiting on links lan0, lan1",
    )


def test_kea_s_config_test_leaves_out_links_it_has_not_detected_yet() -> None:
    wanted = {
        "Dhcp4": {
            "interfaces-config": {"interfaces": ["lan0", "lan1"], "re-detect": True},
            "subnet4": [{"id": 1, "subnet": "203.0.113.0/24"}],
        }
    }
    running = {"Dhcp4": {"interfaces-config": {"interfaces": ["lan1"]}}}
    tested = _testable(wanted, running, 4)
    assert tested["Dhcp4"]["interfaces-config"] == {"interfaces": ["lan1"], "re-detect": True}
    assert tested["Dhcp4"]["subnet4"] == wanted["Dhcp4"]["subnet4"]
    # What is set is untouched: Kea detects lan0 at the set.
    assert wanted["Dhcp4"]["interfaces-config"]["interfaces"] == ["lan0", "lan1"]
