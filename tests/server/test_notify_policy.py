"""The webhook target policy on the control plane: what a target may reach, and what the log says.

Every test runs on SQLite and PostgreSQL. Receivers listen on 127.0.0.1 only;
a name that should resolve somewhere is resolved by a fake at the notifier's
resolver seam (`plane.notifier.resolve`), so no test asks a real DNS server or
sends anything beyond loopback. Refused URLs are never contacted.
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from tests.server.conftest import (
    BACKENDS,
    Server,
    Tenant,
    create_pg_database,
    drop_pg_database,
    free_port,
)
from tests.server.test_notify import (
    BASE,
    DRIFT,
    PARAMS,
    SECRET,
    Receiver,
    deliveries,
    receivers,
    report,
    wait_for,
)
from trueup.server.db import Database
from trueup.server.keys import load_or_create_server_key
from trueup.server.service import ControlPlane
from trueup.server.service.notify import routing, verify
from trueup.server.service.notify.audited import TARGET_AUDITED_FIELDS
from trueup.server.tables import notify_targets

__all__ = ["receivers"]  # the fixture, shared with test_notify.py

# (the URL as configured, what the 422 says about it)
REFUSED = [
    ("http://127.0.0.1:{port}/hook", "127.0.0.1 is a loopback address"),
    ("http://localhost:{port}/hook", "localhost is a loopback name"),
    ("http://LOCALHOST.:{port}/hook", "a loopback name"),
    ("http://hooks.localhost:{port}/hook", "hooks.localhost is a loopback name"),
    ("http://[::1]:{port}/hook", "::1 is a loopback address"),
    ("http://127.1:{port}/hook", "127.1 (127.0.0.1) is a loopback address"),
    ("http://2130706433:{port}/hook", "2130706433 (127.0.0.1) is a loopback address"),
    ("http://0x7f.1:{port}/hook", "0x7f.1 (127.0.0.1) is a loopback address"),
    ("http://0177.0.0.1:{port}/hook", "0177.0.0.1 is a loopback address"),
    ("http://127.0.0.1.:{port}/hook", "is a loopback address"),
    ("http://\u24dbocalhost:{port}/hook", "is a loopback name"),  # IDNA: ⓛ folds to l
    ("http://\uff4c\uff4f\uff43\uff41\uff4c\uff48\uff4f\uff53\uff54/hook", "a loopback name"),
    ("http://\uff11\uff12\uff17\u3002\uff10\u3002\uff10\u3002\uff11/", "a loopback address"),
    ("http://0.0.0.0:{port}/hook", "0.0.0.0 is the unspecified address"),
    ("http://0:{port}/hook", "the unspecified address"),
    ("http://[::]:{port}/hook", ":: is the unspecified address"),
    ("http://169.254.169.254/latest/meta-data", "169.254.169.254 is a link-local address"),
    ("http://[fe80::1%25lo]:{port}/hook", "a link-local address"),
    ("http://10.20.30.40/hook", "a private address (RFC 1918)"),
    ("http://172.16.0.1/hook", "a private address (RFC 1918)"),
    ("http://192.168.1.1/hook", "a private address (RFC 1918)"),
    ("http://[fd12:3456::1]/hook", "a private address (unique local"),
    ("http://100.64.0.1/hook", "a shared address (CGNAT"),
    ("http://224.0.0.1/hook", "a multicast address"),
    ("http://[ff02::1]/hook", "a multicast address"),
    ("http://255.255.255.255/hook", "the broadcast address"),
    ("http://240.0.0.1/hook", "a reserved address"),
    ("http://[::ffff:127.0.0.1]:{port}/hook", "an IPv4-mapped form of 127.0.0.1"),
    ("http://[::ffff:a9fe:a9fe]/hook", "an IPv4-mapped form of 169.254.169.254"),
    ("http://[::127.0.0.1]:{port}/hook", "an IPv4-compatible form of 127.0.0.1"),
    ("http://[64:ff9b::a00:1]/hook", "a NAT64 form of 10.0.0.1"),
    ("http://[2002:7f00:1::]/hook", "a 6to4 form of 127.0.0.1"),
    ("http://%31%32%37.0.0.1:{port}/hook", "is not a valid host name"),
    ("file:///etc/passwd", "not an http:// or https:// URL"),
]


def _problems(response: Any) -> list[str]:
    return list(response.json()["problems"])


def _actions(server: Server, tenant: Tenant) -> list[dict[str, Any]]:
    return list(server.plane.audit_entries(server.plane.tenant_id(tenant.name), 200))


def _allow(server: Server, tenant: Tenant, entries: list[str]) -> dict[str, Any]:
    response = server.client.put(
        f"{BASE}/allowlist", json={"entries": entries}, headers=tenant.auth("admin")
    )
    assert response.status_code == 200, response.text
    return dict(response.json())


def _target(server: Server, tenant: Tenant, url: str, **extra: Any) -> Any:
    body = {"name": "hook", "url": url, "secret": SECRET, **extra}
    return server.client.post(f"{BASE}/targets", json=body, headers=tenant.auth("admin"))


def _route_all(server: Server, tenant: Tenant, url: str, **extra: Any) -> None:
    made = _target(server, tenant, url, **extra)
    assert made.status_code == 201, made.text
    rule = {"name": "all", "target": "hook"}
    made = server.client.post(f"{BASE}/rules", json=rule, headers=tenant.auth("admin"))
    assert made.status_code == 201, made.text


class FakeResolver:
    """The resolver seam: names map to addresses; every other name does not resolve."""

    def __init__(self, names: dict[str, list[str]]) -> None:
        self.names = names
        self.asked: list[str] = []

    def __call__(self, host: str, port: int) -> list[str]:
        self.asked.append(host)
        if host not in self.names:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return self.names[host]


@pytest.mark.parametrize("isolated_server", PARAMS, indirect=True)
def test_every_internal_form_is_refused_at_configuration_and_nothing_is_stored(
    isolated_server: Server,
) -> None:
    server = isolated_server
    tenant = server.tenant("pr")
    port = free_port()
    for template, says in REFUSED:
        url = template.format(port=port)
        refused = _target(server, tenant, url)
        assert refused.status_code == 422, (url, refused.text)
        problems = _problems(refused)
        assert problems[0].startswith("url: "), (url, problems)
        assert says in problems[0], (url, problems)
    loopback = _problems(_target(server, tenant, f"http://127.0.0.1:{port}/hook"))[0]
    assert loopback == (
        "url: 127.0.0.1 is a loopback address; internal receivers need the tenant's allowlist"
    )
    credentials = _target(server, tenant, "https://user:hunter2@hooks.example.net/x")
    assert credentials.status_code == 422
    assert "credentials" in _problems(credentials)[0] and "auth_header" in _problems(credentials)[0]
    assert "hunter2" not in credentials.text
    listed = server.client.get(f"{BASE}/targets", headers=tenant.auth("admin")).json()
    assert listed == {"targets": [], "allowlist": []}
    with server.plane.db.read() as conn:
        assert conn.execute(select(notify_targets.c.id)).all() == []
    assert not [e for e in _actions(server, tenant) if e["action"] == "notify.target.create"]
    # A public address, and a name (checked again at delivery), are accepted.
    assert _target(server, tenant, "https://hooks.example.net/x").status_code == 201


@pytest.mark.parametrize("isolated_server", PARAMS, indirect=True)
def test_the_allowlist_is_admin_set_audited_shown_and_opens_internal_receivers(
    isolated_server: Server,
) -> None:
    server = isolated_server
    tenant = server.tenant("pa")
    path = f"{BASE}/allowlist"
    entries = {"entries": ["127.0.0.1/32"]}
    assert server.client.put(path, json=entries, headers=tenant.auth("operator")).status_code == 403
    assert server.client.get(path, headers=tenant.auth("viewer")).status_code == 403
    bad = server.client.put(
        path,
        json={"entries": ["127.0.0.1/32", "0.0.0.0/0", "224.0.0.0/8", "not a host", "::/0"]},
        headers=tenant.auth("admin"),
    )
    assert bad.status_code == 422
    problems = _problems(bad)
    assert [p.split(":")[0] for p in problems] == [
        "entries[1]",
        "entries[2]",
        "entries[3]",
        "entries[4]",
    ]
    assert "wider than /8" in problems[0] and "never a receiver" in problems[1]
    empty = server.client.get(path, headers=tenant.auth("operator")).json()
    assert empty == {"entries": [], "updated_at": None}

    made = _allow(server, tenant, ["127.0.0.0/8", "::1", "Hooks.Internal.", "127.0.0.1/8"])
    assert made["entries"] == ["127.0.0.0/8", "::1/128", "hooks.internal"]
    shown = server.client.get(path, headers=tenant.auth("operator")).json()
    assert shown["entries"] == made["entries"] and shown["updated_at"].endswith("Z")
    entry = next(e for e in _actions(server, tenant) if e["action"] == "notify.allowlist.set")
    assert entry["detail"] == {"entries": made["entries"], "previous": []}
    # Allowlisted: the loopback address in every spelling, [::1] and the allowlisted name.
    port = free_port()
    for index, url in enumerate(
        [
            f"http://127.0.0.1:{port}/hook",
            f"http://127.1:{port}/hook",
            f"http://[::1]:{port}/hook",
            f"http://hooks.internal:{port}/hook",
        ]
    ):
        made_target = _target(server, tenant, url, name=f"hook-{index}")
        assert made_target.status_code == 201, (url, made_target.text)
    # Still refused: other classes, names not on the list, and what never is a receiver.
    for url in ("http://10.0.0.1/", f"http://localhost:{port}/", "http://0.0.0.0/"):
        assert _target(server, tenant, url, name="other").status_code == 422, url
    listed = server.client.get(f"{BASE}/targets", headers=tenant.auth("operator")).json()
    assert listed["allowlist"] == made["entries"]
    assert [t["problem"] for t in listed["targets"]] == [None] * 4
    # Another tenant's allowlist is its own.
    other = server.tenant("pb")
    assert _target(server, other, f"http://127.0.0.1:{port}/hook").status_code == 422
    # Narrowed: the stored target that no longer passes says so in GET.
    _allow(server, tenant, ["::1"])
    listed = server.client.get(f"{BASE}/targets", headers=tenant.auth("operator")).json()
    problems_by_name = {t["name"]: t["problem"] for t in listed["targets"]}
    assert problems_by_name["hook-2"] is None
    assert "loopback address" in problems_by_name["hook-0"]
    last = [e for e in _actions(server, tenant) if e["action"] == "notify.allowlist.set"]
    assert {"entries": ["::1/128"], "previous": made["entries"]} in [e["detail"] for e in last]


@pytest.mark.parametrize("isolated_server", PARAMS, indirect=True)
def test_a_name_that_resolves_to_loopback_is_refused_at_delivery_until_allowlisted(
    isolated_server: Server,
    receivers: Callable[[], Receiver],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = isolated_server
    tenant = server.tenant("pd", devices=("edge-p",))
    hook = receivers()
    port = int(hook.url.split(":")[2].split("/")[0])
    resolver = FakeResolver({"hooks.example.net": ["127.0.0.1"]})
    monkeypatch.setattr(server.plane.notifier, "resolve", resolver)
    # Whatever the client would resolve itself goes through getaddrinfo: record it.
    asked: list[Any] = []
    real_getaddrinfo = socket.getaddrinfo

    def recording_getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        asked.append(host)
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", recording_getaddrinfo)
    _route_all(server, tenant, f"http://hooks.example.net:{port}/hook")
    report(server, tenant, "edge-p", DRIFT)

    dead = wait_for(lambda: deliveries(server, tenant, "dead"), "the refused delivery")
    assert len(dead) == 1 and dead[0]["attempts"] == 1  # no retry helps
    error = dead[0]["log"][0]["error"]
    assert error == (
        "refused by policy: hooks.example.net resolves to a loopback address; "
        "internal receivers need the tenant's allowlist"
    )
    assert dead[0]["last_error"] == error and dead[0]["log"][0]["status_code"] is None
    assert hook.got() == []
    assert "127.0.0.1" not in json.dumps(dead)

    # Allowlisted, redelivered: sent to the vetted address, under the name.
    _allow(server, tenant, ["127.0.0.1/32"])
    again = server.client.post(
        f"{BASE}/dead-letters/{dead[0]['id']}/redeliver", headers=tenant.auth("operator")
    )
    assert again.status_code == 200, again.text
    wait_for(
        lambda: [d for d in deliveries(server, tenant) if d["state"] == "delivered"],
        "the allowlisted delivery",
    )
    got = hook.got()
    assert len(got) == 1
    assert got[0].headers["Host"] == f"hooks.example.net:{port}"
    assert verify(SECRET.encode(), got[0].headers["X-Trueup-Signature"], got[0].body)
    # Resolved once per attempt, by the policy; the client never resolved the name again.
    assert resolver.asked == ["hooks.example.net", "hooks.example.net"]
    assert "hooks.example.net" not in asked


@pytest.mark.parametrize("isolated_server", PARAMS, indirect=True)
def test_an_allowlisted_receiver_gets_the_secret_header_that_nothing_shows(
    isolated_server: Server,
    receivers: Callable[[], Receiver],
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = isolated_server
    caplog.set_level(logging.DEBUG)
    tenant = server.tenant("ph", devices=("edge-h",))
    hook = receivers()
    token = "Bearer receiver-token-0123456789abcdef"
    _allow(server, tenant, ["127.0.0.1/32"])
    reserved = _target(
        server, tenant, hook.url, auth_header={"name": "X-Trueup-Signature", "value": "x"}
    )
    assert reserved.status_code == 422
    assert [p.split(":")[0] for p in _problems(reserved)] == ["auth_header.name"]
    # A line break in the value is refused by the request schema already.
    injected = _target(
        server, tenant, hook.url, auth_header={"name": "X-Token", "value": "x\r\nInjected: 1"}
    )
    assert injected.status_code == 422
    assert [p.split(":")[0] for p in _problems(injected)] == ["body.auth_header.value"]
    _route_all(server, tenant, hook.url, auth_header={"name": "Authorization", "value": token})
    report(server, tenant, "edge-h", DRIFT)
    wait_for(
        lambda: [d for d in deliveries(server, tenant) if d["state"] == "delivered"],
        "the delivery",
    )
    got = hook.got()
    assert len(got) == 1 and got[0].headers["Authorization"] == token
    assert verify(SECRET.encode(), got[0].headers["X-Trueup-Signature"], got[0].body)

    listed = server.client.get(f"{BASE}/targets", headers=tenant.auth("admin"))
    assert listed.json()["targets"][0]["auth_header"] == "Authorization"
    log = server.client.get(f"{BASE}/deliveries", headers=tenant.auth("admin"))
    audit = server.client.get("/api/v1/audit", headers=tenant.auth("admin"))
    assert audit.status_code == 200
    for text in (listed.text, log.text, audit.text, caplog.text):
        assert "receiver-token" not in text
    with server.plane.db.read() as conn:
        row = conn.execute(select(notify_targets)).mappings().one()
    assert b"receiver-token" not in bytes(row["auth_header_ciphertext"])
    assert all("receiver-token" not in str(value) for value in row.values())
    created = next(e for e in _actions(server, tenant) if e["action"] == "notify.target.create")
    assert {k: created["detail"][k] for k in TARGET_AUDITED_FIELDS} == {
        k: row[k] for k in TARGET_AUDITED_FIELDS
    }


@pytest.mark.parametrize("isolated_server", PARAMS, indirect=True)
def test_a_closed_listener_is_logged_as_connection_refused_without_socket_text(
    isolated_server: Server,
) -> None:
    server = isolated_server
    tenant = server.tenant("pc", devices=("edge-c",))
    _allow(server, tenant, ["127.0.0.1/32"])
    _route_all(server, tenant, f"http://127.0.0.1:{free_port()}/hook")  # nothing listens
    report(server, tenant, "edge-c", DRIFT)
    dead = wait_for(lambda: deliveries(server, tenant, "dead"), "the dead letter")
    assert [a["error"] for a in dead[0]["log"]] == ["connection refused"] * 3
    assert dead[0]["last_error"] == "connection refused"
    text = json.dumps(dead)
    for socket_text in ("Errno", "111", "ConnectError", "Connection refused"):
        assert socket_text not in text


@pytest.mark.parametrize(
    "isolated_server",
    [(backend, {**settings, "notify_timeout": 0.5}) for backend, settings in PARAMS],
    indirect=True,
)
def test_a_receiver_that_never_answers_is_logged_as_timed_out(
    isolated_server: Server, receivers: Callable[[], Receiver]
) -> None:
    server = isolated_server
    tenant = server.tenant("pt", devices=("edge-t",))
    hook = receivers()
    hook.hold.clear()  # it reads the request and never answers
    _allow(server, tenant, ["127.0.0.1/32"])
    _route_all(server, tenant, hook.url)
    report(server, tenant, "edge-t", DRIFT)
    dead = wait_for(lambda: deliveries(server, tenant, "dead"), "the dead letter")
    assert [a["error"] for a in dead[0]["log"]] == ["timed out"] * 3
    assert "Timeout" not in json.dumps(dead)


@pytest.mark.parametrize("isolated_server", PARAMS, indirect=True)
def test_a_stored_url_with_credentials_is_not_delivered_and_never_shown(
    isolated_server: Server, receivers: Callable[[], Receiver], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A target stored before the policy, with `user:pw@` in its URL (stored and audited
    by a server that did not check URLs; a row merely rewritten so is refused as unaudited,
    test_notify_unaudited.py)."""
    server = isolated_server
    tenant = server.tenant("pl", devices=("edge-l",))
    hook = receivers()
    _allow(server, tenant, ["127.0.0.1/32"])
    with monkeypatch.context() as before_the_policy:
        before_the_policy.setattr(routing, "_check_url", lambda url, allowlist: None)
        _route_all(server, tenant, hook.url.replace("//", "//ops:hunter2@", 1))
    listed = server.client.get(f"{BASE}/targets", headers=tenant.auth("admin")).json()
    target = listed["targets"][0]
    assert target["url"] == hook.url
    assert "credentials" in target["problem"] and "auth_header" in target["problem"]
    report(server, tenant, "edge-l", DRIFT)
    dead = wait_for(lambda: deliveries(server, tenant, "dead"), "the refused delivery")
    assert dead[0]["attempts"] == 1
    assert dead[0]["last_error"].startswith("refused by policy: the URL carries credentials")
    assert hook.got() == []
    assert "hunter2" not in json.dumps(dead) and "hunter2" not in json.dumps(listed)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cli_sets_the_allowlist_and_a_secret_header(backend: str, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from trueup.cli.main import app as cli_app

    pg_name = create_pg_database() if backend == "postgres" else None
    url = (
        f"postgresql://postgres@127.0.0.1:5432/{pg_name}"
        if pg_name
        else f"sqlite:///{tmp_path}/server.db"
    )
    key = tmp_path / "server.key"
    database = Database(url)
    try:
        database.migrate()
        plane = ControlPlane(database, load_or_create_server_key(key))
        tenant_id = plane.create_tenant("acme", "test")
        where = ["--tenant", "acme", "--db", url, "--key-file", str(key)]

        def cli(*args: str) -> Any:
            return CliRunner().invoke(cli_app, ["server", "notify", *args, *where])

        refused = cli("add-target", "local", "http://127.0.0.1:9/hook")
        assert refused.exit_code == 1 and "127.0.0.1 is a loopback address" in refused.output
        assert cli("allowlist", "127.0.0.1/32").exit_code == 1  # changing it needs --set
        assert json.loads(cli("allowlist", "-o", "json").output)["entries"] == []
        made = cli("allowlist", "--set", "127.0.0.1/32", "hooks.internal")
        assert made.exit_code == 0, made.output
        assert "127.0.0.1/32, hooks.internal" in made.output
        bad = cli("allowlist", "--set", "0.0.0.0/0")
        assert bad.exit_code == 1 and "entries[0]" in bad.output
        header_file = tmp_path / "header"
        header_file.write_text("Bearer cli-token-value\n")
        added = cli(
            "add-target",
            "local",
            "http://127.0.0.1:9/hook",
            "--auth-header",
            "Authorization",
            "--auth-header-file",
            str(header_file),
        )
        assert added.exit_code == 0, added.output
        listed = cli("targets")
        assert "Authorization" in listed.output and "cli-token-value" not in listed.output
        assert "allowlist: 127.0.0.1/32, hooks.internal" in listed.output
        actions = [e["action"] for e in plane.audit_entries(tenant_id, 20)]
        assert actions.count("notify.allowlist.set") == 1
        assert all(
            "cli-token-value" not in json.dumps(e) for e in plane.audit_entries(tenant_id, 20)
        )
    finally:
        database.dispose()
        if pg_name:
            drop_pg_database(pg_name)
