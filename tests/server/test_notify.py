"""Notifications on the control plane: signed webhooks, retries, dead letters, escalation.

Every test runs on SQLite and PostgreSQL against a server whose notifier runs
with short delays, and a webhook receiver on loopback (a small HTTP server in
the test). Agents are played by posting reports with device credentials.
Nothing sleeps for a fixed time: each test waits for what it expects, with a
generous bound.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select, update

from tests.server.conftest import (
    BACKENDS,
    Server,
    ServerProcess,
    Tenant,
    create_pg_database,
    drop_pg_database,
)
from trueup.server.db import Database
from trueup.server.keys import load_or_create_server_key
from trueup.server.service import ControlPlane
from trueup.server.service.notify import verify
from trueup.server.service.notify.engine import MISSED_AFTER
from trueup.server.tables import device_state, notify_devices
from trueup.server.tokens import Role

FAST = {
    "notify_base_delay": 0.05,
    "notify_max_delay": 0.2,
    "notify_max_attempts": 3,
    "notify_poll_seconds": 0.05,
    "notify_scan_seconds": 0.1,
}
PARAMS = [(backend, FAST) for backend in BACKENDS]
BASE = "/api/v1/notifications"
SECRET = "a-webhook-secret-of-some-length"
DRIFT = {"reason_codes": ["STATE_DRIFT_DETECTED"], "diff_summary": {"subsystems": {"mtu": 1}}}
FAILED = {"reason_codes": ["STATE_RECONCILIATION_FAILED"]}
CLEAN: dict[str, Any] = {"reason_codes": []}


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes

    @property
    def event(self) -> dict[str, Any]:
        return dict(json.loads(self.body))


@dataclass
class Receiver:
    """A webhook receiver on 127.0.0.1: records every request; answers `status` once
    `hold` is set (a test clears it to keep a request in flight)."""

    status: int = 200
    hold: threading.Event = field(default_factory=threading.Event)
    requests: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def start(self) -> Receiver:
        receiver = self
        self.hold.set()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver.lock:
                    receiver.requests.append(Received(dict(self.headers.items()), body))
                    status = receiver.status
                receiver.hold.wait(60)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.hold.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def got(self) -> list[Received]:
        with self.lock:
            return list(self.requests)

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        return [r.event for r in self.got() if kind is None or r.event["kind"] == kind]


@pytest.fixture
def receivers() -> Iterator[Callable[[], Receiver]]:
    started: list[Receiver] = []

    def make() -> Receiver:
        started.append(Receiver().start())
        return started[-1]

    yield make
    for receiver in started:
        receiver.stop()


def wait_for(condition: Callable[[], Any], what: str, timeout: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def report(server: Server, tenant: Tenant, device: str, body: dict[str, Any]) -> None:
    payload = {"heartbeat_interval": 30.0, **body}
    response = server.client.post(
        "/api/v1/agent/report", json=payload, headers=tenant.device_auth(device)
    )
    assert response.status_code == 200, response.text


def allow_loopback(server: Server, tenant: Tenant) -> None:
    """The receivers here listen on 127.0.0.1: an internal receiver, allowlisted."""
    response = server.client.put(
        f"{BASE}/allowlist", json={"entries": ["127.0.0.0/8"]}, headers=tenant.auth("admin")
    )
    assert response.status_code == 200, response.text


def route(
    server: Server,
    tenant: Tenant,
    receiver: Receiver,
    *,
    match: dict[str, Any] | None = None,
    escalate_after: float | None = None,
    name: str = "hook",
) -> None:
    allow_loopback(server, tenant)
    response = server.client.post(
        f"{BASE}/targets",
        json={"name": name, "url": receiver.url, "secret": SECRET},
        headers=tenant.auth("admin"),
    )
    assert response.status_code == 201, response.text
    assert "secret" not in response.json()
    rule: dict[str, Any] = {"name": f"{name}-rule", "target": name, "match": match or {}}
    if escalate_after is not None:
        rule["escalate_after"] = escalate_after
    response = server.client.post(f"{BASE}/rules", json=rule, headers=tenant.auth("admin"))
    assert response.status_code == 201, response.text


def deliveries(server: Server, tenant: Tenant, state: str | None = None) -> list[dict[str, Any]]:
    params = {"state": state} if state else {}
    response = server.client.get(
        f"{BASE}/deliveries", params=params, headers=tenant.auth("operator")
    )
    assert response.status_code == 200, response.text
    return list(response.json()["deliveries"])


@pytest.mark.parametrize("isolated_server", PARAMS, indirect=True)
def test_each_event_arrives_once_signed_and_tenants_stay_apart(
    isolated_server: Server, receivers: Callable[[], Receiver]
) -> None:
    server = isolated_server
    a, b = server.tenant("na", devices=("edge-a",)), server.tenant("nb", devices=("edge-b",))
    hook_a, hook_b = receivers(), receivers()
    route(server, a, hook_a)
    route(server, b, hook_b)

    report(server, a, "edge-a", DRIFT)
    report(server, a, "edge-a", DRIFT)  # the same state again: no new event
    report(server, b, "edge-b", DRIFT)
    report(server, a, "edge-a", CLEAN)
    report(server, a, "edge-a", CLEAN)
    report(server, a, "edge-a", {"reason_codes": ["STATE_VERSION_SKEW"]})
    # Deliveries run concurrently: wait until every one of A's is recorded as delivered
    # (the receiver answers before the notifier writes that down), and B's has arrived.
    wait_for(
        lambda: (
            len(deliveries(server, a)) == 3
            and all(d["state"] == "delivered" for d in deliveries(server, a))
        ),
        "A's three deliveries recorded as delivered",
    )
    wait_for(lambda: hook_b.events("drift_detected"), "tenant B's drift event")

    got = hook_a.got()
    kinds = sorted(r.event["kind"] for r in got)
    assert kinds == ["drift_detected", "healed", "version_skew"], kinds
    ids = [r.event["id"] for r in got]
    assert len(set(ids)) == len(ids)
    for request in got:
        event = request.event
        assert request.headers["X-Trueup-Event-Id"] == event["id"]
        assert request.headers["Idempotency-Key"] == event["id"]
        assert verify(SECRET.encode(), request.headers["X-Trueup-Signature"], request.body)
        assert not verify(b"another-secret", request.headers["X-Trueup-Signature"], request.body)
        assert event["tenant"] == a.name and event["device"] == "edge-a"
        assert event["at"].endswith("Z")
    drift = hook_a.events("drift_detected")[0]
    assert drift["severity"] == "warning" and drift["subsystems"] == ["mtu"]
    assert drift["reason_codes"] == ["STATE_DRIFT_DETECTED"]
    healed = hook_a.events("healed")[0]
    assert healed["condition"] == "drift_detected" and healed["severity"] == "info"
    # Tenant B's events reach only B's target, and A's log never lists them.
    assert {e["tenant"] for e in hook_b.events()} == {b.name}
    assert {d["device"] for d in deliveries(server, a)} == {"edge-a"}
    assert all(
        d["state"] == "delivered" and d["log"][0]["status_code"] == 200
        for d in deliveries(server, a)
    )


@pytest.mark.parametrize("isolated_server", PARAMS, indirect=True)
def test_failing_receiver_gets_retries_then_a_dead_letter_that_redelivers(
    isolated_server: Server, receivers: Callable[[], Receiver]
) -> None:
    server = isolated_server
    tenant = server.tenant("nd", devices=("edge-d",))
    hook = receivers()
    hook.status = 500
    route(server, tenant, hook, match={"kinds": ["drift_detected", "healed"]})
    report(server, tenant, "edge-d", DRIFT)

    dead = wait_for(lambda: deliveries(server, tenant, "dead"), "a dead letter")
    assert len(dead) == 1
    letter = dead[0]
    assert letter["attempts"] == 3 and letter["kind"] == "drift_detected"
    assert [a["status_code"] for a in letter["log"]] == [500, 500, 500]
    assert letter["last_error"] == "HTTP 500"
    attempts = hook.got()
    assert len(attempts) == 3
    assert {r.headers["X-Trueup-Event-Id"] for r in attempts} == {letter["event_id"]}
    assert [r.headers["X-Trueup-Delivery-Attempt"] for r in attempts] == ["1", "2", "3"]
    assert all(a["at"].endswith("Z") and a["latency_ms"] >= 0 for a in letter["log"])
    listed = server.client.get(f"{BASE}/dead-letters", headers=tenant.auth("operator"))
    assert [d["id"] for d in listed.json()["dead_letters"]] == [letter["id"]]

    # Redeliver from the dead letters: the same event id, attempts start again.
    hook.status = 204
    viewer = server.client.post(
        f"{BASE}/dead-letters/{letter['id']}/redeliver", headers=tenant.auth("viewer")
    )
    assert viewer.status_code == 403
    again = server.client.post(
        f"{BASE}/dead-letters/{letter['id']}/redeliver", headers=tenant.auth("operator")
    )
    assert again.status_code == 200, again.text
    wait_for(
        lambda: [d for d in deliveries(server, tenant) if d["state"] == "delivered"],
        "the redelivered notification",
    )
    assert hook.got()[-1].headers["X-Trueup-Event-Id"] == letter["event_id"]
    assert len(hook.got()) == 4

    # A second dead letter is discarded (admins only), and leaves the list.
    hook.status = 503
    report(server, tenant, "edge-d", CLEAN)
    second = wait_for(lambda: deliveries(server, tenant, "dead"), "a second dead letter")[0]
    assert second["kind"] == "healed"
    denied = server.client.post(
        f"{BASE}/dead-letters/{second['id']}/discard", headers=tenant.auth("operator")
    )
    assert denied.status_code == 403
    gone = server.client.post(
        f"{BASE}/dead-letters/{second['id']}/discard", headers=tenant.auth("admin")
    )
    assert gone.status_code == 200, gone.text
    assert deliveries(server, tenant, "dead") == []
    assert [d["state"] for d in deliveries(server, tenant, "discarded")] == ["discarded"]
    # Another tenant cannot see or touch it.
    other = server.tenant("nx")
    foreign = server.client.post(
        f"{BASE}/dead-letters/{letter['id']}/redeliver", headers=other.auth("admin")
    )
    assert foreign.status_code == 404
    actions = [
        e["action"] for e in server.plane.audit_entries(server.plane.tenant_id(tenant.name), 50)
    ]
    assert "notify.delivery.redeliver" in actions and "notify.delivery.discard" in actions
    # Deleting the target keeps its delivery log.
    for path in (f"{BASE}/rules/hook-rule", f"{BASE}/targets/hook"):
        assert server.client.delete(path, headers=tenant.auth("admin")).status_code == 204
    kept = deliveries(server, tenant)
    assert len(kept) == 2 and {d["target"] for d in kept} == {d["target"] for d in kept[:1]}
    assert kept[0]["target"].startswith("hook.deleted-")
    assert sum(len(d["log"]) for d in kept) == 4 + 3


@pytest.mark.parametrize("isolated_server", PARAMS, indirect=True)
def test_escalation_fires_once_per_episode_and_resolves(
    isolated_server: Server, receivers: Callable[[], Receiver]
) -> None:
    server = isolated_server
    tenant = server.tenant("ne", devices=("edge-e", "core-e"))
    hook = receivers()
    # Only escalations reach this target, and only for edge-* devices.
    route(
        server,
        tenant,
        hook,
        match={"devices": ["edge-*"], "kinds": ["escalation"]},
        escalate_after=0.5,
    )
    report(server, tenant, "core-e", FAILED)
    report(server, tenant, "edge-e", FAILED)
    first = wait_for(lambda: hook.events("escalation"), "the escalation")
    assert first[0]["device"] == "edge-e" and first[0]["failed"] == ["apply_failed"]
    assert first[0]["severity"] == "critical" and first[0]["rule"] == "hook-rule"
    # Still failed, several more reports: no second escalation for this episode.
    for _ in range(3):
        report(server, tenant, "edge-e", FAILED)
    report(server, tenant, "edge-e", CLEAN)
    resolved = wait_for(lambda: hook.events("escalation_resolved"), "the resolution")
    assert resolved[0]["failed_since"] == first[0]["failed_since"]
    assert len(hook.events("escalation")) == 1
    assert {e["device"] for e in hook.events()} == {"edge-e"}
    # A new episode escalates again.
    report(server, tenant, "edge-e", FAILED)
    wait_for(lambda: len(hook.events("escalation")) == 2, "the second episode's escalation")


@pytest.mark.parametrize("isolated_server", PARAMS, indirect=True)
def test_stale_heartbeat_is_an_event_and_a_report_heals_it(
    isolated_server: Server, receivers: Callable[[], Receiver]
) -> None:
    server = isolated_server
    tenant = server.tenant("nh", devices=("edge-h",))
    hook = receivers()
    route(
        server, tenant, hook, match={"min_severity": "info", "kinds": ["heartbeat_stale", "healed"]}
    )
    report(server, tenant, "edge-h", {"reason_codes": [], "heartbeat_interval": 0.1})
    stale = wait_for(lambda: hook.events("heartbeat_stale"), "the stale heartbeat")
    assert stale[0]["failed_since"] is not None
    report(server, tenant, "edge-h", {"reason_codes": [], "heartbeat_interval": 30.0})
    healed = wait_for(lambda: hook.events("healed"), "the heartbeat's return")
    assert healed[0]["condition"] == "heartbeat_stale"


@pytest.mark.parametrize("isolated_server", PARAMS, indirect=True)
def test_rules_and_targets_are_admin_managed_audited_and_secrets_never_returned(
    isolated_server: Server,
) -> None:
    server = isolated_server
    tenant = server.tenant("nr")
    body = {"name": "pager", "url": "https://hooks.example.net/trueup"}
    assert (
        server.client.post(
            f"{BASE}/targets", json=body, headers=tenant.auth("operator")
        ).status_code
        == 403
    )
    created = server.client.post(f"{BASE}/targets", json=body, headers=tenant.auth("admin"))
    assert created.status_code == 201, created.text
    assert len(created.json()["secret"]) >= 32  # generated, returned this once
    listed = server.client.get(f"{BASE}/targets", headers=tenant.auth("operator")).json()
    assert listed["targets"] == [
        {
            "name": "pager",
            "url": body["url"],
            "auth_header": None,
            "problem": None,
            "created_at": created.json()["created_at"],
        }
    ]
    assert listed["allowlist"] == []
    assert server.client.get(f"{BASE}/targets", headers=tenant.auth("viewer")).status_code == 403
    bad = server.client.post(
        f"{BASE}/rules",
        json={"name": "r", "target": "pager", "match": {"kinds": ["nope"], "min_severity": "loud"}},
        headers=tenant.auth("admin"),
    )
    assert bad.status_code == 422
    assert any(p.startswith("match.kinds") for p in bad.json()["problems"])
    assert any(p.startswith("match.min_severity") for p in bad.json()["problems"])
    bad_url = server.client.post(
        f"{BASE}/targets",
        json={"name": "x", "url": "file:///etc/passwd"},
        headers=tenant.auth("admin"),
    )
    assert bad_url.status_code == 422 and bad_url.json()["problems"][0].startswith("url:")
    rule = {"name": "crit", "target": "pager", "match": {"min_severity": "critical"}}
    assert (
        server.client.post(f"{BASE}/rules", json=rule, headers=tenant.auth("admin")).status_code
        == 201
    )
    rules = server.client.get(f"{BASE}/rules", headers=tenant.auth("operator")).json()["rules"]
    assert [r["name"] for r in rules] == ["crit"]
    other = server.tenant("ny")
    assert server.client.get(f"{BASE}/rules", headers=other.auth("admin")).json()["rules"] == []
    assert (
        server.client.delete(f"{BASE}/rules/crit", headers=other.auth("admin")).status_code == 404
    )
    in_use = server.client.delete(f"{BASE}/targets/pager", headers=tenant.auth("admin"))
    assert in_use.status_code == 422
    assert (
        server.client.delete(f"{BASE}/rules/crit", headers=tenant.auth("admin")).status_code == 204
    )
    assert (
        server.client.delete(f"{BASE}/targets/pager", headers=tenant.auth("admin")).status_code
        == 204
    )
    assert server.client.get(f"{BASE}/targets", headers=tenant.auth("admin")).json() == {
        "targets": [],
        "allowlist": [],
    }
    again = server.client.post(f"{BASE}/targets", json=body, headers=tenant.auth("admin"))
    assert again.status_code == 201, again.text
    actions = [
        e["action"] for e in server.plane.audit_entries(server.plane.tenant_id(tenant.name), 50)
    ]
    for action in (
        "notify.target.create",
        "notify.rule.create",
        "notify.rule.delete",
        "notify.target.delete",
    ):
        assert action in actions


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_delivery_in_flight_when_the_server_dies_is_sent_again_after_restart(
    backend: str, tmp_path: Path, receivers: Callable[[], Receiver]
) -> None:
    """A real server process, killed (SIGKILL) while its webhook request is in flight."""
    hook = receivers()
    hook.hold.clear()  # the first request hangs until released
    pg_name = create_pg_database() if backend == "postgres" else None
    url = (
        f"postgresql://postgres@127.0.0.1:5432/{pg_name}"
        if pg_name
        else f"sqlite:///{tmp_path}/server.db"
    )
    key_file = tmp_path / "server.key"
    database = Database(url)
    database.migrate()
    plane = ControlPlane(database, load_or_create_server_key(key_file))
    tenant_id = plane.create_tenant("crash", "test")
    plane.create_user(tenant_id, "admin-user", Role.ADMIN, "test")
    admin = {"Authorization": f"Bearer {plane.create_token(tenant_id, 'admin-user', 'test')[1]}"}
    settings = {
        "notify_poll_seconds": 0.05,
        "notify_scan_seconds": 0.1,
        "notify_timeout": 1.0,
        "notify_lease_seconds": 0.0,
        "notify_base_delay": 0.05,
    }
    first = ServerProcess(url, key_file, **settings).start()
    second: ServerProcess | None = None
    try:
        bundle = plane.enroll(tenant_id, "edge-c", "test", url=first.url)
        credential = httpx.post(
            first.url + "/api/v1/agent/enroll",
            headers={"Authorization": f"Bearer {bundle['token']}"},
        ).json()["credential"]
        device = {"Authorization": f"Bearer {credential}"}
        allow = {"entries": ["127.0.0.1/32"]}
        assert httpx.put(f"{first.url}{BASE}/allowlist", json=allow, headers=admin).is_success
        target = {"name": "hook", "url": hook.url, "secret": SECRET}
        assert httpx.post(f"{first.url}{BASE}/targets", json=target, headers=admin).is_success
        rule = {"name": "all", "target": "hook"}
        assert httpx.post(f"{first.url}{BASE}/rules", json=rule, headers=admin).is_success
        sent = httpx.post(
            first.url + "/api/v1/agent/report",
            json={**DRIFT, "heartbeat_interval": 30.0},
            headers=device,
        )
        assert sent.status_code == 200, sent.text
        wait_for(lambda: hook.got(), "the first attempt")
        assert first.process is not None
        first.process.kill()
        first.process.wait(10)
        hook.hold.set()

        second = ServerProcess(url, key_file, **settings).start()
        wait_for(lambda: len(hook.got()) >= 2, "the attempt after the restart")
        got = hook.got()
        assert {r.event["id"] for r in got} == {got[0].event["id"]}
        assert all(verify(SECRET.encode(), r.headers["X-Trueup-Signature"], r.body) for r in got)

        def delivered() -> bool:
            listed = httpx.get(f"{second.url}{BASE}/deliveries", headers=admin).json()
            return [d["state"] for d in listed["deliveries"]] == ["delivered"]

        wait_for(delivered, "the delivery to be logged as delivered")
    finally:
        hook.hold.set()
        first.stop()
        if second is not None:
            second.stop()
        database.dispose()
        if pg_name:
            drop_pg_database(pg_name)


def test_cli_manages_rules_and_targets_and_reads_the_log(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from trueup.cli.main import app as cli_app

    url, key = f"sqlite:///{tmp_path}/server.db", tmp_path / "server.key"
    database = Database(url)
    database.migrate()
    ControlPlane(database, load_or_create_server_key(key)).create_tenant("acme", "test")
    database.dispose()
    where = ["--tenant", "acme", "--db", url, "--key-file", str(key)]

    def cli(*args: str) -> Any:
        return CliRunner().invoke(cli_app, ["server", "notify", *args, *where])

    made = cli("add-target", "pager", "https://hooks.example.net/x")
    assert made.exit_code == 0, made.output
    assert "signing secret (shown once): " in made.output
    bad = cli("add-rule", "r1", "--target", "pager", "--kind", "nope")
    assert bad.exit_code == 1 and "match.kinds: 'nope'" in bad.output
    rule = cli(
        "add-rule", "r1", "--target", "pager", "--device", "edge-*", "--escalate-after", "900"
    )
    assert rule.exit_code == 0, rule.output
    listed = cli("rules", "-o", "json")
    assert json.loads(listed.output)["rules"][0]["match"]["devices"] == ["edge-*"]
    assert "900s" in cli("rules").output
    targets = cli("targets", "-o", "json")
    assert "secret" not in targets.output and "pager" in targets.output
    assert cli("deliveries", "--state", "dead").exit_code == 0
    assert cli("deliveries", "--state", "lost").exit_code == 1
    assert cli("redeliver", "99").exit_code == 1
    assert cli("remove", "target", "pager").exit_code == 1  # r1 uses it
    assert cli("remove", "rule", "r1").exit_code == 0
    assert cli("remove", "target", "pager").exit_code == 0


@pytest.mark.parametrize("isolated_server", PARAMS, indirect=True)
def test_the_scan_judges_a_report_the_notifier_never_saw(
    isolated_server: Server, receivers: Callable[[], Receiver]
) -> None:
    """As after a crash between a report's commit and its evaluation."""
    server = isolated_server
    tenant = server.tenant("nm", devices=("edge-m",))
    hook = receivers()
    route(server, tenant, hook, match={"kinds": ["drift_detected"]})
    report(server, tenant, "edge-m", CLEAN)
    device_id = server.plane.device_id(server.plane.tenant_id(tenant.name), "edge-m")
    wait_for(lambda: _judged_at(server, device_id), "the clean report to be judged")
    # The drift report is committed, but the notifier forgets it had judged it.
    report(server, tenant, "edge-m", DRIFT)
    wait_for(lambda: hook.events("drift_detected"), "the drift event")
    # ... and the report is older than the notifier's own turn (MISSED_AFTER): the
    # periodic scan judges it.
    with server.plane.db.write() as conn:
        conn.execute(
            update(notify_devices)
            .where(notify_devices.c.device_id == device_id)
            .values(conditions="{}", report_at=0.0)
        )
        conn.execute(
            update(device_state)
            .where(device_state.c.device_id == device_id)
            .values(last_report_at=time.time() - MISSED_AFTER - 1)
        )
    wait_for(lambda: len(hook.events("drift_detected")) == 2, "the scan's drift event")


def _judged_at(server: Server, device_id: int) -> float | None:
    with server.plane.db.read() as conn:
        return conn.execute(
            select(notify_devices.c.report_at).where(notify_devices.c.device_id == device_id)
        ).scalar()
