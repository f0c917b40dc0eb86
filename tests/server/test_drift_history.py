"""Drift history in the control plane: ingest dedupes records repeated across reports,
keeps the end once seen, bounds the history; the device API, the fleet row and the
dashboard show who changed what and who healed it; the router's acknowledgements and
their expiry; tenants never see each other's history."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.server.conftest import Server, Tenant
from tests.server.test_dashboard import browser
from trueup.server import drift as drift_module


def _iso(seconds: float) -> str:
    return (
        datetime.fromtimestamp(seconds, UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def _record(since: float, healed_at: float | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "subsystem": "addresses",
        "paths": ["spec.interfaces[lan0].addresses"],
        "since": _iso(since),
        "healed_at": _iso(healed_at) if healed_at else None,
        "detected_by": "event",
        "changed_by": ["RTM_DELADDR from ip (port 4242)"],
        "attribution": [{"message": "RTM_DELADDR", "sender": "ip", "sender_port": 4242}],
        "healed_by": (
            {"by": "trueup", "action": "heal", "txn": "txn-heal-1"} if healed_at else None
        ),
        **extra,
    }


def _report(server: Server, tenant: Tenant, device: str, **payload: Any) -> None:
    answer = server.client.post(
        "/api/v1/agent/report",
        json={"applied_version": 0, **payload},
        headers=tenant.device_auth(device),
    )
    assert answer.status_code == 200, answer.text


def _device(server: Server, tenant: Tenant, device: str) -> dict[str, Any]:
    answer = server.client.get(f"/api/v1/devices/{device}", headers=tenant.auth("viewer"))
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def test_a_record_repeated_across_reports_is_stored_once_and_its_end_kept(
    server: Server,
) -> None:
    tenant = server.tenant(devices=("edge-01",))
    since = time.time() - 100
    _report(server, tenant, "edge-01", drift_history=[_record(since)])
    _report(server, tenant, "edge-01", drift_history=[_record(since)])
    history = _device(server, tenant, "edge-01")["drift_history"]
    assert len(history) == 1 and history[0]["state"] == "ongoing"

    healed = since + 0.12
    _report(server, tenant, "edge-01", drift_history=[_record(since, healed)])
    # A later report that still carries it ongoing (an older agent view) cannot reopen it.
    _report(server, tenant, "edge-01", drift_history=[_record(since)])
    entry = _device(server, tenant, "edge-01")
    (record,) = entry["drift_history"]
    assert record["state"] == "healed"
    assert record["healed_at"] == _iso(healed)
    assert record["changed_by"] == ["RTM_DELADDR from ip (port 4242)"]
    assert record["healed_by"] == {"by": "trueup", "action": "heal", "txn": "txn-heal-1"}
    assert record["paths"] == ["spec.interfaces[lan0].addresses"]
    # The fleet row says when the last drift healed.
    row = server.client.get("/api/v1/devices", headers=tenant.auth("viewer")).json()["devices"]
    assert row[0]["last_drift"]["healed_at"] == _iso(healed)
    assert row[0]["last_drift"]["subsystem"] == "addresses"


def test_drift_the_agent_stops_reporting_as_ongoing_is_ended_not_ongoing_forever(
    server: Server,
) -> None:
    tenant = server.tenant(devices=("edge-01",))
    since = time.time() - 100
    _report(server, tenant, "edge-01", drift_history=[_record(since)])
    # An older agent's report (no drift history at all) says nothing about it.
    _report(server, tenant, "edge-01")
    (record,) = _device(server, tenant, "edge-01")["drift_history"]
    assert record["state"] == "ongoing"
    # An apply or a restart replaced it: the agent no longer lists it as going on.
    _report(server, tenant, "edge-01", agent_version="0.1.0", drift_history=[])
    (record,) = _device(server, tenant, "edge-01")["drift_history"]
    assert record["state"] == "healed" and record["healed_at"] is not None
    assert record["healed_by"] == drift_module.UNREPORTED
    row = server.client.get("/api/v1/devices", headers=tenant.auth("viewer")).json()["devices"]
    assert row[0]["last_drift"]["state"] == "healed"


def test_one_batch_holding_the_same_record_twice_is_stored_once(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01",))
    since = time.time() - 50
    payload = {"applied_version": 0, "drift_history": [_record(since), _record(since, since + 1)]}
    answer = server.client.post(
        "/api/v1/agent/report", json=payload, headers=tenant.device_auth("edge-01")
    )
    assert answer.status_code == 200, answer.text
    (record,) = _device(server, tenant, "edge-01")["drift_history"]
    assert record["state"] == "healed"


def test_history_is_bounded_per_device(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(drift_module, "DRIFT_KEEP", 3)
    tenant = server.tenant(devices=("edge-01",))
    start = time.time() - 1000
    for i in range(5):
        _report(server, tenant, "edge-01", drift_history=[_record(start + i, start + i + 0.5)])
    history = _device(server, tenant, "edge-01")["drift_history"]
    assert [r["since"] for r in history] == [_iso(start + i) for i in (4, 3, 2)]


def test_other_tenants_never_see_a_device_history(server: Server) -> None:
    mine = server.tenant(devices=("edge-01",))
    other = server.tenant(devices=("edge-01",))  # the same device name in another tenant
    _report(server, mine, "edge-01", drift_history=[_record(time.time() - 10)])
    assert _device(server, other, "edge-01")["drift_history"] == []
    assert _device(server, other, "edge-01")["last_drift"] is None
    outsider = server.tenant(devices=("edge-02",))
    hidden = server.client.get("/api/v1/devices/edge-01", headers=outsider.auth("viewer"))
    assert hidden.status_code == 404
    anonymous = server.client.get("/api/v1/devices/edge-01")
    assert anonymous.status_code == 401
    stream = browser(server).get("/ui/devices/edge-01/stream", follow_redirects=False)
    assert stream.status_code == 401
    page = browser(server, outsider, "viewer").get("/ui/devices/edge-01")
    assert page.status_code == 404


def test_router_acknowledgements_are_shown_and_their_expiry_without_a_new_report(
    server: Server,
) -> None:
    tenant = server.tenant(devices=("edge-01",))
    now = time.time()
    acks = [
        {
            "subsystem": "addresses",
            "until": _iso(now + 3600),
            "by": "api",
            "reason": "INC-9 lab",
            "at": _iso(now),
            "state": "active",
        },
        {
            "subsystem": "routes",
            "until": _iso(now - 5),  # passed: the agent has not reported its end yet
            "by": "api",
            "reason": "INC-8",
            "at": _iso(now - 65),
            "state": "active",
        },
    ]
    _report(server, tenant, "edge-01", acknowledgements=acks)
    shown = {
        a["subsystem"]: a for a in _device(server, tenant, "edge-01")["agent_acknowledgements"]
    }
    assert shown["addresses"]["state"] == "active"
    assert shown["routes"]["state"] == "expired"
    html = browser(server, tenant, "viewer").get("/ui/devices/edge-01").text
    assert 'class="agent-ack" data-subsystem="addresses" data-state="active"' in html
    assert 'class="agent-ack" data-subsystem="routes" data-state="expired"' in html
    assert "INC-9 lab" in html


def test_device_page_shows_who_changed_what_and_the_fleet_row_when_it_healed(
    server: Server,
) -> None:
    tenant = server.tenant(devices=("edge-01",))
    since = time.time() - 130
    _report(server, tenant, "edge-01", drift_history=[_record(since, since + 0.12)])
    client = browser(server, tenant, "viewer")
    fleet = client.get("/").text
    assert "healed 2 min ago (addresses)" in fleet
    page = client.get("/ui/devices/edge-01").text
    assert 'data-drift-subsystem="addresses" data-state="healed"' in page
    assert "RTM_DELADDR from ip (port 4242)" in page
    assert "txn-heal-1" in page
    assert 'data-kind="healed"' in page and 'data-kind="drift-seen"' in page  # the timeline
    # The stream pushes the same parts.
    with client.stream("GET", "/ui/devices/edge-01/stream") as stream:
        for line in stream.iter_lines():
            if line.startswith("data:") and "live-drift" in line:
                assert "txn-heal-1" in line
                break


def test_a_report_with_a_malformed_drift_record_is_refused_whole(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01",))
    answer = server.client.post(
        "/api/v1/agent/report",
        json={"applied_version": 0, "drift_history": [{"subsystem": "x" * 101, "since": "t"}]},
        headers=tenant.device_auth("edge-01"),
    )
    assert answer.status_code == 422
    assert any("drift_history.0.subsystem" in p for p in answer.json()["problems"])
    assert _device(server, tenant, "edge-01")["drift_history"] == []
