"""An agent receives only a desired revision the audit log vouches for.

With write access to the database but not the key, an attacker could otherwise push any
document to a router: rewrite the desired revision's document (and its content hash, which
anyone can compute), insert a newer revision and point the device at it, or roll the
device's desired version back to an older, weaker revision. The agent's long poll compares
the revision with its audited entry first: each is refused with 409 and the reason (the
agent keeps enforcing its last accepted revision), and `audit verify` names the row.
"""

from __future__ import annotations

import json
import time

import pytest
from sqlalchemy import text

from tests.server.conftest import BACKENDS, Server, Tenant, document
from trueup.model.document import document_digest, parse_document

pytestmark = pytest.mark.parametrize("isolated_server", BACKENDS, indirect=True)

DESIRED = "/api/v1/agent/desired?after=0&wait=0"


def two_revisions(server: Server) -> tuple[Tenant, int]:
    tenant = server.tenant("acme", devices=("edge-01",))
    for version, address in enumerate(("198.51.100.2/24", "198.51.100.3/24")):
        put = server.client.put(
            "/api/v1/devices/edge-01/desired",
            json=document("edge-01", address=address),
            headers={**tenant.auth("operator"), "If-Match": str(version)},
        )
        assert put.status_code == 201, put.text
    with server.plane.db.engine.begin() as conn:
        device_id = conn.execute(text("SELECT id FROM devices WHERE name = 'edge-01'")).scalar()
    return tenant, int(device_id)


def fetch(server: Server, tenant: Tenant) -> tuple[int, dict[str, object]]:
    answer = server.client.get(DESIRED, headers=tenant.device_auth("edge-01"))
    return answer.status_code, answer.json() if answer.content else {}


def test_the_audited_revision_is_served(isolated_server: Server) -> None:
    tenant, _device_id = two_revisions(isolated_server)
    status, body = fetch(isolated_server, tenant)
    assert status == 200 and body["version"] == 2, body


def test_a_rewritten_document_is_refused(isolated_server: Server) -> None:
    server = isolated_server
    tenant, device_id = two_revisions(server)
    forged = document("edge-01", address="203.0.113.66/24")
    digest = document_digest(parse_document(forged))
    with server.plane.db.engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE revisions SET document = :d, content_hash = :h "
                "WHERE device_id = :i AND version = 2"
            ),
            {"d": json.dumps(forged), "h": digest, "i": device_id},
        )
    status, body = fetch(server, tenant)
    assert status == 409 and "document differs from the audited one" in str(body), body


def test_a_revision_inserted_directly_is_refused(isolated_server: Server) -> None:
    server = isolated_server
    tenant, device_id = two_revisions(server)
    forged = document("edge-01", address="203.0.113.66/24")
    forged["metadata"]["version"] = 3
    with server.plane.db.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO revisions (device_id, version, parent_version, author, comment, "
                "content_hash, created_at, document) SELECT device_id, 3, 2, author, comment, "
                ":h, :t, :d FROM revisions WHERE device_id = :i AND version = 2"
            ),
            {
                "h": document_digest(parse_document(forged)),
                "t": time.time(),
                "d": json.dumps(forged),
                "i": device_id,
            },
        )
        conn.execute(text("UPDATE devices SET desired_version = 3 WHERE id = :i"), {"i": device_id})
    status, body = fetch(server, tenant)
    assert status == 409 and "revision 3 of 'edge-01' has no audit entry" in str(body), body


def test_a_desired_version_rolled_back_is_refused(isolated_server: Server) -> None:
    server = isolated_server
    tenant, device_id = two_revisions(server)
    with server.plane.db.engine.begin() as conn:
        conn.execute(text("UPDATE devices SET desired_version = 1 WHERE id = :i"), {"i": device_id})
    status, body = fetch(server, tenant)
    assert status == 409 and "newest revision is 2" in str(body), body
