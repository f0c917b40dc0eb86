"""The dashboard over HTTP (no browser): sessions, CSRF, roles, tenants, derived states.

The browser tests are tests/integration/test_dashboard_e2e.py."""

from __future__ import annotations

import re

import yaml
from fastapi.testclient import TestClient
from httpx import Response

from tests.server.conftest import Server, Tenant, document
from trueup.server.dashboard.data import report_conditions
from trueup.server.dashboard.session import COOKIE
from trueup.server.dashboard.timeline import timeline_events, timeline_svg


def login_csrf_of(html: str) -> str:
    match = re.search(r'name="login_csrf" value="([^"]+)"', html)
    assert match is not None, "the sign-in form carries no pre-session token"
    return match.group(1)


def sign_in(client: TestClient, token: str, **headers: str) -> Response:
    """Open the sign-in page (its pre-session token) and post `token` with it."""
    field = login_csrf_of(client.get("/ui/login").text)
    return client.post(
        "/ui/login",
        data={"token": token, "login_csrf": field},
        headers=headers,
        follow_redirects=False,
    )


def browser(server: Server, tenant: Tenant | None = None, role: str = "operator") -> TestClient:
    """A client with a cookie jar of its own, logged in with the tenant's `role` token."""
    client = TestClient(server.client.app)
    if tenant is not None:
        answer = sign_in(client, tenant.tokens[role])
        assert answer.status_code == 303, answer.text
    return client


def csrf_of(html: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', html)
    assert match is not None
    return match.group(1)


def test_pages_need_a_session_and_login_sets_a_strict_httponly_cookie(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01",))
    client = browser(server)
    for path in ("/", "/ui/devices/edge-01", "/ui/devices/edge-01/evidence"):
        answer = client.get(path, follow_redirects=False)
        assert answer.status_code == 303 and answer.headers["location"] == "/ui/login", path
    refused = sign_in(client, "not-a-token")
    assert refused.status_code == 401 and "unknown, revoked or expired" in refused.text
    answer = sign_in(client, tenant.tokens["viewer"])
    cookie = answer.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie
    assert tenant.tokens["viewer"] not in answer.headers["set-cookie"]
    page = client.get("/")
    assert page.status_code == 200 and "edge-01" in page.text
    assert tenant.tokens["viewer"] not in page.text
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    # A forged or damaged cookie is no session.
    client.cookies.set(COOKIE, "A" * 80)
    assert client.get("/", follow_redirects=False).status_code == 303


def test_logout_needs_the_csrf_token_and_ends_the_session(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01",))
    client = browser(server, tenant, "viewer")
    html = client.get("/").text
    assert client.post("/ui/logout", data={"csrf": "wrong"}).status_code == 403
    answer = client.post("/ui/logout", data={"csrf": csrf_of(html)}, follow_redirects=False)
    assert answer.status_code == 303
    assert client.get("/", follow_redirects=False).status_code == 303


def test_a_revoked_token_ends_its_sessions(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01",))
    tenant_id = server.plane.tenant_id(tenant.name)
    token_id, token = server.plane.create_token(tenant_id, "viewer-user", "test")
    client = TestClient(server.client.app)
    assert sign_in(client, token).status_code == 303
    assert client.get("/", follow_redirects=False).status_code == 200
    server.plane.revoke_token(tenant_id, token_id, "test")
    assert client.get("/", follow_redirects=False).status_code == 303


def test_a_viewer_sees_but_cannot_apply_or_acknowledge(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01",))
    client = browser(server, tenant, "viewer")
    page = client.get("/ui/devices/edge-01")
    assert page.status_code == 200 and 'id="apply-denied"' in page.text
    assert "apply-form" not in page.text and "ack-form" not in page.text
    csrf = csrf_of(page.text)
    body = yaml.safe_dump(document("edge-01"))
    refused = client.post(
        "/ui/devices/edge-01/apply", data={"csrf": csrf, "expected": "0", "document": body}
    )
    assert refused.status_code == 403
    refused = client.post(
        "/ui/devices/edge-01/ack",
        data={"csrf": csrf, "subsystem": "links", "for_seconds": "60", "reason": "x"},
    )
    assert refused.status_code == 403
    assert server.plane.desired(server.plane.tenant_id(tenant.name), "edge-01") is None


def test_apply_checks_csrf_and_if_match_and_keeps_the_draft_on_a_conflict(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01",))
    client = browser(server, tenant)
    csrf = csrf_of(client.get("/ui/devices/edge-01").text)
    body = yaml.safe_dump(document("edge-01"))
    forged = client.post("/ui/devices/edge-01/apply", data={"expected": "0", "document": body})
    assert forged.status_code == 403
    stored = client.post(
        "/ui/devices/edge-01/apply",
        data={"csrf": csrf, "expected": "0", "document": body, "comment": "first"},
        follow_redirects=False,
    )
    assert stored.status_code == 303 and "applied=1" in stored.headers["location"]
    draft = yaml.safe_dump(document("edge-01", address="198.51.100.9/24"))
    stale = client.post(
        "/ui/devices/edge-01/apply", data={"csrf": csrf, "expected": "0", "document": draft}
    )
    assert stale.status_code == 409
    assert "STATE_CONCURRENT_MODIFICATION" in stale.text and "198.51.100.9/24" in stale.text
    invalid = client.post(
        "/ui/devices/edge-01/apply",
        data={"csrf": csrf, "expected": "1", "document": "spec: [unclosed"},
    )
    assert invalid.status_code == 422 and "nothing was changed" in invalid.text
    revision = server.plane.desired(server.plane.tenant_id(tenant.name), "edge-01")
    assert revision is not None and revision.version == 1 and revision.comment == "first"


def test_acknowledging_shows_the_expiry_and_refuses_bad_input(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01",))
    client = browser(server, tenant)
    csrf = csrf_of(client.get("/ui/devices/edge-01").text)
    page = client.post(
        "/ui/devices/edge-01/ack",
        data={"csrf": csrf, "subsystem": "links", "for_seconds": "3600", "reason": "INC-1"},
    )
    assert page.status_code == 200
    assert re.search(r"links: acknowledged until .*\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", page.text)
    bad = client.post(
        "/ui/devices/edge-01/ack",
        data={"csrf": csrf, "subsystem": "links", "for_seconds": "0", "reason": ""},
    )
    assert bad.status_code == 422 and "for_seconds" in bad.text


def test_tenants_never_see_each_other(server: Server) -> None:
    a = server.tenant("a", devices=("edge-in-a",))
    b = server.tenant("b", devices=("edge-in-b",))
    client = browser(server, a)
    assert "edge-in-b" not in client.get("/?q=edge-in").text
    for path in ("/ui/devices/edge-in-b", "/ui/devices/edge-in-b/evidence"):
        assert client.get(path).status_code == 404, path
    assert "edge-in-b" in browser(server, b).get("/").text


def test_fleet_filter_search_pages_and_stream(server: Server) -> None:
    tenant = server.tenant(devices=tuple(f"edge-{i:03}" for i in range(3)))
    tenant_id = server.plane.tenant_id(tenant.name)
    for i in range(3, 130):
        server.plane.create_device(tenant_id, f"edge-{i:03}", "test")
    client = browser(server, tenant, "viewer")
    first = client.get("/")
    assert "page 1 of 2" in first.text and "edge-000" in first.text and "edge-120" not in first.text
    assert "edge-120" in client.get("/?page=2").text
    found = client.get("/?q=edge-12")
    assert found.text.count('data-device="edge-12') == 10  # edge-120 … edge-129
    stale = client.get("/?status=heartbeat_stale")
    assert 'id="fleet-matched">130<' in stale.text
    assert 'data-status="in_sync"' not in client.get("/?status=in_sync").text


def test_fenced_and_restore_pending_come_from_the_report() -> None:
    fenced = {"subsystems": {"dhcp": {"health": "fenced", "reason": "held by restore r-1"}}}
    assert report_conditions(fenced) == ["fenced", "restore_pending"]
    assert report_conditions({"subsystems": {"dhcp": {"health": "ok"}}}) == []
    assert report_conditions({"restore": {"state": "staged", "pending": True}}) == [
        "restore_pending"
    ]
    assert report_conditions({"restore": {"state": "completed", "pending": False}}) == []
    assert report_conditions(None) == []


def test_a_fenced_device_is_listed_as_fenced_and_restore_pending(server: Server) -> None:
    tenant = server.tenant(devices=("edge-fenced", "edge-fine"))
    for device in ("edge-fenced", "edge-fine"):
        health = "fenced" if device == "edge-fenced" else "ok"
        answer = server.client.post(
            "/api/v1/agent/report",
            json={
                "applied_version": 0,
                "subsystems": {"dhcp": {"health": health, "reason": "held by restore r-1"}},
            },
            headers=tenant.device_auth(device),
        )
        assert answer.status_code == 200, answer.text
    client = browser(server, tenant, "viewer")
    fenced = client.get("/?status=fenced").text
    assert 'data-device="edge-fenced" data-status="restore_pending"' in fenced
    assert "edge-fine" not in fenced
    page = client.get("/ui/devices/edge-fenced").text
    assert "Restore: PENDING" in page and "held by restore r-1" in page


def test_the_timeline_marks_drift_heals_and_applies() -> None:
    reports = [
        {"received_at": 100.0, "applied_version": 1, "reason_codes": []},
        {"received_at": 110.0, "applied_version": 1, "reason_codes": ["STATE_DRIFT_DETECTED"]},
        {"received_at": 120.0, "applied_version": 1, "reason_codes": []},
        {"received_at": 130.0, "applied_version": 2, "reason_codes": []},
    ]
    revisions = [{"version": 2, "author": "user:t/ops", "created_at": 125.0}]
    events = timeline_events(list(reversed(reports)), revisions)
    lanes = [(e.lane, e.at) for e in events]
    assert lanes == [("drift", 110.0), ("heal", 120.0), ("revision", 125.0), ("apply", 130.0)]
    svg = timeline_svg(events, 140.0)
    assert svg.startswith("<svg") and svg.count('class="ev drift"') == 1


def test_reported_text_is_escaped(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01",))
    answer = server.client.post(
        "/api/v1/agent/report",
        json={
            "applied_version": 0,
            "subsystems": {"links": {"health": "degraded", "reason": "<script>alert(1)</script>"}},
            "diff_summary": {
                "paths": ["<img src=x onerror=alert(2)>"],
                "subsystems": {"links": "<b>"},
            },
        },
        headers=tenant.device_auth("edge-01"),
    )
    assert answer.status_code == 200, answer.text
    page = browser(server, tenant, "viewer").get("/ui/devices/edge-01").text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script>alert" not in page and "<img src=x" not in page and "<b>" not in page


def test_the_device_page_shows_known_limitations_and_what_they_cover(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01",))
    limitation = {
        "id": "lim-1",
        "subsystem": "links",
        "path": "spec.interfaces[lan0].mtu",
        "reason": "the <NIC> caps the MTU",
        "reviewed_by": "net-team",
        "ticket": "OPS-42",
    }
    answer = server.client.post(
        "/api/v1/agent/report",
        json={
            "applied_version": 0,
            "subsystems": {"links": {"health": "ok", "reason": None}},
            "diff_summary": {
                "paths": [],
                "subsystems": {},
                "accepted": ["spec.interfaces[lan0].mtu"],
                "limitations": [limitation],
            },
        },
        headers=tenant.device_auth("edge-01"),
    )
    assert answer.status_code == 200, answer.text
    page = browser(server, tenant, "viewer").get("/ui/devices/edge-01").text
    assert "<h2>Known limitations</h2>" in page
    assert "lim-1" in page and "OPS-42" in page and "net-team" in page
    assert "the &lt;NIC&gt; caps the MTU" in page
    assert "accepted differences (not drift)" in page
    # A device that reported none shows no such section.
    other = server.tenant(devices=("edge-02",))
    quiet = browser(server, other, "viewer").get("/ui/devices/edge-02").text
    assert "Known limitations" not in quiet
