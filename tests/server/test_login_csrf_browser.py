"""Cross-site sign-in and sign-out in Chromium: a page on another origin cannot switch or end
a signed-in operator's session.

The control plane is a real server process on 127.0.0.1; the attacker's pages
are served from 127.0.0.2 (another site to the browser, loopback only). A
signed-in operator opens them; each auto-submits a form to /ui/login (with the
attacker's token and a pre-session token the attacker fetched for itself) or
to /ui/logout. Both are refused with 403 and the operator is still signed in
as themselves, in their own tenant, with the same session cookie. The
dashboard's own sign-in and sign-out keep working in the same browser.
"""

from __future__ import annotations

import html
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.browser import chromium
from tests.server.conftest import BACKENDS, ServerProcess, create_pg_database, drop_pg_database
from trueup.server.dashboard.session import COOKIE
from trueup.server.db import Database
from trueup.server.keys import load_or_create_server_key
from trueup.server.service import ControlPlane
from trueup.server.tokens import Role

WAIT_MS = 30_000
ATTACKER_HOST = "127.0.0.2"


@dataclass
class Stage:
    url: str  # the control plane
    attacker_url: str
    victim_token: str
    victim_tenant: str
    attacker_token: str


def _attacker_pages(target: str, attacker_token: str) -> dict[str, str]:
    # A pre-session token the attacker got from the server for itself: valid, but
    # bound to a cookie only the attacker holds.
    form = httpx.get(f"{target}/ui/login", timeout=30).text
    field = re.search(r'name="login_csrf" value="([^"]+)"', form)
    assert field is not None

    def autosubmit(action: str, fields: dict[str, str]) -> str:
        inputs = "".join(
            f'<input type="hidden" name="{html.escape(k)}" value="{html.escape(v)}">'
            for k, v in fields.items()
        )
        return (
            f'<!doctype html><html><body><form id="f" method="post" action="{action}">'
            f"{inputs}</form><script>document.getElementById('f').submit()</script>"
            "</body></html>"
        )

    return {
        "/login.html": autosubmit(
            f"{target}/ui/login", {"token": attacker_token, "login_csrf": field.group(1)}
        ),
        "/logout.html": autosubmit(f"{target}/ui/logout", {"csrf": "guessed"}),
    }


def _serve(pages: dict[str, str]) -> tuple[ThreadingHTTPServer, threading.Thread]:
    class Pages(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = pages.get(self.path, "").encode()
            self.send_response(200 if body else 404)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: Any) -> None:
            return

    attacker = ThreadingHTTPServer((ATTACKER_HOST, 0), Pages)
    thread = threading.Thread(target=attacker.serve_forever, daemon=True)
    thread.start()
    return attacker, thread


@pytest.fixture(params=BACKENDS)
def stage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stage]:
    pg_name = create_pg_database() if request.param == "postgres" else ""
    url = (
        f"postgresql://postgres@127.0.0.1:5432/{pg_name}"
        if pg_name
        else f"sqlite:///{tmp_path}/server.db"
    )
    key_file = tmp_path / "server.key"
    database = Database(url)
    database.migrate()
    plane = ControlPlane(database, load_or_create_server_key(key_file))
    tokens = {}
    for tenant in ("victim", "attacker"):
        tenant_id = plane.create_tenant(tenant, "test")
        plane.create_user(tenant_id, f"{tenant}-operator", Role.OPERATOR, "test")
        tokens[tenant] = plane.create_token(tenant_id, f"{tenant}-operator", "test")[1]
    server = ServerProcess(url, key_file, auth_cache_seconds=0.0)
    attacker: ThreadingHTTPServer | None = None
    thread: threading.Thread | None = None
    try:
        server.start()
        attacker, thread = _serve(_attacker_pages(server.url, tokens["attacker"]))
        yield Stage(
            url=server.url,
            attacker_url=f"http://{ATTACKER_HOST}:{attacker.server_address[1]}",
            victim_token=tokens["victim"],
            victim_tenant="victim",
            attacker_token=tokens["attacker"],
        )
    finally:
        if attacker is not None and thread is not None:
            attacker.shutdown()
            attacker.server_close()
            thread.join(10)
        server.stop()
        database.dispose()
        if pg_name:
            drop_pg_database(pg_name)


def _who(page: Any) -> str:
    page.wait_for_selector("header .who", timeout=WAIT_MS)
    return str(page.inner_text("header .who"))


def _session_cookie(context: Any) -> str:
    values = [c["value"] for c in context.cookies() if c["name"] == COOKIE]
    assert len(values) == 1, values
    return str(values[0])


def _attacked(page: Any, attacker_page: str, route: str) -> Any:
    """Open an attacker page; the answer to the form it posts to `route`."""
    with page.expect_response(
        lambda r: r.url.endswith(route) and r.request.method == "POST", timeout=WAIT_MS
    ) as posted:
        page.goto(attacker_page, timeout=WAIT_MS)
    return posted.value


def test_a_page_on_another_origin_can_neither_sign_in_nor_sign_out(stage: Stage) -> None:
    with chromium() as browser:
        context = browser.new_context()
        page = context.new_page()
        # The dashboard's own sign-in (same origin: the browser sends Origin and
        # Sec-Fetch-Site: same-origin, and the pre-session token).
        page.goto(f"{stage.url}/ui/login", timeout=WAIT_MS)
        page.fill("input[name=token]", stage.victim_token)
        page.click("button[type=submit]")
        page.wait_for_selector("table.fleet", timeout=WAIT_MS)
        before = _who(page)
        assert "victim-operator" in before and "tenant victim" in before
        cookie = _session_cookie(context)

        for attacker_page, route, what in (
            ("/login.html", "/ui/login", "sign-in refused"),
            ("/logout.html", "/ui/logout", "sign-out refused"),
        ):
            answer = _attacked(page, stage.attacker_url + attacker_page, route)
            assert answer.request.header_value("sec-fetch-site") == "cross-site"
            assert answer.status == 403, (route, answer.status)
            assert "set-cookie" not in answer.headers
            page.wait_for_selector("p.error", timeout=WAIT_MS)
            assert what in page.inner_text("p.error")
            # The operator is still signed in as themselves, with the same session.
            assert _session_cookie(context) == cookie
            page.goto(f"{stage.url}/", timeout=WAIT_MS)
            page.wait_for_selector("table.fleet", timeout=WAIT_MS)
            assert _who(page) == before

        # The dashboard's own sign-out still works.
        page.click("header form button[type=submit]")
        page.wait_for_selector("input[name=token]", timeout=WAIT_MS)
        assert page.url.endswith("/ui/login")
        assert not [c for c in context.cookies() if c["name"] == COOKIE]
        page.goto(f"{stage.url}/", timeout=WAIT_MS)
        page.wait_for_selector("input[name=token]", timeout=WAIT_MS)
        assert page.url.endswith("/ui/login")
        context.close()


def test_a_cross_site_sign_in_does_not_sign_in_a_signed_out_browser(stage: Stage) -> None:
    with chromium() as browser:
        context = browser.new_context()
        page = context.new_page()
        page.goto(f"{stage.url}/ui/login", timeout=WAIT_MS)  # holds a pre-session token
        answer = _attacked(page, stage.attacker_url + "/login.html", "/ui/login")
        assert answer.status == 403
        assert not [c for c in context.cookies() if c["name"] == COOKIE]
        page.goto(f"{stage.url}/", timeout=WAIT_MS)
        page.wait_for_selector("input[name=token]", timeout=WAIT_MS)
        assert page.url.endswith("/ui/login")
        context.close()
