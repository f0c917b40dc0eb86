"""Notifications' pure parts: conditions from a report, rule matching, back-off, signatures."""

from __future__ import annotations

import time

from trueup.server.service.notify import sign, verify
from trueup.server.service.notify.deliveries import backoff
from trueup.server.service.notify.events import FAILED, KINDS, Match, conditions_of, iso


def test_conditions_from_a_report() -> None:
    report = {
        "reason_codes": ["STATE_DRIFT_DETECTED", "STATE_PARTIAL_UPDATE"],
        "diff_summary": {"subsystems": {"mtu": 2, "routes": 1}},
        "subsystems": {
            "dns": {"health": "fenced"},
            "dhcp": {"health": "failed", "breaker": "open"},
        },
        "restore": {"state": "pending"},
    }
    assert conditions_of(report) == {
        "drift_detected": ["mtu", "routes"],
        "apply_failed": ["STATE_PARTIAL_UPDATE"],
        "breaker_open": ["dhcp"],
        "fenced": ["dns"],
        "restore_pending": [],
    }
    assert conditions_of({"reason_codes": []}) == {}
    assert set(conditions_of(report)) & FAILED == {"apply_failed", "breaker_open"}


def test_every_kind_fits_its_column_and_has_a_severity() -> None:
    assert all(len(kind) <= 20 for kind in KINDS)
    assert set(KINDS.values()) == {"info", "warning", "critical"}


def test_a_rule_matches_only_what_every_part_allows() -> None:
    rule = Match(
        devices=("edge-*",), reason_codes=("STATE_DRIFT_DETECTED",), min_severity="warning"
    )
    assert rule.matches("edge-1", "drift_detected", "warning", ["STATE_DRIFT_DETECTED"])
    assert not rule.matches("core-1", "drift_detected", "warning", ["STATE_DRIFT_DETECTED"])
    assert not rule.matches("edge-1", "healed", "info", ["STATE_DRIFT_DETECTED"])
    assert not rule.matches("edge-1", "apply_failed", "critical", ["STATE_PARTIAL_UPDATE"])
    assert Match().matches("anything", "healed", "info", [])
    assert Match.from_json(rule.to_json()) == rule
    only = Match(kinds=("escalation",))
    assert not only.matches("edge-1", "drift_detected", "critical", [])


def test_backoff_doubles_is_capped_and_jittered_within_bounds() -> None:
    assert backoff(1, 2.0, 100.0, rand=1.0) == 2.0
    assert backoff(1, 2.0, 100.0, rand=0.0) == 1.0
    assert backoff(3, 2.0, 100.0, rand=1.0) == 8.0
    assert backoff(20, 2.0, 100.0, rand=1.0) == 100.0
    for attempt in range(1, 10):
        assert 0.5 * min(100.0, 2.0 * 2 ** (attempt - 1)) <= backoff(attempt, 2.0, 100.0)


def test_signature_verifies_and_refuses_tampering_and_old_timestamps() -> None:
    body = b'{"id":"e1"}'
    now = int(time.time())
    header = sign(b"secret", now, body)
    assert header.startswith(f"t={now},v1=")
    assert verify(b"secret", header, body)
    assert not verify(b"secret", header, body + b" ")
    assert not verify(b"other", header, body)
    assert not verify(b"secret", sign(b"secret", now - 3600, body), body)
    assert not verify(b"secret", "garbage", body)


def test_iso_timestamps() -> None:
    assert iso(0.0) == "1970-01-01T00:00:00Z"
    assert iso(None) is None
