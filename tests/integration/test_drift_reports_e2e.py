"""End to end: drift that heals in a fraction of a second still reaches the control plane.

A real agent (policy auto) in a router namespace under a real control plane in
the operator namespace, with a heartbeat of ten minutes: only a report that
follows the event can explain what the control plane shows. `ip addr del` of
the LAN address → trueup heals it → the device API shows the drift healed,
with who changed it and trueup's heal; Chromium sees it on the fleet row and on
the device page's drift history and timeline, without a reload. `trueup ack` on
the router → shown on the device page, and then its expiry.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.browser import chromium, screenshot
from tests.integration.test_dashboard_e2e import _server_cli, _token
from tests.routers import TRUEUP, Router, base_document

pytestmark = pytest.mark.root

PORT = 8796
URL = f"http://198.51.100.1:{PORT}"
WAIT_MS = 10_000  # far above the 3 s a report and the page's stream take
HEARTBEAT = 600.0  # no heartbeat falls inside the test


def _login(browser: Any, token: str) -> Any:
    page = browser.new_context(base_url=URL).new_page()
    page.goto("/ui/login")
    page.fill("input[name=token]", token)
    page.click("button[type=submit]")
    page.wait_for_selector("table.fleet", timeout=WAIT_MS)
    return page


def _device(router: Router, token: str) -> dict[str, Any]:
    status, body = router.from_client(f"{URL}/api/v1/devices/edge-01", token)
    assert status == 200, body
    return dict(body)


def _healed_addresses(router: Router, token: str) -> dict[str, Any] | None:
    for record in _device(router, token)["drift_history"]:
        if record["subsystem"] == "addresses" and record["state"] == "healed":
            return dict(record)
    return None


def test_healed_drift_and_router_acks_reach_the_control_plane_between_heartbeats(
    router_with_client: Router,
) -> None:
    router = router_with_client
    db = f"sqlite:///{router.workdir}/cp.db"
    _server_cli(router, db, "tenant", "create", "acme")
    operator = _token(router, db, "acme", "ops", "operator")
    bundle = router.workdir / "bundle.json"
    _server_cli(
        router, db, "device", "enroll", "--tenant", "acme", "--device", "edge-01",
        "--url", URL, "--out", str(bundle),
    )  # fmt: skip
    router.spawn_in_client(
        *TRUEUP, "server", "run", "--db", db, "--listen", f"198.51.100.1:{PORT}",
        log=router.workdir / "server.log",
    )  # fmt: skip
    router.wait_for(lambda: router.from_client(f"{URL}/healthz")[0] == 200, what="control plane up")

    router.ip("link", "set", "mgmt0", "up")
    router.ip("addr", "add", "198.51.100.2/24", "dev", "mgmt0")
    fallback = router.write("fallback.yaml", base_document(interfaces=[], routes=[]))
    token_file = router.workdir / "device.token"
    enrolled = router.trueup(
        "agent", "enroll", "--bundle", str(bundle), "--token-file", str(token_file), state=False
    )
    assert enrolled.returncode == 0, enrolled.stderr
    router.start_agent(
        "--management-fallback", str(fallback), "--control-plane", URL,
        "--token-file", str(token_file), env={"TRUEUP_HEARTBEAT_SECONDS": str(HEARTBEAT)},
    )  # fmt: skip
    status, body = router.from_client(
        f"{URL}/api/v1/devices/edge-01/desired", operator, method="PUT",
        body=base_document(), headers={"If-Match": "0"},
    )  # fmt: skip
    assert status == 201, body
    router.wait_for(
        lambda: "203.0.113.1/24" in router.addresses("lan0"), what="revision 1 on the kernel"
    )
    router.wait_for(
        lambda: _device(router, operator)["status"] == "in_sync", what="the fleet says in sync"
    )
    assert _device(router, operator)["heartbeat_interval"] == HEARTBEAT
    assert _healed_addresses(router, operator) is None

    with chromium(router.client) as browser:
        fleet = _login(browser, operator)
        row = 'tr[data-device="edge-01"]'
        fleet.wait_for_selector(f'{row}[data-status="in_sync"]', timeout=WAIT_MS)
        device = fleet.context.new_page()  # the same session
        device.goto("/ui/devices/edge-01")
        device.wait_for_selector("#device-live", timeout=WAIT_MS)
        assert device.locator("tr.drift-record").count() == 0

        # Someone removes the LAN address; trueup puts it back at once.
        router.ip("addr", "del", "203.0.113.1/24", "dev", "lan0")
        router.wait_for(
            lambda: "203.0.113.1/24" in router.addresses("lan0"), what="the heal", timeout=10
        )
        router.wait_for(
            lambda: _healed_addresses(router, operator) is not None,
            what="the healed drift in the device API",
            timeout=10,
        )
        record = _healed_addresses(router, operator)
        assert record is not None
        assert any("RTM_DELADDR" in who for who in record["changed_by"]), record
        assert record["healed_by"]["by"] == "trueup"
        assert record["healed_by"]["action"] == "heal"
        assert record["healed_by"]["txn"]
        assert "spec.interfaces[lan0].addresses" in record["paths"]
        entry = _device(router, operator)
        assert entry["last_drift"]["healed_at"] is not None

        # The open pages follow without a reload.
        cell = fleet.locator(f'{row} td.last-drift[data-state="healed"]')
        cell.wait_for(timeout=WAIT_MS)
        assert re.search(r"healed \d+ s ago", cell.inner_text()), cell.inner_text()
        screenshot(fleet, "fleet-healed-drift")
        healed_row = device.locator('#live-drift tr.drift-record[data-state="healed"]')
        healed_row.first.wait_for(timeout=WAIT_MS)
        assert "RTM_DELADDR" in device.locator("#live-drift").inner_text()
        assert record["healed_by"]["txn"] in device.locator("#live-drift").inner_text()
        mark = device.locator('#live-timeline svg.timeline circle[data-kind="healed"]')
        mark.first.wait_for(state="attached", timeout=WAIT_MS)
        screenshot(device, "device-healed-drift")

        # A hold on healing set on the router is shown, and then its expiry.
        held = router.trueup("ack", "routes", "--for", "6s", "--reason", "INC-77 lab test")
        assert held.returncode == 0, held.stdout + held.stderr
        active = device.locator('li.agent-ack[data-subsystem="routes"][data-state="active"]')
        active.wait_for(timeout=WAIT_MS)
        assert "INC-77 lab test" in active.inner_text()
        screenshot(device, "device-router-ack")
        expired = device.locator('li.agent-ack[data-subsystem="routes"][data-state="expired"]')
        expired.wait_for(timeout=WAIT_MS + 6_000)
        assert "expired" in expired.inner_text()
        acks = {a["subsystem"]: a for a in _device(router, operator)["agent_acknowledgements"]}
        assert acks["routes"]["state"] == "expired"
