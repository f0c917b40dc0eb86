"""Tenant-bound secrets: a ciphertext copied across tenants, or onto another secret, is refused."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from tests.server.conftest import BACKENDS, Server
from trueup.server.keys import SecretBox, SecretRefused, new_data_key


@pytest.mark.parametrize("isolated_server", BACKENDS, indirect=True)
def test_ciphertext_copied_into_another_tenants_row_is_refused(isolated_server: Server) -> None:
    server = isolated_server
    a = server.tenant("a", devices=("edge-a",))
    b = server.tenant("b", devices=("edge-b",))
    a_id, b_id = server.plane.tenant_id(a.name), server.plane.tenant_id(b.name)
    server.plane.put_secret(a_id, "edge-a", "wg-key", "tenant-a-private", "test")
    server.plane.put_secret(b_id, "edge-b", "wg-key", "tenant-b-private", "test")
    with server.plane.db.read() as conn:
        raw = conn.execute(text("SELECT ciphertext FROM secrets")).all()
    assert all(b"private" not in bytes(r.ciphertext) for r in raw)  # encrypted at rest
    with server.plane.db.engine.begin() as conn:
        source = conn.execute(
            text("SELECT nonce, ciphertext FROM secrets WHERE tenant_id = :t"), {"t": a_id}
        ).one()
        conn.execute(
            text("UPDATE secrets SET nonce = :n, ciphertext = :c WHERE tenant_id = :t"),
            {"n": source.nonce, "c": source.ciphertext, "t": b_id},
        )
    response = server.client.get("/api/v1/agent/secrets", headers=b.device_auth("edge-b"))
    assert response.status_code == 200
    body = response.json()
    assert body["secrets"] == {}
    assert body["refused"][0]["name"] == "wg-key"
    assert "decryption refused" in body["refused"][0]["error"]
    assert "tenant-a-private" not in response.text
    # Tenant a's device still gets its own secret.
    mine = server.client.get("/api/v1/agent/secrets", headers=a.device_auth("edge-a"))
    assert mine.json()["secrets"] == {"wg-key": "tenant-a-private"}


def test_secret_box_binds_tenant_and_secret_id() -> None:
    key = new_data_key()
    box = SecretBox(1, key)
    nonce, sealed = box.seal("s1", b"value")
    assert box.open("s1", nonce, sealed) == b"value"
    with pytest.raises(SecretRefused, match="decryption refused"):
        box.open("s2", nonce, sealed)  # moved onto another secret
    with pytest.raises(SecretRefused):
        SecretBox(2, key).open("s1", nonce, sealed)  # same key, other tenant id
    with pytest.raises(SecretRefused):
        SecretBox(1, new_data_key()).open("s1", nonce, sealed)  # other tenant's key
