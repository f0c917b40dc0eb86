"""Test-only knobs (fault points, the heartbeat): a mistyped value is named, never a crash."""

from __future__ import annotations

import pytest

from trueup.reconcile import faults

SUBSYSTEMS = ("links", "firewall", "sysctl")


def test_every_fault_point_the_engine_fires_is_accepted() -> None:
    spec = ",".join(
        [
            "begin",
            "apply/before-commit",
            "after-commit:sleep=0.5",
            "applied:firewall",
            "rollback/step:links:wait=/tmp/go",
            "recovery:sysctl",
            "restore:staged",
        ]
    )
    assert faults.problems(spec, SUBSYSTEMS) == []
    assert faults.problems("", SUBSYSTEMS) == []


def test_a_mistyped_point_and_a_bad_action_are_named() -> None:
    found = faults.problems("applied:firwall,begin:sleep=abc,restore:nowhere", SUBSYSTEMS)
    assert len(found) == 3, found
    assert "'applied:firwall' is no fault point" in found[0]
    assert "firewall, links, sysctl" in found[0]
    assert "sleep= takes seconds" in found[1] and "'abc'" in found[1]
    assert "'restore:nowhere' is no fault point" in found[2]
    assert faults.problems("begin:sleep=-1", SUBSYSTEMS) != []


def test_a_bad_sleep_never_raises_at_its_point(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRUEUP_FAULT", "begin:sleep=abc")
    faults.hit("begin")  # ignored there (logged when the agent starts), not a ValueError


def test_a_mistyped_heartbeat_keeps_the_default() -> None:
    from trueup.agent.launch import _heartbeat

    assert _heartbeat("") == 30.0 and _heartbeat("5") == 5.0
    assert _heartbeat("abc") == 30.0 and _heartbeat("0") == 30.0 and _heartbeat("nan") == 30.0
