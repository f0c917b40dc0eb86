"""Confirm-or-rollback in the control plane: a revision stored with a confirmation window is
delivered with it; the agents' `confirmation` records are stored latest per device, shown in
the fleet and device views, read by `confirmation_of`; a rollback is audited once."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import text

from tests.server.conftest import BACKENDS, Server, Tenant, document
from trueup.cli.fleet import render_device


def _put(server: Server, tenant: Tenant, expected: int, **headers: str) -> Any:
    return server.client.put(
        "/api/v1/devices/edge-01/desired",
        json=document("edge-01", address=f"198.51.100.{expected + 2}/24"),
        headers={**tenant.auth("operator"), "If-Match": str(expected), **headers},
    )


def _report(server: Server, tenant: Tenant, **payload: Any) -> None:
    answer = server.client.post(
        "/api/v1/agent/report", json=payload, headers=tenant.device_auth("edge-01")
    )
    assert answer.status_code == 200, answer.text


def _fleet_entry(server: Server, tenant: Tenant) -> dict[str, Any]:
    answer = server.client.get("/api/v1/devices", headers=tenant.auth("viewer"))
    assert answer.status_code == 200, answer.text
    (entry,) = answer.json()["devices"]
    return dict(entry)


def _rolled_back(server: Server, tenant_id: int) -> list[dict[str, Any]]:
    return [
        e
        for e in server.plane.audit_entries(tenant_id, 100)
        if e["action"] == "revision.rolled_back"
    ]


def test_a_window_is_stored_and_delivered_with_the_revision(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01",))
    plain = _put(server, tenant, 0)
    assert plain.status_code == 201, plain.text
    assert plain.json()["confirm_within"] is None
    guarded = _put(server, tenant, 1, **{"X-Trueup-Confirm-Within": "15"})
    assert guarded.status_code == 201, guarded.text
    assert guarded.json()["confirm_within"] == 15
    pulled = server.client.get(
        "/api/v1/agent/desired", params={"after": 1}, headers=tenant.device_auth("edge-01")
    )
    assert pulled.status_code == 200, pulled.text
    assert pulled.json()["version"] == 2 and pulled.json()["confirm_within"] == 15
    for bad in ("0", "86401", "15s", "-3"):
        refused = _put(server, tenant, 2, **{"X-Trueup-Confirm-Within": bad})
        assert refused.status_code == 422, (bad, refused.text)
        assert "header.X-Trueup-Confirm-Within" in refused.text
    desired = server.client.get("/api/v1/devices/edge-01/desired", headers=tenant.auth("viewer"))
    assert desired.json()["version"] == 2  # nothing stored by the refusals


def test_the_latest_confirmation_is_shown_and_a_rollback_audited_once(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01",))
    tenant_id = server.plane.tenant_id(tenant.name)
    device_id = server.plane.device_id(tenant_id, "edge-01")
    assert _fleet_entry(server, tenant)["confirmation"] is None
    assert server.plane.confirmation_of(tenant_id, device_id) is None
    deadline = time.time() + 15
    pending = {
        "version": 2,
        "state": "pending",
        "deadline": deadline,
        "reason": "management ready and the control plane reached after the apply",
        "rollback_to": 1,
    }
    _report(server, tenant, applied_version=2, confirmation=pending)
    shown = _fleet_entry(server, tenant)["confirmation"]
    assert shown["state"] == "pending" and shown["version"] == 2
    assert shown["deadline"] == deadline and shown["reason"] == pending["reason"]

    reason = (
        "the confirmation window passed while still waiting for: the control plane reached "
        "after the apply (last error: report: ConnectTimeout)"
    )
    rolled = {**pending, "state": "rolled-back", "reason": reason, "rolled_back_to_version": 3}
    for _ in range(3):  # every report repeats it until the next guarded apply
        _report(server, tenant, applied_version=3, confirmation=rolled)
    _report(server, tenant, applied_version=3)  # an agent that sends none changes nothing
    read = server.plane.confirmation_of(tenant_id, device_id)
    assert read is not None and read["state"] == "rolled-back" and read["reason"] == reason
    assert read["rollback_to"] == 1 and read["rolled_back_to_version"] == 3
    assert _fleet_entry(server, tenant)["confirmation"] == read
    device = server.client.get("/api/v1/devices/edge-01", headers=tenant.auth("viewer"))
    assert device.json()["confirmation"]["state"] == "rolled-back"
    assert f"confirmation:  version 2 rolled-back: {reason}" in render_device(device.json())
    (entry,) = _rolled_back(server, tenant_id)
    assert entry["target"] == "device:edge-01"
    assert entry["actor"] == f"device:{tenant.name}/edge-01"
    assert entry["detail"]["version"] == 2 and entry["detail"]["reason"] == reason

    confirmed = {**pending, "version": 4, "state": "confirmed", "reason": "confirmed"}
    _report(server, tenant, applied_version=4, confirmation=confirmed)
    assert server.plane.confirmation_of(tenant_id, device_id)["state"] == "confirmed"  # type: ignore[index]
    assert len(_rolled_back(server, tenant_id)) == 1


def test_a_confirmation_in_an_unknown_state_is_refused(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01",))
    answer = server.client.post(
        "/api/v1/agent/report",
        json={"confirmation": {"version": 2, "state": "maybe", "reason": ""}},
        headers=tenant.device_auth("edge-01"),
    )
    assert answer.status_code == 422
    assert "confirmation" in answer.text
    assert _fleet_entry(server, tenant)["confirmation"] is None


@pytest.mark.parametrize("isolated_server", BACKENDS, indirect=True)
def test_a_rollback_turned_into_confirmed_in_the_table_is_named_and_not_believed(
    isolated_server: Server,
) -> None:
    server = isolated_server
    tenant = server.tenant(devices=("edge-01",))
    tenant_id = server.plane.tenant_id(tenant.name)
    device_id = server.plane.device_id(tenant_id, "edge-01")
    rolled = {"version": 3, "state": "rolled-back", "deadline": time.time(), "reason": "window"}
    _report(server, tenant, applied_version=4, confirmation=rolled)
    assert [str(p) for p in server.plane.verify_audit()] == []
    with server.plane.db.engine.begin() as conn:
        conn.execute(text("UPDATE device_confirmation SET state = 'confirmed'"))
    problems = [str(p) for p in server.plane.verify_audit()]
    assert any("device_confirmation" in p and "edge-01 version 3" in p for p in problems), problems
    read = server.plane.confirmation_of(tenant_id, device_id)
    assert read is not None and read["state"] == "rolled-back"
    assert "the audit log says rolled back" in read["reason"]


@pytest.mark.parametrize("isolated_server", BACKENDS, indirect=True)
def test_a_confirmation_window_removed_in_the_table_is_named_and_not_delivered(
    isolated_server: Server,
) -> None:
    server = isolated_server
    tenant = server.tenant(devices=("edge-01",))
    assert _put(server, tenant, 0).status_code == 201
    assert _put(server, tenant, 1, **{"X-Trueup-Confirm-Within": "30"}).status_code == 201
    with server.plane.db.engine.begin() as conn:
        conn.execute(text("UPDATE revisions SET confirm_within = NULL WHERE version = 2"))
    problems = [str(p) for p in server.plane.verify_audit()]
    assert any("confirmation window" in p for p in problems), problems
    pulled = server.client.get(
        "/api/v1/agent/desired", params={"after": 1}, headers=tenant.device_auth("edge-01")
    )
    assert pulled.status_code == 409, pulled.text
    assert "confirmation window is not the audited one" in pulled.json()["detail"]


def test_a_confirmation_naming_an_impossible_version_is_refused_and_others_still_land(
    server: Server,
) -> None:
    """A report's `rolled_back_to_version` is a version like `version` and `rollback_to`:
    0 to MAX_VERSION. Anything else is 422 for that report and nothing of it is stored;
    the next device's report is stored as usual."""
    tenant = server.tenant(devices=("edge-01", "edge-02"))
    tenant_id = server.plane.tenant_id(tenant.name)
    rolled = {"version": 2, "state": "rolled-back", "reason": "window passed", "rollback_to": 1}
    for bad in (2**70, -1, 2**31):
        answer = server.client.post(
            "/api/v1/agent/report",
            json={"applied_version": 3, "confirmation": {**rolled, "rolled_back_to_version": bad}},
            headers=tenant.device_auth("edge-01"),
        )
        assert answer.status_code == 422, (bad, answer.text)
        assert "nothing was stored" in answer.text
    good = server.client.post(
        "/api/v1/agent/report",
        json={"applied_version": 3, "confirmation": {**rolled, "rolled_back_to_version": 3}},
        headers=tenant.device_auth("edge-02"),
    )
    assert good.status_code == 200, good.text
    device_id = server.plane.device_id(tenant_id, "edge-02")
    deadline = time.monotonic() + 120
    read = server.plane.confirmation_of(tenant_id, device_id)
    while read is None and time.monotonic() < deadline:
        time.sleep(0.05)
        read = server.plane.confirmation_of(tenant_id, device_id)
    assert read is not None and read["rolled_back_to_version"] == 3
    assert (
        server.plane.confirmation_of(tenant_id, server.plane.device_id(tenant_id, "edge-01"))
        is None
    )


def test_a_confirmation_window_of_thousands_of_digits_is_422_not_a_server_error(
    server: Server,
) -> None:
    tenant = server.tenant(devices=("edge-01",))
    for bad in ("0" * 5000 + "15", "9" * 5000):
        refused = _put(server, tenant, 0, **{"X-Trueup-Confirm-Within": bad})
        assert refused.status_code == 422, refused.text
        assert "header.X-Trueup-Confirm-Within" in refused.text
    desired = server.client.get("/api/v1/devices/edge-01/desired", headers=tenant.auth("viewer"))
    assert desired.json()["version"] == 0, desired.text  # nothing stored by the refusals
    assert (
        _put(server, tenant, 0, **{"X-Trueup-Confirm-Within": "00015"}).json()["confirm_within"]
        == 15
    )


@pytest.mark.parametrize("isolated_server", BACKENDS, indirect=True)
def test_a_report_turning_a_rollback_back_into_confirmed_is_not_stored(
    isolated_server: Server,
) -> None:
    """Versions only grow: a device that reports version 3 rolled back and then says version
    3 (or an older one) confirmed is not believed — its record stays rolled-back, and
    `audit verify` stays clean (the log and the table agree)."""
    server = isolated_server
    tenant = server.tenant(devices=("edge-01",))
    tenant_id = server.plane.tenant_id(tenant.name)
    device_id = server.plane.device_id(tenant_id, "edge-01")
    rolled = {"version": 3, "state": "rolled-back", "deadline": time.time(), "reason": "window"}
    _report(server, tenant, applied_version=4, confirmation=rolled)
    for forged in (
        {**rolled, "state": "confirmed", "reason": "forged"},
        {**rolled, "state": "pending", "reason": "forged"},
        {**rolled, "version": 2, "state": "confirmed", "reason": "forged"},
    ):
        _report(server, tenant, applied_version=4, confirmation=forged)
        read = server.plane.confirmation_of(tenant_id, device_id)
        assert read is not None and (read["version"], read["state"]) == (3, "rolled-back"), read
        assert [str(p) for p in server.plane.verify_audit()] == []
    newer = {**rolled, "version": 5, "state": "confirmed", "reason": "confirmed"}
    _report(server, tenant, applied_version=5, confirmation=newer)
    read = server.plane.confirmation_of(tenant_id, device_id)
    assert read is not None and (read["version"], read["state"]) == (5, "confirmed")
    assert [str(p) for p in server.plane.verify_audit()] == []
