"""Fleet state derivation, table-driven (pure function; no database)."""

from __future__ import annotations

import pytest

from trueup.server.fleet import DeviceFacts, FleetStatus, derive, digest_match, in_sync_now

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


# -- revision identity: the document digest decides, and local overrides are their own state --

D1 = "sha256:" + "1" * 64
D2 = "sha256:" + "2" * 64


def facts(desired: int, applied: int | None, **identity) -> DeviceFacts:
    codes = identity.pop("codes", [])
    return DeviceFacts(desired, applied, codes, NOW - 5, 30, NOW - 100, **identity)


def test_equal_numbers_different_documents_is_version_skew() -> None:
    view = derive(facts(3, 3, desired_digest=D1, applied_digest=D2), NOW, stale_intervals=3)
    assert view.status == FleetStatus.VERSION_SKEW
    assert view.conditions == [FleetStatus.VERSION_SKEW]
    assert view.reason_codes == ["STATE_VERSION_SKEW"]
    assert view.digest_match is False
    assert view.in_sync_since is None


def test_equal_digests_and_numbers_are_in_sync() -> None:
    view = derive(facts(3, 3, desired_digest=D1, applied_digest=D1), NOW, stale_intervals=3)
    assert view.status == FleetStatus.IN_SYNC
    assert view.digest_match is True
    assert view.reason_codes == []
    assert view.in_sync_since == NOW - 100


def test_equal_digests_but_different_numbers_is_still_version_skew() -> None:
    view = derive(facts(4, 3, desired_digest=D1, applied_digest=D1), NOW, stale_intervals=3)
    assert view.status == FleetStatus.VERSION_SKEW and view.digest_match is True


@pytest.mark.parametrize(
    ("desired_digest", "applied_digest"), [(None, D1), (D1, None), (None, None)]
)
def test_an_unknown_digest_falls_back_to_version_numbers(
    desired_digest: str | None, applied_digest: str | None
) -> None:
    same = derive(
        facts(3, 3, desired_digest=desired_digest, applied_digest=applied_digest),
        NOW,
        stale_intervals=3,
    )
    assert same.status == FleetStatus.IN_SYNC and same.digest_match is None
    behind = derive(
        facts(3, 2, desired_digest=desired_digest, applied_digest=applied_digest),
        NOW,
        stale_intervals=3,
    )
    assert behind.status == FleetStatus.VERSION_SKEW and behind.digest_match is None


@pytest.mark.parametrize(("applied", "applied_digest"), [(4, D2), (3, D2), (3, D1)])
def test_a_reported_override_is_local_override_not_version_skew(
    applied: int, applied_digest: str
) -> None:
    view = derive(
        facts(3, applied, desired_digest=D1, applied_digest=applied_digest, override=True),
        NOW,
        stale_intervals=3,
    )
    assert view.status == FleetStatus.LOCAL_OVERRIDE
    assert view.conditions == [FleetStatus.LOCAL_OVERRIDE]
    assert "STATE_VERSION_SKEW" not in view.reason_codes
    assert view.in_sync_since is None


def test_local_override_precedence() -> None:
    failed = derive(
        facts(3, 4, override=True, codes=["STATE_RECONCILIATION_FAILED", "STATE_DRIFT_DETECTED"]),
        NOW,
        stale_intervals=3,
    )
    assert failed.status == FleetStatus.RECONCILIATION_FAILED
    assert failed.conditions == [
        FleetStatus.RECONCILIATION_FAILED,
        FleetStatus.LOCAL_OVERRIDE,
        FleetStatus.DRIFT,
    ]
    # A skew the agent itself reports (e.g. schema) is another reason: both are shown.
    both = derive(facts(3, 4, override=True, codes=["STATE_VERSION_SKEW"]), NOW, stale_intervals=3)
    assert both.conditions == [FleetStatus.LOCAL_OVERRIDE, FleetStatus.VERSION_SKEW]
    stale = derive(
        DeviceFacts(3, 4, [], NOW - 1000, 30, None, override=True), NOW, stale_intervals=3
    )
    assert stale.conditions == [FleetStatus.HEARTBEAT_STALE, FleetStatus.LOCAL_OVERRIDE]


def test_digest_match_and_in_sync_now() -> None:
    assert digest_match(D1, D1) is True
    assert digest_match(D1, D2) is False
    assert digest_match(None, D1) is None and digest_match(D1, None) is None
    base = {
        "desired_version": 3,
        "applied_version": 3,
        "desired_digest": D1,
        "applied_digest": D1,
        "override": False,
        "reported_codes": [],
    }
    assert in_sync_now(**base)
    assert in_sync_now(**{**base, "applied_digest": None})
    assert not in_sync_now(**{**base, "applied_digest": D2})
    assert not in_sync_now(**{**base, "override": True})
    assert not in_sync_now(**{**base, "applied_version": 2})
    assert not in_sync_now(**{**base, "reported_codes": ["STATE_DRIFT_DETECTED"]})
