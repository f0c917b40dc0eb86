"""The edge of the control plane: no input gets a 500, every bound is the column's.

Each test reproduces an input that once failed (a 500, a closed connection, a
huge response or a body read before authentication) and asserts the 4xx it
gets now, on SQLite and on PostgreSQL (the `server` fixture runs both).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import stat
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from sqlalchemy.exc import OperationalError

from tests.server.conftest import Server, Tenant, document
from trueup.server.db import Database
from trueup.server.limits import (
    DEVICE_NAME_LENGTH,
    DOCUMENT_BYTES,
    MAX_VERSION,
    NAME_LENGTH,
    REPORT_BYTES,
    SUBSYSTEM_LENGTH,
    TOKEN_LABEL_LENGTH,
)
from trueup.server.tokens import Role

BILLION_LAUGHS = """\
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


def assert_problem(response: Any, status: int, *needles: str) -> None:
    """A 4xx in the one error shape, naming what is wrong, in a small body."""
    assert response.status_code == status, response.text
    body = response.json()
    assert isinstance(body["detail"], str)
    if status == 422:
        text = " ".join(body["problems"])
        assert all(isinstance(p, str) for p in body["problems"])
    else:
        text = body["detail"]
    for needle in needles:
        assert needle in text, (needle, body)
    assert len(response.content) < 4096


def put_desired(server: Server, tenant: Tenant, device: str, body: bytes, **headers: Any) -> Any:
    return server.client.put(
        f"/api/v1/devices/{device}/desired",
        content=body,
        headers={
            **tenant.auth("operator"),
            "If-Match": "0",
            "content-type": "application/json",
            **headers,
        },
    )


def post_report(server: Server, tenant: Tenant, device: str, payload: Any) -> Any:
    return server.client.post(
        "/api/v1/agent/report",
        content=json.dumps(payload),
        headers={**tenant.device_auth(device), "content-type": "application/json"},
    )


# -- integers ------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [2**31, 2**63, -1])
def test_report_versions_beyond_an_integer_column_are_refused(server: Server, version: int) -> None:
    tenant = server.tenant(devices=("edge-01",))
    assert_problem(
        post_report(server, tenant, "edge-01", {"applied_version": version}),
        422,
        "body.applied_version",
    )
    override = {"version": version, "actor": "x", "reason": "r"}
    assert_problem(
        post_report(server, tenant, "edge-01", {"applied_version": 1, "override": override}),
        422,
        "body.override.version",
    )
    ok = post_report(server, tenant, "edge-01", {"applied_version": MAX_VERSION})
    assert ok.status_code == 200, ok.text


def test_nul_in_a_report_digest_is_refused(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01",))
    bad = post_report(server, tenant, "edge-01", {"observed_digest": "sha256:ab\x00cd"})
    assert_problem(bad, 422, "body.observed_digest")
    assert post_report(server, tenant, "edge-01", {"observed_digest": "sha256:abcd"}).status_code
    assert (
        post_report(server, tenant, "edge-01", {"observed_digest": "sha256:abcd"}).status_code
        == 200
    )


@pytest.mark.parametrize(
    "value",
    [
        str(2**63),
        str(2**31),
        str(MAX_VERSION),
        "\u0663",
        "\uff11",
        "1e3",
        "-1",
        '"1',
        "",
        "99999999999",
    ],
)
def test_if_match_out_of_range_or_not_ascii_digits_is_422(server: Server, value: str) -> None:
    tenant = server.tenant(devices=("edge-01",))
    response = server.client.put(
        "/api/v1/devices/edge-01/desired",
        json=document("edge-01"),
        headers={**tenant.auth("operator"), "If-Match": value.encode()},
    )
    assert_problem(response, 422, "header.If-Match")
    # Nothing was stored: the device is still at version 0.
    assert (
        server.client.get("/api/v1/devices/edge-01/desired", headers=tenant.auth("viewer")).headers[
            "ETag"
        ]
        == '"0"'
    )


def test_if_match_forms_still_accepted(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01",))
    for version, form in enumerate(["0", '"1"', 'W/"2"', " 3 "]):
        response = server.client.put(
            "/api/v1/devices/edge-01/desired",
            json=document("edge-01", address=f"198.51.100.{version + 2}/24"),
            headers={**tenant.auth("operator"), "If-Match": form},
        )
        assert response.status_code == 201, (form, response.text)


@pytest.mark.parametrize("number", [str(2**63), str(2**31), "\u0663", "-1"])
def test_path_numbers_beyond_an_integer_column_are_422(server: Server, number: str) -> None:
    tenant = server.tenant(devices=("edge-01",))
    revision = server.client.get(
        f"/api/v1/devices/edge-01/revisions/{number}", headers=tenant.auth("viewer")
    )
    assert_problem(revision, 422, "path.version")
    revoke = server.client.post(f"/api/v1/tokens/{number}/revoke", headers=tenant.auth("admin"))
    assert_problem(revoke, 422, "path.token_id")
    wait = server.client.get(
        f"/api/v1/agent/desired?after={number}", headers=tenant.device_auth("edge-01")
    )
    assert_problem(wait, 422, "query.after")


# -- strings: every column's length is accepted, one more is refused -----------------------


def test_longest_names_fit_their_columns_and_longer_ones_are_422(server: Server) -> None:
    # The longest actor the API can produce: a 200-character tenant and user, a 253-character
    # device. On PostgreSQL each of these once failed with a 500.
    tenant_name = "t" * (NAME_LENGTH - 6) + secrets.token_hex(3)
    tenant_id = server.plane.create_tenant(tenant_name, "test")
    user = "u" * NAME_LENGTH
    server.plane.create_user(tenant_id, user, Role.ADMIN, "test")
    token = server.plane.create_token(tenant_id, user, "test")[1]
    tenant = Tenant(tenant_name, {role.value: token for role in Role})
    device = "d" * DEVICE_NAME_LENGTH

    created = server.client.post(
        "/api/v1/devices", json={"name": device}, headers=tenant.auth("admin")
    )
    assert created.status_code == 201, created.text
    server.enroll(tenant, device)  # the exchange is audited with actor device:TENANT/DEVICE
    assert post_report(server, tenant, device, {"applied_version": 0}).status_code == 200
    revision = put_desired(server, tenant, device, json.dumps(document(device)).encode())
    assert revision.status_code == 201, revision.text
    assert revision.json()["author"] == f"user:{tenant_name}/{user}"
    secret = server.client.put(
        f"/api/v1/devices/{device}/secrets/{'s' * NAME_LENGTH}",
        json={"value": "v"},
        headers=tenant.auth("admin"),
    )
    assert secret.status_code == 201, secret.text
    label = server.client.post(
        f"/api/v1/users/{user}/tokens",
        json={"label": "l" * TOKEN_LABEL_LENGTH},
        headers=tenant.auth("admin"),
    )
    assert label.status_code == 201, label.text
    ack = server.client.post(
        f"/api/v1/devices/{device}/acks",
        json={"subsystem": "s" * SUBSYSTEM_LENGTH, "for_seconds": 60, "reason": "r" * 5000},
        headers=tenant.auth("admin"),
    )
    assert ack.status_code == 201, ack.text

    too_long = [
        ("post", "/api/v1/devices", {"name": "d" * (DEVICE_NAME_LENGTH + 1)}, "body.name"),
        ("post", "/api/v1/users", {"name": "u" * (NAME_LENGTH + 1), "role": "viewer"}, "body.name"),
        (
            "post",
            f"/api/v1/users/{user}/tokens",
            {"label": "l" * (TOKEN_LABEL_LENGTH + 1)},
            "body.label",
        ),
        (
            "post",
            f"/api/v1/devices/{device}/acks",
            {"subsystem": "s" * (SUBSYSTEM_LENGTH + 1), "for_seconds": 60, "reason": "r"},
            "body.subsystem",
        ),
        (
            "put",
            f"/api/v1/devices/{device}/secrets/{'s' * (NAME_LENGTH + 1)}",
            {"value": "v"},
            "path.name",
        ),
        ("get", f"/api/v1/devices/{'d' * (DEVICE_NAME_LENGTH + 1)}", None, "path.device"),
        ("get", f"/api/v1/devices?status={'x' * 1000}", None, "query.status"),
    ]
    for method, url, body, where in too_long:
        response = server.client.request(
            method.upper(), url, json=body, headers=tenant.auth("admin")
        )
        assert_problem(response, 422, where)


@pytest.mark.parametrize("bad", ["\x00", "\x1b[31m", "\x7f"])
def test_nul_and_control_characters_are_refused_in_names_and_text(server: Server, bad: str) -> None:
    tenant = server.tenant(devices=("edge-01",))
    url_bad = quote(bad)
    admin = tenant.auth("admin")
    cases = [
        ("post", "/api/v1/devices", {"name": f"edge{bad}"}, "name"),
        ("post", "/api/v1/users", {"name": f"user{bad}", "role": "viewer"}, "user"),
        ("post", "/api/v1/users/viewer-user/tokens", {"label": f"ci{bad}"}, "body.label"),
        (
            "post",
            "/api/v1/devices/edge-01/acks",
            {"subsystem": "links", "for_seconds": 60, "reason": f"why{bad}"},
            "body.reason",
        ),
        (
            "post",
            "/api/v1/devices/edge-01/acks",
            {"subsystem": f"links{bad}", "for_seconds": 60, "reason": "why"},
            "body.subsystem",
        ),
        ("get", f"/api/v1/devices/edge{url_bad}", None, "path.device"),
        ("get", f"/api/v1/devices/edge{url_bad}/revisions", None, "path.device"),
        ("put", f"/api/v1/users/user{url_bad}/role", {"role": "viewer"}, "path.user"),
        ("put", f"/api/v1/devices/edge-01/secrets/s{url_bad}", {"value": "v"}, "path.name"),
    ]
    for method, url, body, where in cases:
        response = server.client.request(method.upper(), url, json=body, headers=admin)
        assert_problem(response, 422, where)
    status, _read, body = put_raw(server, tenant, {"x-trueup-comment": f"c{bad}".encode()})
    assert status == 422 and b"X-Trueup-Comment" in body, body


def put_raw(
    server: Server, tenant: Tenant, headers: dict[str, str | bytes]
) -> tuple[int, int, bytes]:
    """PUT edge-01's first revision with raw header bytes (the test client re-encodes them)."""
    body = json.dumps(document("edge-01")).encode()
    return asgi_call(
        server,
        "/api/v1/devices/edge-01/desired",
        {
            **tenant.auth("operator"),
            "if-match": "0",
            "content-type": "application/json",
            "content-length": str(len(body)),
            **headers,
        },
        body,
        1,
        "PUT",
    )


def test_non_finite_ack_duration_is_refused(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01",))
    for value in ("NaN", "Infinity", "1e400"):
        response = server.client.post(
            "/api/v1/devices/edge-01/acks",
            content=f'{{"subsystem": "links", "for_seconds": {value}, "reason": "r"}}',
            headers={**tenant.auth("operator"), "content-type": "application/json"},
        )
        assert_problem(response, 422, "for_seconds")


# -- documents -------------------------------------------------------------------------------


def test_billion_laughs_yaml_is_refused_small_and_fast(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01",))
    response = put_desired(
        server,
        tenant,
        "edge-01",
        BILLION_LAUGHS.encode(),
        **{"content-type": "application/yaml"},
    )
    assert_problem(response, 422, "aliases")
    assert len(response.content) < 1024


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b"[" * 10_000 + b"]" * 10_000, "application/json"),
        (b'{"a":' * 10_000 + b"1" + b"}" * 10_000, "application/json"),
        (b"[" * 1_000 + b"]" * 1_000, "application/yaml"),
        (b"".join(b" " * i + b"a:\n" for i in range(1_000)), "application/yaml"),
        (b"[" * 65 + b"]" * 65, "application/json"),
    ],
)
def test_deep_documents_are_422_not_recursion_errors(
    server: Server, body: bytes, content_type: str
) -> None:
    tenant = server.tenant(devices=("edge-01",))
    response = put_desired(server, tenant, "edge-01", body, **{"content-type": content_type})
    assert_problem(response, 422, "nested deeper than 64 levels")


@pytest.mark.parametrize(
    ("body", "content_type", "needle"),
    [
        (b'{"apiVersion": ', "application/json", "not valid JSON"),
        (b"\xff\xfe", "application/json", "not UTF-8"),
        (b"a: [1, 2", "application/yaml", "not valid YAML"),
        (b"a: " + b"1" * 5000, "application/yaml", "not valid YAML"),
        (b'{"a": ' + b"1" * 5000 + b"}", "application/json", "not valid JSON"),
        (b"a: !!python/object:os.system x", "application/yaml", "not valid YAML"),
    ],
)
def test_malformed_documents_are_422_with_a_short_message(
    server: Server, body: bytes, content_type: str, needle: str
) -> None:
    tenant = server.tenant(devices=("edge-01",))
    response = put_desired(server, tenant, "edge-01", body, **{"content-type": content_type})
    assert_problem(response, 422, needle)


def test_problems_quote_an_excerpt_of_a_huge_value(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01",))
    doc = document("edge-01")
    doc["metadata"]["device"] = "x" * 500_000
    doc["spec"]["management"]["addresses"] = ["y" * 200_000]
    response = put_desired(server, tenant, "edge-01", json.dumps(doc).encode())
    assert response.status_code == 422, response.text[:500]
    assert len(response.content) < 4096
    assert all(len(p) < 300 for p in response.json()["problems"])


def test_document_over_the_size_limit_is_413(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01",))
    doc = document("edge-01")
    doc["spec"]["padding"] = "x" * DOCUMENT_BYTES
    response = put_desired(server, tenant, "edge-01", json.dumps(doc).encode())
    assert_problem(response, 413, "at most")


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        # A lone surrogate escape as an unknown key: the 422 naming it could not be encoded.
        (b'{"apiVersion": "trueup/v1", "\\ud800": 1}', "application/json"),
        (b'apiVersion: trueup/v1\n"\\ud800": 1\n', "application/yaml"),
        # ... and as a stored key: the agent's long poll could not encode the revision.
        (
            json.dumps(document("edge-01", tables={"\ud800": 100})).encode(),
            "application/json",
        ),
    ],
)
def test_lone_surrogate_escapes_are_422_not_500(
    server: Server, body: bytes, content_type: str
) -> None:
    tenant = server.tenant(devices=("edge-01",))
    response = put_desired(server, tenant, "edge-01", body, **{"content-type": content_type})
    assert_problem(response, 422, "surrogate")
    desired = server.client.get("/api/v1/agent/desired", headers=tenant.device_auth("edge-01"))
    assert desired.status_code == 204, desired.text


# -- body limits and authentication before the body ------------------------------------------


def test_report_over_the_size_limit_is_413_and_not_stored(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01",))
    big = {"applied_version": 3, "findings": [{"x": "y" * REPORT_BYTES}]}
    assert_problem(post_report(server, tenant, "edge-01", big), 413, "at most")

    def chunked() -> Any:  # no Content-Length: stopped while it is read
        yield b'{"findings": ["'
        for _ in range(REPORT_BYTES // 65536 + 2):
            yield b"z" * 65536
        yield b'"]}'

    streamed = server.client.post(
        "/api/v1/agent/report",
        content=chunked(),
        headers={**tenant.device_auth("edge-01"), "content-type": "application/json"},
    )
    assert_problem(streamed, 413, "at most")
    last = server.client.get("/api/v1/devices/edge-01", headers=tenant.auth("viewer")).json()
    assert last["last_report"] is None


def test_small_routes_refuse_large_bodies(server: Server) -> None:
    tenant = server.tenant()
    response = server.client.post(
        "/api/v1/users",
        content=json.dumps({"name": "x", "role": "viewer", "pad": "p" * 200_000}),
        headers={**tenant.auth("admin"), "content-type": "application/json"},
    )
    assert_problem(response, 413, "at most")


def test_unauthenticated_malformed_json_is_401_not_422(server: Server) -> None:
    for url in ("/api/v1/devices", "/api/v1/agent/report", "/api/v1/users"):
        for headers in ({}, {"Authorization": "Bearer tu_u_unknown"}):
            response = server.client.post(
                url, content=b"{not json", headers={"content-type": "application/json", **headers}
            )
            assert_problem(response, 401)


def asgi_call(
    server: Server,
    path: str,
    headers: dict[str, str | bytes],
    chunk: bytes,
    chunks: int,
    method: str = "POST",
) -> tuple[int, int, bytes]:
    """Call the app directly with raw header bytes and a counted body, on the test client's
    event loop: (status, body chunks the app read, response body)."""
    app = server.client.app
    read = 0
    status: list[int] = []
    body: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal read
        read += 1
        return {"type": "http.request", "body": chunk, "more_body": read < chunks}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])
        elif message["type"] == "http.response.body":
            body.append(message.get("body", b""))

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (k.lower().encode(), v if isinstance(v, bytes) else v.encode())
            for k, v in headers.items()
        ],
        "client": ("127.0.0.1", 1),
        "server": ("testserver", 80),
    }
    portal = server.client.portal
    assert portal is not None
    portal.call(app, scope, receive, send)
    return status[0], read, b"".join(body)


def test_unauthenticated_50_mb_body_is_401_without_being_read(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01",))
    size = 50 * 1024 * 1024
    headers = {"content-type": "application/json", "content-length": str(size)}
    for method, path in (
        ("POST", "/api/v1/agent/report"),
        ("PUT", "/api/v1/devices/edge-01/desired"),
        ("POST", "/api/v1/users"),
    ):
        status, read, _body = asgi_call(server, path, headers, b"x" * 1024 * 1024, 50, method)
        assert (status, read) == (401, 0), path
    # A valid token and a declared length over the limit: 413, still unread.
    status, read, _body = asgi_call(
        server, "/api/v1/agent/report", {**headers, **tenant.device_auth("edge-01")}, b"x", 50
    )
    assert (status, read) == (413, 0)
    # No declared length: the body is read only up to the limit.
    chunked = {"content-type": "application/json", **tenant.device_auth("edge-01")}
    status, read, _body = asgi_call(server, "/api/v1/agent/report", chunked, b"x" * 65536, 50 * 16)
    assert status == 413 and read <= REPORT_BYTES // 65536 + 1


def test_a_viewer_cannot_make_an_admin_route_read_its_body(server: Server) -> None:
    tenant = server.tenant()
    headers = {"content-type": "application/json", "content-length": str(10 * 1024 * 1024)}
    status, read, _body = asgi_call(
        server, "/api/v1/users", {**headers, **tenant.auth("viewer")}, b"x" * 1024 * 1024, 10
    )
    assert (status, read) == (403, 0)


# -- the small things ------------------------------------------------------------------------


def test_readyz_says_database_unavailable_without_details(
    server: Server, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    secret_detail = 'connection to server at "db.internal" (10.1.2.3), port 6432 failed: role "ops"'

    def broken() -> Any:
        raise OperationalError("SELECT 1", {}, Exception(secret_detail))

    monkeypatch.setattr(server.plane.db, "read", broken)
    with caplog.at_level(logging.ERROR, logger="trueup.server"):
        response = server.client.get("/readyz")
    assert response.status_code == 503
    assert response.json() == {"status": "unavailable", "detail": "database unavailable"}
    for leak in ("db.internal", "10.1.2.3", "6432", "ops"):
        assert leak not in response.text
    assert "db.internal" in caplog.text  # the operator finds the cause in the log
    monkeypatch.undo()
    assert server.client.get("/readyz").status_code == 200


def test_a_database_that_cannot_be_reached_is_503_with_retry_after(
    server: Server, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    tenant = server.tenant(devices=("edge-01",))
    secret_detail = 'connection to server at "db.internal" (10.1.2.3), port 6432 failed'

    def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise OperationalError("SELECT 1", {}, Exception(secret_detail))

    monkeypatch.setattr(server.plane.db, "read", broken)
    monkeypatch.setattr(server.plane.db, "write", broken)
    with caplog.at_level(logging.ERROR, logger="trueup.server"):
        # A token never seen (no cache) is looked up; a cached one reaches the route.
        for headers in ({"Authorization": "Bearer tu_never_seen"}, tenant.auth("viewer")):
            response = server.client.get("/api/v1/devices", headers=headers)
            assert response.status_code == 503, response.text
            assert response.headers["retry-after"] == "5"
            assert response.json() == {"detail": "database unavailable; retry"}
            for leak in ("db.internal", "10.1.2.3", "6432"):
                assert leak not in response.text
    assert "db.internal" in caplog.text
    monkeypatch.undo()
    assert server.client.get("/api/v1/devices", headers=tenant.auth("viewer")).status_code == 200


def test_comment_header_is_utf8(server: Server) -> None:
    tenant = server.tenant(devices=("edge-01",))
    status, _read, body = put_raw(server, tenant, {"x-trueup-comment": b"caf\xe9"})
    assert status == 422 and b"not UTF-8" in body, body  # latin-1 bytes are not UTF-8
    comment = "Grüße, 変更 ✓"
    status, _read, body = put_raw(server, tenant, {"x-trueup-comment": comment.encode("utf-8")})
    assert status == 201, body
    assert json.loads(body)["comment"] == comment
    listed = server.client.get(
        "/api/v1/devices/edge-01/revisions", headers=tenant.auth("viewer")
    ).json()["revisions"]
    assert [r["comment"] for r in listed] == [comment]


def test_sqlite_database_files_are_private(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        database = Database(f"sqlite:///{tmp_path}/server.db")
        database.migrate()
        database.dispose()
        existing = tmp_path / "existing.db"
        existing.touch(mode=0o644)
        Database(f"sqlite:///{existing}").dispose()
    finally:
        os.umask(old)
    files = [p for p in tmp_path.iterdir() if p.name.startswith(("server.db", "existing.db"))]
    assert {p.name for p in files} >= {"server.db", "existing.db"}
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_openapi_documents_every_status_with_resolvable_schemas(server: Server) -> None:
    tenant = server.tenant()
    spec = server.client.get("/openapi.json", headers=tenant.auth("viewer")).json()
    text = json.dumps(spec)
    for ref in set(__import__("re").findall(r'"\$ref": "#/([^"]+)"', text)):
        node: Any = spec
        for part in ref.split("/"):
            node = node[part]
        assert isinstance(node, dict), ref
    for path, methods in spec["paths"].items():
        for method, operation in methods.items():
            responses = operation["responses"]
            if operation["x-trueup-role"] == "public":
                continue
            for code in ("401", "413"):
                assert code in responses, (method, path, code)
            if operation["x-trueup-role"] != "enrollment":
                problems = responses["422"]["content"]["application/json"]["schema"]
                assert "problems" in problems["properties"], (method, path)
                assert "403" in responses, (method, path)
            assert isinstance(operation["x-trueup-max-body"], int)
    put = spec["paths"]["/api/v1/devices/{device}/desired"]["put"]["responses"]
    assert {"404", "409", "413", "428"} <= set(put)
