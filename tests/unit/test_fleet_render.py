"""`trueup fleet` text: the last drift on the row, the drift history and router acks on `show`."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from trueup.cli.fleet import drift_words, render_device, render_table


def _iso(seconds_ago: float) -> str:
    at = datetime.fromtimestamp(time.time() - seconds_ago, UTC)
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _healed() -> dict[str, object]:
    """A drift that healed 125 s ago (made when the test runs, not when it is collected)."""
    return {
        "subsystem": "addresses",
        "since": _iso(130),
        "healed_at": _iso(125),
        "paths": ["spec.interfaces[lan0].addresses"],
        "changed_by": ["RTM_DELADDR from ip"],
        "healed_by": {"by": "trueup", "action": "heal", "writer": "trueup heal T1", "txn": "T1"},
    }


def _device(**extra: object) -> dict[str, object]:
    return {
        "device": "edge-01",
        "status": "in_sync",
        "desired_version": 1,
        "applied_version": 1,
        "last_report_at": _iso(1),
        "in_sync_since": _iso(120),
        "reason_codes": [],
        **extra,
    }


def test_a_fleet_row_says_when_its_last_drift_healed() -> None:
    healed = _healed()
    assert drift_words(healed, time.time()) == "healed 2 min ago (addresses)"
    ongoing = {**healed, "healed_at": None}
    assert drift_words(ongoing, time.time()).startswith("drifting since 20")
    table = render_table([_device(last_drift=healed), _device(device="edge-02")])
    assert "LAST DRIFT" in table.splitlines()[0]
    assert "healed 2 min ago (addresses)" in table.splitlines()[1]
    assert table.splitlines()[2].split()[-2:] == ["-", "-"]


def test_fleet_show_names_who_changed_what_who_healed_it_and_the_routers_acks() -> None:
    healed = _healed()
    ack = {
        "subsystem": "routes",
        "state": "expired",
        "until": _iso(5),
        "by": "cli:0",
        "reason": "lab",
    }
    text = render_device(
        _device(digest_match=True, drift_history=[healed], agent_acknowledgements=[ack])
    )
    assert "addresses since" in text and "healed 2 min ago by trueup heal T1" in text
    assert "changed by: RTM_DELADDR from ip" in text
    assert "path:       spec.interfaces[lan0].addresses" in text
    assert "router ack:    routes expired until" in text and "by cli:0: lab" in text
