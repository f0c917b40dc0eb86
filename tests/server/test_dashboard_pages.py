"""Every dashboard page is declared one way (`Pages.get` / `Pages.post`, pages.py), so each
one checks the session, its role and, for a form, the CSRF token: asked of every page
route the application has, not of a list kept by hand."""

from __future__ import annotations

import re

from fastapi.routing import APIRoute

from tests.server.conftest import Server
from tests.server.test_dashboard import browser, csrf_of
from trueup.server.dashboard.pages import PageRoute

# Session routes declared by hand, each for its reason: sign-out checks its own origin and
# CSRF token (loginroutes.py); the evidence routes are evidenceroutes.py's (they call the
# same checks of `Pages` by hand).
BY_HAND = {
    ("POST", "/ui/logout"),
    ("GET", "/ui/devices/{device}/evidence"),
    ("POST", "/ui/devices/{device}/evidence-requests"),
    ("GET", "/ui/devices/{device}/evidence/{evidence_id}"),
}
PARAMS = {"device": "edge-01", "rid": "999999", "name": "no-such-profile", "action": "pause"}


def declared(server: Server) -> list[PageRoute]:
    pages: list[PageRoute] = server.client.app.state.dashboard_pages.declared  # type: ignore[attr-defined]
    return pages


def concrete(path: str) -> str:
    return re.sub(r"\{([^}]+)\}", lambda m: PARAMS[m.group(1)], path)


def test_every_session_route_is_a_declared_page_but_the_few_by_hand(server: Server) -> None:
    pages = {(r.method, r.path) for r in declared(server)}
    session_routes = {
        (method, route.path)
        for route in server.client.app.routes
        if isinstance(route, APIRoute)
        and (route.openapi_extra or {}).get("x-trueup-role") == "session"
        for method in route.methods
    }
    assert len(pages) >= 15
    assert session_routes - pages == BY_HAND
    assert pages <= session_routes
    assert {r.role for r in declared(server)} == {"viewer", "operator"}


def test_without_a_session_every_page_sends_the_browser_to_sign_in(server: Server) -> None:
    server.tenant(devices=("edge-01",))
    client = browser(server)
    for page in declared(server):
        answer = client.request(page.method, concrete(page.path), follow_redirects=False)
        if page.path.endswith("/stream"):
            assert answer.status_code == 401, page
        else:
            assert answer.status_code == 303, (page, answer.text)
            assert answer.headers["location"] == "/ui/login", page


def test_each_form_checks_the_role_then_the_csrf_token(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01",))
    forms = [p for p in declared(server) if p.method == "POST"]
    assert forms
    viewer = browser(server, tenant, "viewer")
    csrf = csrf_of(viewer.get("/").text)
    for form in forms:
        path = concrete(form.path)
        answer = viewer.post(path, data={"csrf": csrf}, follow_redirects=False)
        if form.role == "operator":
            assert answer.status_code == 403, form
            assert "this needs the operator role; yours is viewer" in answer.text, form
        else:
            assert answer.status_code != 403, (form, answer.text)
    operator = browser(server, tenant, "operator")
    for form in forms:
        answer = operator.post(concrete(form.path), data={"csrf": "forged"}, follow_redirects=False)
        assert answer.status_code == 403, form
        assert "CSRF check" in answer.text, form


def test_a_signed_in_viewer_reads_every_page(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01",))
    viewer = browser(server, tenant, "viewer")
    for page in declared(server):
        if page.method != "GET" or page.path.endswith("/stream"):
            continue  # a stream of a page found runs until the client leaves
        answer = viewer.get(concrete(page.path), follow_redirects=False)
        assert answer.status_code in (200, 404), (page, answer.status_code, answer.text)
        assert answer.headers["x-frame-options"] == "DENY", page
