"""Sign-in and sign-out over HTTP: the pre-session token and each Origin / Sec-Fetch-Site case.

A refused sign-in or sign-out is a 403 that sets and drops no cookie: the
browser's session stays what it was. The Chromium test with a page on another
origin is test_login_csrf_browser.py."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient
from httpx import Response

from tests.server.conftest import Server
from tests.server.test_dashboard import browser, csrf_of, login_csrf_of, sign_in
from trueup.server.dashboard.sameorigin import cross_origin_reason, origin_of, own_origins
from trueup.server.dashboard.session import COOKIE, LOGIN_COOKIE, LoginTokens


def signed_in_as(client: TestClient) -> str:
    """The `user · role · tenant` line of the fleet page; '' when not signed in."""
    page = client.get("/", follow_redirects=False)
    if page.status_code != 200:
        return ""
    start = page.text.index('<span class="who">')
    return page.text[start : page.text.index("</span>", start)]


def assert_refused(answer: Response, what: str) -> None:
    assert answer.status_code == 403, answer.text
    assert f"{what} refused" in answer.text and "nothing was changed" in answer.text
    assert "set-cookie" not in answer.headers


def test_sign_in_needs_the_pre_session_token_of_the_same_browser(server: Server) -> None:
    tenant = server.tenant()
    client = TestClient(server.client.app)
    form = client.get("/ui/login")
    assert 'name="login_csrf"' in form.text
    cookie = form.headers["set-cookie"].lower()
    assert LOGIN_COOKIE in cookie and "httponly" in cookie and "samesite=strict" in cookie
    assert "path=/ui/login" in cookie
    field = login_csrf_of(form.text)
    # A reload keeps the browser's token (a second tab's form still works).
    assert login_csrf_of(client.get("/ui/login").text) == field

    no_field = client.post("/ui/login", data={"token": tenant.tokens["viewer"]})
    assert_refused(no_field, "sign-in")
    forged = client.post("/ui/login", data={"token": tenant.tokens["viewer"], "login_csrf": "x"})
    assert_refused(forged, "sign-in")
    # Another browser's pair: its field does not go with this browser's cookie.
    other = TestClient(server.client.app)
    other_field = login_csrf_of(other.get("/ui/login").text)
    assert other_field != field
    mixed = client.post(
        "/ui/login", data={"token": tenant.tokens["viewer"], "login_csrf": other_field}
    )
    assert_refused(mixed, "sign-in")
    # The field without its cookie (a page on another site has no cookie to send).
    bare = TestClient(server.client.app)
    answer = bare.post("/ui/login", data={"token": tenant.tokens["viewer"], "login_csrf": field})
    assert_refused(answer, "sign-in")
    assert signed_in_as(client) == "" and signed_in_as(bare) == ""

    accepted = client.post(
        "/ui/login",
        data={"token": tenant.tokens["viewer"], "login_csrf": field},
        follow_redirects=False,
    )
    assert accepted.status_code == 303
    assert "viewer-user" in signed_in_as(client)
    assert LOGIN_COOKIE not in client.cookies  # used up with the sign-in


def test_an_expired_pre_session_token_is_refused(server: Server) -> None:
    tenant = server.tenant()
    tokens = LoginTokens(server.plane.key)
    cookie, field = tokens.issue(now=time.time() - 2 * 3600)
    assert tokens.check(cookie, field, now=time.time() - 2 * 3600 + 60)

    def post_with(pair: tuple[str, str]) -> tuple[TestClient, Response]:
        client = TestClient(server.client.app)
        client.cookies.set(LOGIN_COOKIE, pair[0], domain="testserver.local", path="/ui/login")
        data = {"token": tenant.tokens["viewer"], "login_csrf": pair[1]}
        return client, client.post("/ui/login", data=data, follow_redirects=False)

    # A pair that is still valid, sent the same way, signs in: the cookie did arrive.
    _client, fresh = post_with(tokens.issue())
    assert fresh.status_code == 303, fresh.text
    client, answer = post_with((cookie, field))
    assert_refused(answer, "sign-in")
    # The sign-in page then issues a fresh one.
    assert login_csrf_of(client.get("/ui/login").text) != field


@pytest.mark.parametrize(
    ("headers", "accepted"),
    [
        ({}, True),
        ({"Sec-Fetch-Site": "same-origin"}, True),
        ({"Sec-Fetch-Site": "none"}, True),
        ({"Sec-Fetch-Site": "same-origin", "Origin": "http://testserver"}, True),
        ({"Origin": "http://testserver"}, True),
        ({"Origin": "http://TestServer:80"}, True),
        ({"Sec-Fetch-Site": "cross-site"}, False),
        ({"Sec-Fetch-Site": "same-site"}, False),
        ({"Sec-Fetch-Site": "something-new"}, False),
        ({"Sec-Fetch-Site": "cross-site", "Origin": "http://testserver"}, False),
        ({"Sec-Fetch-Site": "same-origin", "Origin": "http://attacker.example"}, False),
        ({"Origin": "http://attacker.example"}, False),
        ({"Origin": "https://testserver"}, False),
        ({"Origin": "http://testserver:8080"}, False),
        ({"Origin": "http://sub.testserver"}, False),
        ({"Origin": "null"}, False),
    ],
)
def test_sign_in_by_origin_and_fetch_site(
    server: Server, headers: dict[str, str], accepted: bool
) -> None:
    tenant = server.tenant()
    client = TestClient(server.client.app)
    answer = sign_in(client, tenant.tokens["operator"], **headers)
    if accepted:
        assert answer.status_code == 303, answer.text
        assert "operator-user" in signed_in_as(client)
    else:
        assert_refused(answer, "sign-in")
        assert signed_in_as(client) == ""


def test_a_cross_site_sign_in_leaves_the_signed_in_session_as_it_was(server: Server) -> None:
    victim, attacker = server.tenant("victim"), server.tenant("attacker")
    client = browser(server, victim, "admin")
    before = signed_in_as(client)
    assert victim.name in before and "admin-user" in before
    session_cookie = client.cookies[COOKIE]
    for headers in (
        {"Sec-Fetch-Site": "cross-site", "Origin": "http://attacker.example"},
        {"Origin": "http://attacker.example"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Origin": "null"},
    ):
        # Even with a valid pre-session token (an old browser sending every cookie).
        answer = sign_in(client, attacker.tokens["viewer"], **headers)
        assert_refused(answer, "sign-in")
        assert client.cookies[COOKIE] == session_cookie
        assert signed_in_as(client) == before


@pytest.mark.parametrize(
    "headers",
    [
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
        {"Origin": "http://attacker.example"},
        {"Origin": "null"},
        {"Sec-Fetch-Site": "same-origin", "Origin": "http://attacker.example"},
    ],
)
def test_a_cross_site_sign_out_is_refused_and_the_session_stays(
    server: Server, headers: dict[str, str]
) -> None:
    tenant = server.tenant()
    client = browser(server, tenant, "viewer")
    csrf = csrf_of(client.get("/").text)
    before = signed_in_as(client)
    answer = client.post("/ui/logout", data={"csrf": csrf}, headers=headers, follow_redirects=False)
    assert_refused(answer, "sign-out")
    assert signed_in_as(client) == before != ""


def test_sign_out_needs_the_session_csrf_token_and_same_origin(server: Server) -> None:
    tenant = server.tenant()
    client = browser(server, tenant, "viewer")
    csrf = csrf_of(client.get("/").text)
    before = signed_in_as(client)
    for data in ({}, {"csrf": ""}, {"csrf": csrf + "x"}):
        answer = client.post("/ui/logout", data=data, follow_redirects=False)
        assert_refused(answer, "sign-out")
        assert "still signed in" in answer.text
        assert signed_in_as(client) == before
    # Without a session there is nothing to end, and no cookie is touched.
    bare = TestClient(server.client.app)
    answer = bare.post("/ui/logout", data={"csrf": csrf}, follow_redirects=False)
    assert answer.status_code == 303 and "set-cookie" not in answer.headers
    # The dashboard's own form: same origin, the session's token.
    answer = client.post(
        "/ui/logout",
        data={"csrf": csrf},
        headers={"Sec-Fetch-Site": "same-origin", "Origin": "http://testserver"},
        follow_redirects=False,
    )
    assert answer.status_code == 303 and answer.headers["location"] == "/ui/login"
    assert signed_in_as(client) == ""


def test_a_proxy_that_rewrites_host_is_served_by_the_public_url() -> None:
    # Behind a proxy that sends Host: 127.0.0.1:8080, the browser's origin is the
    # public URL's; a request's own scheme and Host are accepted too.
    public = "https://cp.example.org/"
    headers = {"host": "127.0.0.1:8080", "origin": "https://cp.example.org"}
    assert cross_origin_reason(headers, "http", public) is None
    assert cross_origin_reason({**headers, "origin": "http://127.0.0.1:8080"}, "http", "") is None
    refused = cross_origin_reason({**headers, "origin": "https://evil.example"}, "http", public)
    assert refused is not None and "https://cp.example.org" in refused
    assert "--public-url" in refused
    # X-Forwarded-Host is never taken for the server's own.
    forwarded = {**headers, "x-forwarded-host": "evil.example", "origin": "https://evil.example"}
    assert cross_origin_reason(forwarded, "https", "") is not None


def test_origins_are_compared_as_origins() -> None:
    assert origin_of("HTTP://Example.ORG:80/path?q") == "http://example.org"
    assert origin_of("https://example.org:443") == "https://example.org"
    assert origin_of("https://example.org:8443") == "https://example.org:8443"
    assert origin_of("http://[2001:DB8::1]:8080") == "http://[2001:db8::1]:8080"
    for bad in ("null", "", "ftp://example.org", "http://", "http://x:99999"):
        assert origin_of(bad) is None, bad
    assert own_origins("https", "cp.example.org", "http://192.0.2.1:8443") == {
        "https://cp.example.org",
        "http://192.0.2.1:8443",
    }
    assert own_origins("http", None, "") == set()
