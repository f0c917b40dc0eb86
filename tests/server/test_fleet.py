"""Fleet state derivation, table-driven (pure function; no database)."""

from __future__ import annotations

import pytest

from trueup.server.fleet import DeviceFacts, derive

NOW = 1_000_000.0

CASES = [
    # (name, facts, status, conditions, codes)
    ("in sync", DeviceFacts(3, 3, [], NOW - 5, 30, NOW - 100), "in_sync", ["in_sync"], []),
    (
        "never reported",
        DeviceFacts(1, None, [], None, 30, None),
        "heartbeat_stale",
        ["heartbeat_stale", "version_skew"],
        ["STATE_VERSION_SKEW"],
    ),
    (
        "agent behind",
        DeviceFacts(4, 3, [], NOW - 5, 30, None),
        "version_skew",
        ["version_skew"],
        ["STATE_VERSION_SKEW"],
    ),
    (
        "stale after three intervals",
        DeviceFacts(3, 3, [], NOW - 91, 30, NOW - 1000),
        "heartbeat_stale",
        ["heartbeat_stale"],
        [],
    ),
    ("not yet stale", DeviceFacts(3, 3, [], NOW - 89, 30, NOW - 1000), "in_sync", ["in_sync"], []),
    (
        "drift",
        DeviceFacts(3, 3, ["STATE_DRIFT_DETECTED"], NOW, 30, None),
        "drift",
        ["drift"],
        ["STATE_DRIFT_DETECTED"],
    ),
    (
        "partial update counts as failed",
        DeviceFacts(3, 3, ["STATE_PARTIAL_UPDATE", "STATE_DRIFT_DETECTED"], NOW, 30, None),
        "reconciliation_failed",
        ["reconciliation_failed", "drift"],
        ["STATE_DRIFT_DETECTED", "STATE_PARTIAL_UPDATE"],
    ),
    (
        "agent-reported schema skew",
        DeviceFacts(3, 3, ["STATE_VERSION_SKEW"], NOW, 30, None),
        "version_skew",
        ["version_skew"],
        ["STATE_VERSION_SKEW"],
    ),
    (
        "no desired revision yet",
        DeviceFacts(0, None, [], NOW, 30, NOW),
        "in_sync",
        ["in_sync"],
        [],
    ),
    (
        "unknown codes are dropped",
        DeviceFacts(1, 1, ["SOMETHING_ELSE"], NOW, 30, NOW),
        "in_sync",
        ["in_sync"],
        [],
    ),
]


@pytest.mark.parametrize(("name", "facts", "status", "conditions", "codes"), CASES)
def test_derive(
    name: str, facts: DeviceFacts, status: str, conditions: list[str], codes: list[str]
) -> None:
    view = derive(facts, NOW, stale_intervals=3)
    assert view.status == status, name
    assert [c.value for c in view.conditions] == conditions, name
    assert view.reason_codes == codes, name
    if status != "in_sync":
        assert view.in_sync_since is None
    else:
        assert view.in_sync_since == facts.in_sync_since
