"""Nothing is sent to a webhook target, nor through an allowlist, that the audit log does
not vouch for.

An attacker with write access to the database but not the key cannot open a target's
sealed secret header, but could point the target's url at a receiver of their own (or bring
a deleted target back) and let the server open and send it; or insert an allowlist that lets
the server reach inside. The notifier compares the target row and the allowlist with their
audited state before it opens anything: such a delivery goes to the dead letters with the
reason, and an allowlist the log does not vouch for counts as empty.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest
from sqlalchemy import text

from tests.server.conftest import BACKENDS, Server, Tenant

pytestmark = pytest.mark.parametrize("isolated_server", BACKENDS, indirect=True)

NOTIFY = "/api/v1/notifications"
LATER = time.time() + 10_000  # the deliveries below are due only then: the notifier leaves them


def with_target(server: Server) -> tuple[Tenant, int, dict[str, int]]:
    tenant = server.tenant("acme", devices=("edge-01",))
    admin = tenant.auth("admin")
    for name in ("ticketing", "old"):
        body = {
            "name": name,
            "url": f"https://{name}.example.net/hook",
            "auth_header": {"name": "Authorization", "value": f"Bearer {name}-t0ken"},
        }
        created = server.client.post(f"{NOTIFY}/targets", json=body, headers=admin)
        assert created.status_code == 201, created.text
    assert server.client.delete(f"{NOTIFY}/targets/old", headers=admin).status_code == 204
    with server.plane.db.engine.begin() as conn:
        ids = {
            str(name).split(".deleted-")[0]: int(i)
            for name, i in conn.execute(text("SELECT name, id FROM notify_targets")).all()
        }
    return tenant, server.plane.tenant_id(tenant.name), ids


def queue(server: Server, tenant_id: int, target_id: int) -> int:
    """A pending delivery to the target, due at LATER (as the engine would queue one)."""
    with server.plane.db.engine.begin() as conn:
        device_id = conn.execute(
            text("SELECT id FROM devices WHERE tenant_id = :t"), {"t": tenant_id}
        ).scalar_one()
        event = str(uuid.uuid4())
        conn.execute(
            text(
                "INSERT INTO notify_events (id, tenant_id, device_id, kind, severity, at, payload)"
                " VALUES (:e, :t, :d, 'drift_detected', 'warning', :a, '{}')"
            ),
            {"e": event, "t": tenant_id, "d": device_id, "a": time.time()},
        )
        conn.execute(
            text(
                "INSERT INTO notify_deliveries (tenant_id, event_id, target_id, state, attempts,"
                " next_attempt_at, created_at) VALUES (:t, :e, :g, 'pending', 0, :n, :n)"
            ),
            {"t": tenant_id, "e": event, "g": target_id, "n": LATER - 1},
        )
        return int(
            conn.execute(
                text("SELECT id FROM notify_deliveries WHERE event_id = :e"), {"e": event}
            ).scalar_one()
        )


def delivery(server: Server, delivery_id: int) -> Any:
    with server.plane.db.engine.begin() as conn:
        return conn.execute(
            text("SELECT state, last_error FROM notify_deliveries WHERE id = :i"),
            {"i": delivery_id},
        ).one()


def test_an_untouched_target_is_claimed_with_its_header(isolated_server: Server) -> None:
    server = isolated_server
    _tenant, tenant_id, ids = with_target(server)
    queue(server, tenant_id, ids["ticketing"])
    (claimed,) = server.plane.notify_deliveries.claim(now=LATER)
    assert claimed.url == "https://ticketing.example.net/hook"
    assert claimed.auth_header == ("Authorization", "Bearer ticketing-t0ken")


@pytest.mark.parametrize(
    ("edit", "target", "reason"),
    [
        (
            "UPDATE notify_targets SET url = 'https://attacker.example.org/' WHERE id = :i",
            "ticketing",
            "its url differs from the audited one",
        ),
        (
            "UPDATE notify_targets SET deleted_at = NULL, name = 'old' WHERE id = :i",
            "old",
            "its name differs from the audited one",
        ),
        (
            "UPDATE notify_targets SET auth_header_nonce = (SELECT auth_header_nonce FROM "
            "notify_targets WHERE name = 'ticketing'), auth_header_ciphertext = (SELECT "
            "auth_header_ciphertext FROM notify_targets WHERE name = 'ticketing'), "
            "auth_header_secret_id = (SELECT auth_header_secret_id FROM notify_targets "
            "WHERE name = 'ticketing') WHERE id = :i",
            "old",
            "differs from the audited one",
        ),
    ],
)
def test_a_rewritten_target_is_not_sent_its_header(
    isolated_server: Server, edit: str, target: str, reason: str
) -> None:
    server = isolated_server
    _tenant, tenant_id, ids = with_target(server)
    with server.plane.db.engine.begin() as conn:
        conn.execute(text(edit), {"i": ids[target]})
    delivery_id = queue(server, tenant_id, ids[target])
    assert server.plane.notify_deliveries.claim(now=LATER) == []
    state, error = delivery(server, delivery_id)
    assert state == "dead" and reason in error and "not delivered" in error, error


def test_a_target_inserted_directly_is_not_sent(isolated_server: Server) -> None:
    server = isolated_server
    _tenant, tenant_id, ids = with_target(server)
    with server.plane.db.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO notify_targets (tenant_id, name, url, secret_id, nonce, ciphertext,"
                " created_at) SELECT tenant_id, 'mine', 'https://attacker.example.org/', "
                "secret_id, nonce, ciphertext, created_at FROM notify_targets WHERE id = :i"
            ),
            {"i": ids["ticketing"]},
        )
        mine = conn.execute(text("SELECT id FROM notify_targets WHERE name = 'mine'")).scalar_one()
    delivery_id = queue(server, tenant_id, int(mine))
    assert server.plane.notify_deliveries.claim(now=LATER) == []
    state, error = delivery(server, delivery_id)
    assert state == "dead" and "no audit entry" in error, error


def test_an_allowlist_the_log_does_not_vouch_for_counts_as_empty(isolated_server: Server) -> None:
    server = isolated_server
    tenant, tenant_id, ids = with_target(server)
    with server.plane.db.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO notify_allowlists (tenant_id, entries, updated_at) VALUES (:t, :e, 0)"
            ),
            {"t": tenant_id, "e": json.dumps(["127.0.0.0/8", "169.254.0.0/16"])},
        )
    queue(server, tenant_id, ids["ticketing"])
    (claimed,) = server.plane.notify_deliveries.claim(now=LATER)
    assert claimed.allowlist.entries() == []
    # Set through the API (audited), the same list is used.
    listed = server.client.put(
        f"{NOTIFY}/allowlist", json={"entries": ["127.0.0.0/8"]}, headers=tenant.auth("admin")
    )
    assert listed.status_code == 200, listed.text
    queue(server, tenant_id, ids["ticketing"])
    (claimed,) = server.plane.notify_deliveries.claim(now=LATER)
    assert claimed.allowlist.entries() == ["127.0.0.0/8"]
