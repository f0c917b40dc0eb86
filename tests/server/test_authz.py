"""An authorisation matrix generated from /openapi.json.

Every operation declares `x-trueup-role`. For each one: no token, an unknown
token, a too-weak role (or the wrong kind of principal) and another tenant's
token are refused; then the right principal is let through, so the refusals are
known to come from authorisation and not from a broken route.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import time
import uuid
from typing import Any

import pytest
from sqlalchemy import select, update

from tests.server.conftest import Server, Tenant, document
from trueup.model.document import document_digest, parse_document
from trueup.model.layering import Provenance
from trueup.server.service.fleettypes import Plan, Target
from trueup.server.tables import notify_deliveries, notify_events, notify_targets, rollouts
from trueup.server.tokens import Role

WEAKER = {"viewer": None, "operator": "viewer", "admin": "operator"}

# A valid request body for every operation that takes one. A route missing here
# fails the test, so new routes join the matrix.
BODIES: dict[tuple[str, str], Any] = {
    ("post", "/api/v1/devices"): {"name": "edge-new"},
    ("put", "/api/v1/devices/{device}/desired"): document("edge-a"),
    ("post", "/api/v1/devices/{device}/acks"): {
        "subsystem": "links",
        "for_seconds": 60,
        "reason": "test",
    },
    ("put", "/api/v1/devices/{device}/secrets/{name}"): {"value": "v"},
    ("put", "/api/v1/devices/{device}/labels"): {"site": "ams"},
    ("patch", "/api/v1/devices/{device}/labels"): {"role": "edge", "site": None},
    ("post", "/api/v1/users"): {"name": "new-user", "role": "viewer"},
    ("put", "/api/v1/users/{user}/role"): {"role": "viewer"},
    ("post", "/api/v1/users/{user}/tokens"): {"label": "x"},
    ("post", "/api/v1/agent/report"): {"applied_version": 0},
    ("post", "/api/v1/agent/backups"): "an opaque archive",
    ("post", "/api/v1/notifications/targets"): {
        "name": "hook-new",
        "url": "https://hooks.example.net/new",
    },
    ("put", "/api/v1/notifications/allowlist"): {"entries": ["127.0.0.1/32"]},
    ("post", "/api/v1/notifications/rules"): {"name": "rule-new", "target": "k2"},
    ("post", "/api/v1/agent/evidence"): "an opaque bundle",
    ("put", "/api/v1/profiles/{name}"): {
        "apiVersion": "trueup/v1",
        "kind": "Profile",
        "metadata": {"name": "k1"},
        "spec": {"selector": "", "document": {}},
    },
    ("put", "/api/v1/devices/{device}/variables"): {"variables": {}, "own": None},
    ("post", "/api/v1/plan"): {"selector": ""},
    ("post", "/api/v1/plan/publish"): {"comment": "authz"},
    # A device of that name exists in both tenants (each starts a rollout of its own).
    ("post", "/api/v1/rollouts"): {
        "targets": [{"device": "edge-r", "document": document("edge-r")}],
        "waves": [{"percent": 100}],
    },
    ("post", "/api/v1/rollouts/{rollout_id}/pause"): {"reason": "test"},
    ("post", "/api/v1/rollouts/{rollout_id}/resume"): {},
    ("post", "/api/v1/rollouts/{rollout_id}/approve"): {},
    ("post", "/api/v1/rollouts/{rollout_id}/abort"): {"reason": "test"},
}
# The state a rollout must be in for each action route to let the right caller through.
ROLLOUT_STATE = {
    "pause": "running",
    "resume": "paused",
    "approve": "waiting-approval",
    "abort": "running",
}


def operations(spec: dict[str, Any]) -> list[tuple[str, str, str]]:
    out = []
    for path, methods in spec["paths"].items():
        for method, operation in methods.items():
            out.append((method, path, operation["x-trueup-role"]))
    return sorted(out)


def call(
    server: Server, method: str, path: str, values: dict[str, str], headers: dict[str, str]
) -> int:
    url = re.sub(r"\{(\w+)\}", lambda m: values[m.group(1)], path)
    body = BODIES.get((method, path))
    content = json.dumps(body) if body is not None else None
    extra = {"If-Match": values["if_match"]} if path.endswith("/desired") else {}
    if path == "/api/v1/profiles/{name}" and method in ("put", "delete"):
        extra = {"If-Match": values["profile_if_match"]}
    if path.endswith("/variables") and method == "put":
        extra = {"If-Match": "0"}
    if path == "/api/v1/agent/backups":
        extra = {"X-Trueup-Backup-Sha256": hashlib.sha256((content or "").encode()).hexdigest()}
    if path == "/api/v1/agent/evidence":
        extra = {"X-Trueup-Evidence-Sha256": hashlib.sha256((content or "").encode()).hexdigest()}
    response = server.client.request(
        method.upper(),
        url,
        content=content,
        headers={"content-type": "application/json", **extra, **headers},
    )
    return response.status_code


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_every_route_refuses_the_wrong_callers(server: Server) -> None:
    a = server.tenant("a", devices=("edge-a",))
    b = server.tenant("b", devices=("edge-b",))
    a_id = server.plane.tenant_id(a.name)
    server.plane.create_user(a_id, "only-in-a", Role.VIEWER, "test")  # a name b does not have
    token_id, _ = server.plane.create_token(a_id, "only-in-a", "test")
    values = {
        "device": "edge-a",
        "user": "only-in-a",
        "token_id": str(token_id),
        "name": "k1",
        "version": "1",
        "if_match": "0",
        "profile_if_match": "1",
    }
    server.plane.put_profile(a_id, "k1", 0, BODIES[("put", "/api/v1/profiles/{name}")], actor="t")
    server.plane.put_desired(a_id, "edge-a", 0, document("edge-a"), author="test")
    values["if_match"] = "1"
    archive = b"edge-a's archive"
    values["backup_id"] = str(
        server.plane.store_backup(
            a_id,
            server.plane.device_id(a_id, "edge-a"),
            io.BytesIO(archive),
            sha256=hashlib.sha256(archive).hexdigest(),
            metadata={},
            actor="test",
        )["id"]
    )
    values["delivery_id"] = str(_notification_fixtures(server, a, b))
    for tenant_id in (a_id, server.plane.tenant_id(b.name)):
        server.plane.create_device(tenant_id, "edge-r", "test")
    values["rollout_id"] = str(_rollout(server, a_id, "edge-s", "running"))
    bundle = b"edge-a's evidence"
    values["evidence_id"] = str(
        server.plane.store_evidence(
            a_id,
            server.plane.device_id(a_id, "edge-a"),
            io.BytesIO(bundle),
            sha256=hashlib.sha256(bundle).hexdigest(),
            metadata={},
            actor="test",
        )["id"]
    )
    spec = server.client.get("/openapi.json", headers=a.auth("viewer")).json()
    matrix = operations(spec)
    assert len(matrix) >= 25
    roles = {role for _, _, role in matrix}
    assert roles == {"public", "viewer", "operator", "admin", "device", "enrollment"}
    for method, path in BODIES:
        assert path in spec["paths"] and method in spec["paths"][path], (method, path)
    for method, path, role in matrix:
        if method in ("post", "put", "patch") and role not in ("public", "enrollment"):
            takes_body = "requestBody" in spec["paths"][path][method]
            assert not takes_body or (method, path) in BODIES, f"no example body: {method} {path}"
    refusals = 0
    for method, path, role in matrix:
        where = f"{method.upper()} {path} ({role})"
        if role == "public":
            assert call(server, method, path, values, {}) == 200, where
            continue
        assert call(server, method, path, values, {}) == 401, where
        assert call(server, method, path, values, bearer("tu_u_" + "x" * 43)) == 401, where
        refusals += 2
        if role in WEAKER:
            weaker = WEAKER[role]
            if weaker is not None:
                assert call(server, method, path, values, a.auth(weaker)) == 403, where
            assert call(server, method, path, values, a.device_auth("edge-a")) == 403, where
            refusals += 2
            status = call(server, method, path, values, b.auth("admin"))
            if "{" in path:
                assert status == 404, (where, status)
            else:
                assert status < 400, (where, status)  # answered from tenant b's own data
            refusals += 1
        elif role == "device":
            assert call(server, method, path, values, a.auth("admin")) == 403, where
            refusals += 1
        elif role == "enrollment":
            assert call(server, method, path, values, a.auth("admin")) == 401, where
            assert call(server, method, path, values, a.device_auth("edge-a")) == 401, where
            refusals += 2
    assert refusals > 100
    _wrong_tenant_sees_nothing(server, a, b)
    _right_callers_pass(server, a, matrix, values)


def _notification_fixtures(server: Server, a: Tenant, b: Tenant) -> int:
    """Targets k1, k2 and rule k1 in tenant a (k2 in b too), and a dead delivery in a: its id."""
    a_id, b_id = server.plane.tenant_id(a.name), server.plane.tenant_id(b.name)
    for tenant_id in (a_id, b_id):  # a redelivery goes to 127.0.0.1:9: never elsewhere
        server.plane.set_notify_allowlist(tenant_id, ["127.0.0.1/32"], "test")
    for tenant_id, name in ((a_id, "k1"), (a_id, "k2"), (b_id, "k2")):
        server.plane.create_notify_target(tenant_id, name, "http://127.0.0.1:9/", None, "test")
    server.plane.create_notify_rule(a_id, "k1", "k1", {"kinds": ["fenced"]}, None, "test")
    device_id = server.plane.device_id(a_id, "edge-a")
    with server.plane.db.write() as conn:
        target_id = conn.execute(
            select(notify_targets.c.id).where(
                notify_targets.c.tenant_id == a_id, notify_targets.c.name == "k1"
            )
        ).scalar_one()
        event = str(uuid.uuid4())
        conn.execute(
            notify_events.insert().values(
                id=event,
                tenant_id=a_id,
                device_id=device_id,
                kind="fenced",
                severity="warning",
                at=time.time(),
                payload="{}",
            )
        )
        result = conn.execute(
            notify_deliveries.insert().values(
                tenant_id=a_id,
                event_id=event,
                target_id=target_id,
                state="dead",
                attempts=8,
                next_attempt_at=time.time(),
                created_at=time.time(),
                finished_at=time.time(),
            )
        )
        return int(result.inserted_primary_key[0])


def _rollout(server: Server, tenant_id: int, device: str, state: str) -> int:
    """A rollout of a new device `device` of the tenant, put in `state`: its id."""
    server.plane.create_device(tenant_id, device, "test")
    body = document(device)
    target = Target(
        device_id=server.plane.device_id(tenant_id, device),
        device=device,
        from_version=0,
        document=body,
        digest=document_digest(parse_document(body)),
        provenance=Provenance(profiles=(), variables_digest="", own_digest=None),
        changes=(),
    )
    plan = Plan(targets=(target,), refused=(), unchanged=0)
    rollout_id = int(server.plane.start_rollout(tenant_id, plan, actor="test")["id"])
    if state != "running":
        with server.plane.db.write() as conn:
            conn.execute(update(rollouts).where(rollouts.c.id == rollout_id).values(state=state))
    return rollout_id


def _wrong_tenant_sees_nothing(server: Server, a: Tenant, b: Tenant) -> None:
    """List routes and device routes answer from the caller's tenant only."""
    for path in (
        "/api/v1/devices",
        "/api/v1/users",
        "/api/v1/tokens",
        "/api/v1/audit",
        "/api/v1/rollouts",
    ):
        text = server.client.get(path, headers=b.auth("admin")).text
        assert a.name not in text and "edge-a" not in text, path
    desired = server.client.get("/api/v1/agent/desired?wait=0", headers=b.device_auth("edge-b"))
    assert desired.status_code == 204  # edge-a has a revision; edge-b does not
    secrets = server.client.get("/api/v1/agent/secrets", headers=b.device_auth("edge-b"))
    assert secrets.json() == {"secrets": {}, "refused": []}


def _right_callers_pass(
    server: Server, a: Tenant, matrix: list[tuple[str, str, str]], values: dict[str, str]
) -> None:
    # Routes that revoke credentials, or delete what other routes read, go last.
    last = (
        "/api/v1/devices/{device}/enrollment",
        "/api/v1/tokens/{token_id}/revoke",
        "/api/v1/devices/{device}/backups/{backup_id}",
    )
    ordered = sorted(matrix, key=lambda op: (op[1] in last, op[0] == "delete"))
    a_id = server.plane.tenant_id(a.name)
    for method, path, role in ordered:
        where = f"{method.upper()} {path} ({role})"
        if role == "public":
            continue
        if role == "device":
            headers = a.device_auth("edge-a")
        elif role == "enrollment":
            bundle = server.plane.enroll(a_id, "edge-enroll", "test", url="http://x")
            headers = bearer(bundle["token"])
        else:
            headers = a.auth(role)
        if path.endswith("/desired") and method == "put":
            values = {**values, "if_match": "1"}
        if path == "/api/v1/profiles/{name}" and method == "delete":
            values = {**values, "profile_if_match": "2"}  # after its PUT
        if path.startswith("/api/v1/rollouts/{rollout_id}/"):
            action = path.rsplit("/", 1)[1]
            rollout_id = _rollout(server, a_id, f"edge-{action}", ROLLOUT_STATE[action])
            values = {**values, "rollout_id": str(rollout_id)}
        status = call(server, method, path, values, headers)
        assert status in (200, 201, 204), (where, status)


@pytest.mark.parametrize("header", ["Bearer", "Basic abc", "bearer tu_u_x", ""])
def test_malformed_authorization_headers_are_refused(server: Server, header: str) -> None:
    response = server.client.get("/api/v1/devices", headers={"Authorization": header})
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == "Bearer"
