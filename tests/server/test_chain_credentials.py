"""Credential state comes only from a verified audit chain, on a real server process.

An attacker with write access to the database (not to the key file) deletes or
rewrites the one middle audit row that revoked a token, revoked a device credential
on re-enrollment, or demoted an admin, then puts the live row back. The running
server keeps refusing the credential, so does a restarted one, and `audit verify`
names it; a credential issued after the break works, which is how an operator
recovers."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from tests.server.conftest import (
    BACKENDS,
    Server,
    ServerProcess,
    create_pg_database,
    drop_pg_database,
)
from trueup.cli.server import server_app
from trueup.model.digests import canonical_json
from trueup.server import chainproof
from trueup.server.db import Database
from trueup.server.keys import load_or_create_server_key
from trueup.server.service import ControlPlane, Unauthorized
from trueup.server.tokens import Role

# Generous: the server notices within auth_cache_seconds (2 s by default).
WITHIN_SECONDS = 60.0


def wait_for(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WITHIN_SECONDS
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {WITHIN_SECONDS} s"
        time.sleep(0.05)


@dataclass
class Running:
    """A control plane in this process (the operator's CLI) and a real server process on
    the same database and key file."""

    url: str
    key_file: Path
    plane: ControlPlane
    servers: list[ServerProcess]
    log: Path

    @property
    def server(self) -> ServerProcess:
        return self.servers[0]

    def call(self, path: str, token: str, server: ServerProcess | None = None) -> httpx.Response:
        base = (server or self.server).url
        return httpx.get(base + path, headers={"Authorization": f"Bearer {token}"}, timeout=30)

    def status(self, path: str, token: str) -> int:
        return self.call(path, token).status_code

    def restart(self) -> None:
        for server in self.servers:
            server.stop()
            server.start()

    def cli(self, *args: str) -> Any:
        return CliRunner().invoke(
            server_app, [*args, "--db", self.url, "--key-file", str(self.key_file)]
        )

    def sql(self, statement: str, **params: Any) -> list[Any]:
        """Run one statement in its own transaction; the rows it returns, if any."""
        with self.plane.db.engine.begin() as conn:
            result = conn.execute(text(statement), params)
            return list(result) if result.returns_rows else []

    def scalar(self, statement: str, **params: Any) -> Any:
        (row,) = self.sql(statement, **params)
        return row[0]


def _running(backend: str, tmp_path: Path, processes: int) -> Iterator[Running]:
    name = None
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path}/server.db"
    else:
        name = create_pg_database()
        url = f"postgresql://postgres@127.0.0.1:5432/{name}"
    key_file = tmp_path / "server.key"
    database = Database(url)
    database.migrate()
    plane = ControlPlane(database, load_or_create_server_key(key_file))
    log = tmp_path / "server.log"
    servers = [
        ServerProcess(url, key_file, log_path=log, revision_poll_seconds=0.2)
        for _ in range(processes)
    ]
    try:
        for server in servers:
            server.start()
        yield Running(url, key_file, plane, servers, log)
    finally:
        for server in servers:
            server.stop()
        database.dispose()
        if name is not None:
            drop_pg_database(name)


@pytest.fixture(params=BACKENDS)
def running(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Running]:
    yield from _running(request.param, tmp_path, processes=1)


@pytest.fixture(params=BACKENDS)
def two_processes(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Running]:
    yield from _running(request.param, tmp_path, processes=2)


def seq_of(run: Running, action: str, target: str) -> int:
    seq = run.scalar(
        "SELECT max(seq) FROM audit_log WHERE action = :a AND target = :t", a=action, t=target
    )
    assert seq is not None, (action, target)
    return int(seq)


def tamper_row(run: Running, seq: int, edit: str, rewrite: Callable[[dict[str, Any]], Any]) -> None:
    """Delete the audit row, or rewrite its detail in place (its HMAC no longer matches)."""
    head = run.scalar("SELECT seq FROM audit_head")
    assert seq < head, "the row must be in the middle of the chain"
    if edit == "delete":
        run.sql("DELETE FROM audit_log WHERE seq = :s", s=seq)
        return
    detail = json.loads(run.scalar("SELECT detail FROM audit_log WHERE seq = :s", s=seq))
    run.sql(
        "UPDATE audit_log SET detail = :d WHERE seq = :s",
        d=canonical_json(rewrite(detail)).decode(),
        s=seq,
    )


@dataclass
class Tampered:
    tenant: str
    tenant_id: int
    token: str
    token_id: int
    name: str  # how `audit verify` and the server log name the credential
    path: str  # an endpoint the credential could call before
    seq: int  # the audit row deleted or rewritten
    running_reason: str  # what the server that saw the original row says


def revoked_token(run: Running, edit: str) -> Tampered:
    plane = run.plane
    tenant = "acme"
    tenant_id = plane.create_tenant(tenant, "test")
    plane.create_user(tenant_id, "ops", Role.OPERATOR, "test")
    token_id, token = plane.create_token(tenant_id, "ops", "test")
    path = "/api/v1/devices"
    wait_for(lambda: run.status(path, token) == 200, "the new token accepted")
    plane.revoke_token(tenant_id, token_id, "test")
    wait_for(lambda: run.status(path, token) == 401, "the revocation reaches the server")
    seq = seq_of(run, "token.revoke", f"token:{token_id}")
    plane.create_user(tenant_id, "later", Role.VIEWER, "test")
    tamper_row(run, seq, edit, lambda d: {**d, "token_id": token_id + 1000})
    run.sql("UPDATE tokens SET revoked_at = NULL WHERE id = :id", id=token_id)
    return Tampered(
        tenant,
        tenant_id,
        token,
        token_id,
        f"token {token_id} (tenant {tenant}, user ops)",
        path,
        seq,
        f"the audit log revoked it at seq {seq}",
    )


def reenrolled_credential(run: Running, edit: str) -> Tampered:
    plane = run.plane
    tenant = "acme"
    tenant_id = plane.create_tenant(tenant, "test")
    bundle = plane.enroll(tenant_id, "edge-01", "test", url=run.server.url)
    exchanged = httpx.post(
        run.server.url + "/api/v1/agent/enroll",
        headers={"Authorization": f"Bearer {bundle['token']}"},
        timeout=30,
    )
    assert exchanged.status_code == 200, exchanged.text
    credential = exchanged.json()["credential"]
    token_id = int(run.scalar("SELECT id FROM tokens WHERE kind = 'device' AND revoked_at IS NULL"))
    path = "/api/v1/agent/desired?after=0&wait=0"
    assert run.status(path, credential) == 204
    plane.enroll(tenant_id, "edge-01", "test", url=run.server.url)  # revokes the credential
    wait_for(lambda: run.status(path, credential) == 401, "the re-enrollment reaches the server")
    seq = seq_of(run, "device.enroll", "device:edge-01")
    detail = json.loads(run.scalar("SELECT detail FROM audit_log WHERE seq = :s", s=seq))
    assert detail["revoked_token_ids"] == [token_id], detail
    plane.create_tenant("later", "test")
    tamper_row(run, seq, edit, lambda d: {**d, "revoked_token_ids": []})
    run.sql("UPDATE tokens SET revoked_at = NULL WHERE id = :id", id=token_id)
    return Tampered(
        tenant,
        tenant_id,
        credential,
        token_id,
        f"device credential {token_id} (tenant {tenant}, device edge-01)",
        path,
        seq,
        f"the audit log revoked it at seq {seq}",
    )


def demoted_admin(run: Running, edit: str) -> Tampered:
    plane = run.plane
    tenant = "acme"
    tenant_id = plane.create_tenant(tenant, "test")
    plane.create_user(tenant_id, "boss", Role.ADMIN, "test")
    token_id, token = plane.create_token(tenant_id, "boss", "test")
    path = "/api/v1/users"
    wait_for(lambda: run.status(path, token) == 200, "the admin token accepted")
    (before,) = run.sql(
        "SELECT role, seal FROM users WHERE name = 'boss' AND tenant_id = :t", t=tenant_id
    )
    plane.set_role(tenant_id, "boss", Role.VIEWER, "test")
    wait_for(lambda: run.status(path, token) == 403, "the demotion reaches the server")
    seq = seq_of(run, "user.role", "user:boss")
    plane.create_user(tenant_id, "later", Role.VIEWER, "test")
    tamper_row(run, seq, edit, lambda d: {**d, "role": "admin"})
    run.sql(
        "UPDATE users SET role = :r, seal = :s WHERE name = 'boss' AND tenant_id = :t",
        r=before.role,
        s=before.seal,
        t=tenant_id,
    )
    return Tampered(
        tenant,
        tenant_id,
        token,
        token_id,
        f"token {token_id} (tenant {tenant}, user boss)",
        path,
        seq,
        "its user has role admin but the last audited role is viewer",
    )


CASES = {
    "revocation": revoked_token,
    "re-enrollment": reenrolled_credential,
    "demotion": demoted_admin,
}


def witness_token(run: Running, tenant_id: int, user: str = "witness") -> str:
    """A token issued after the tampering: once the server accepts it, it has read the log
    past the tampered row."""
    run.plane.create_user(tenant_id, user, Role.VIEWER, "test")
    _id, token = run.plane.create_token(tenant_id, user, "test")
    wait_for(lambda: run.status("/api/v1/devices", token) == 200, "a token issued after")
    return token


@pytest.mark.parametrize("edit", ["delete", "rewrite"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_credential_revived_by_editing_the_log_stays_refused_and_is_named(
    running: Running, case: str, edit: str
) -> None:
    tampered = CASES[case](running, edit)

    # The running server: it has read the log past the edit, and refuses the credential.
    witness_token(running, tampered.tenant_id)
    wait_for(
        lambda: running.status(tampered.path, tampered.token) == 401,
        "the running server refuses the credential",
    )
    refused = running.call(tampered.path, tampered.token)
    # What it remembers of the original row, or the break it found reading past it.
    detail = refused.json()["detail"]
    assert (
        tampered.running_reason in detail
        or f"the audit chain is broken at seq {tampered.seq} " in detail
    ), detail

    # After a restart the log no longer holds the record: the break refuses it.
    running.restart()
    refused = running.call(tampered.path, tampered.token)
    assert refused.status_code == 401, refused.text
    reason = f"the audit chain is broken at seq {tampered.seq} "
    assert reason in refused.json()["detail"]
    assert "after it was issued" in refused.json()["detail"]
    assert "trueup server audit verify" in refused.json()["detail"]
    logged = running.log.read_text()
    assert f"{tampered.name} refused: {reason}" in logged, logged[-2000:]

    result = running.cli("audit", "verify")
    assert result.exit_code == 1, result.output
    assert f"{tampered.name}: accepted by the database, but {reason}" in result.output, (
        result.output
    )
    assert "refused until reissued" in result.output
    if case == "demotion":
        assert f"user {tampered.tenant}/boss: role admin in the database, but " in result.output
    assert "witness" not in result.output  # issued after the break: vouched for
    assert "Traceback" not in result.output


def test_a_revocation_deleted_before_the_server_read_it_is_found_by_the_incremental_walk(
    running: Running,
) -> None:
    plane = running.plane
    tenant_id = plane.create_tenant("acme", "test")
    plane.create_user(tenant_id, "ops", Role.OPERATOR, "test")
    token_id, token = plane.create_token(tenant_id, "ops", "test")
    wait_for(lambda: running.status("/api/v1/devices", token) == 200, "the token accepted")
    # The server is not asked anything between the revocation and the edit.
    plane.revoke_token(tenant_id, token_id, "test")
    seq = seq_of(running, "token.revoke", f"token:{token_id}")
    plane.create_user(tenant_id, "later", Role.VIEWER, "test")
    running.sql("DELETE FROM audit_log WHERE seq = :s", s=seq)
    running.sql("UPDATE tokens SET revoked_at = NULL WHERE id = :id", id=token_id)

    witness_token(running, tenant_id)
    wait_for(lambda: running.status("/api/v1/devices", token) == 401, "the token refused")
    refused = running.call("/api/v1/devices", token)
    assert (
        f"the audit chain is broken at seq {seq} (seq {seq} deleted) after it was issued"
        in (refused.json()["detail"])
    )


def test_an_operator_recovers_with_credentials_issued_after_the_break(running: Running) -> None:
    tampered = demoted_admin(running, "delete")
    old_token = tampered.token
    wait_for(lambda: running.status(tampered.path, old_token) == 401, "the old token refused")

    # A new admin, issued with the server CLI after the break.
    created = running.cli(
        "token", "create", "--tenant", tampered.tenant, "--user", "recovery", "--role", "admin"
    )
    assert created.exit_code == 0, created.output
    recovery = created.output.strip().splitlines()[-1]
    wait_for(lambda: running.status(tampered.path, recovery) == 200, "the recovery token works")

    # The same user, once its role is recorded again, gets a working token; its old one
    # stays refused (its revocation may be what was deleted).
    assert (
        running.cli(
            "user", "role", "--tenant", tampered.tenant, "--user", "boss", "--role", "admin"
        ).exit_code
        == 0
    )
    reissued = running.cli("token", "create", "--tenant", tampered.tenant, "--user", "boss")
    assert reissued.exit_code == 0, reissued.output
    boss = reissued.output.strip().splitlines()[-1]
    wait_for(lambda: running.status(tampered.path, boss) == 200, "the reissued token works")

    # Re-anchoring moves the checkpoint only; it never makes the log vouch across a break.
    reanchored = running.cli("audit", "reanchor", "--yes")
    assert reanchored.exit_code == 0, reanchored.output
    assert "stay refused" in reanchored.output, reanchored.output
    running.restart()
    assert running.status(tampered.path, recovery) == 200
    assert running.status(tampered.path, boss) == 200
    assert running.status(tampered.path, old_token) == 401
    result = running.cli("audit", "verify")
    assert result.exit_code == 1, result.output
    assert f"{tampered.name}: accepted by the database, but" in result.output
    assert "user recovery" not in result.output
    assert f"user {tampered.tenant}/boss:" not in result.output  # its role is recorded again


def test_an_untouched_chain_refuses_nothing_after_many_writes_from_several_processes(
    two_processes: Running,
) -> None:
    run = two_processes
    plane = run.plane
    tenant_id = plane.create_tenant("acme", "test")
    plane.create_user(tenant_id, "root", Role.ADMIN, "test")
    admin = plane.create_token(tenant_id, "root", "test")[1]
    wait_for(lambda: run.status("/api/v1/users", admin) == 200, "the admin token accepted")

    def issue(i: int) -> str:
        """A user and token made through server i % 2, checked on the other one at once."""
        made_on, checked_on = run.servers[i % 2], run.servers[(i + 1) % 2]
        auth = {"Authorization": f"Bearer {admin}"}
        with httpx.Client(base_url=made_on.url, headers=auth, timeout=30) as client:
            user = client.post("/api/v1/users", json={"name": f"u{i}", "role": "viewer"})
            assert user.status_code == 201, user.text
            token = client.post(f"/api/v1/users/u{i}/tokens", json={"label": f"t{i}"})
            assert token.status_code == 201, token.text
            value = str(token.json()["token"])
            if i % 3 == 0:  # some revocations in between, too
                revoke = client.post(f"/api/v1/tokens/{token.json()['id']}/revoke")
                assert revoke.status_code == 200, revoke.text
                return ""
        assert run.call("/api/v1/devices", value, checked_on).status_code == 200
        return value

    with ThreadPoolExecutor(8) as pool:
        issued = [t for t in pool.map(issue, range(60)) if t]
    for i in range(20):  # this process writes meanwhile, too
        plane.create_user(tenant_id, f"cli{i}", Role.VIEWER, "test")
    assert len(issued) == 40
    for server in run.servers:
        assert all(run.call("/api/v1/devices", t, server).status_code == 200 for t in issued)
    run.restart()
    for server in run.servers:
        assert all(run.call("/api/v1/devices", t, server).status_code == 200 for t in issued)
    assert run.plane.verify_audit() == []
    with run.plane.db.read() as conn:
        assert chainproof.credential_problems(conn, run.plane.key) == []
    assert "refused" not in run.log.read_text()


@pytest.mark.parametrize("isolated_server", BACKENDS, indirect=True)
def test_a_row_replaced_by_one_from_another_chain_under_the_same_key_is_a_break(
    isolated_server: Server, tmp_path: Path
) -> None:
    """The replacement's HMAC verifies (same key), but it does not link to its neighbour."""
    server = isolated_server
    tenant_id = server.plane.create_tenant("acme", "test")
    server.plane.create_user(tenant_id, "ops", Role.OPERATOR, "test")
    token_id, token = server.plane.create_token(tenant_id, "ops", "test")
    server.plane.revoke_token(tenant_id, token_id, "test")
    server.plane.create_user(tenant_id, "later", Role.VIEWER, "test")
    with server.plane.db.engine.begin() as conn:
        seq = conn.execute(
            text("SELECT seq FROM audit_log WHERE action = 'token.revoke'")
        ).scalar_one()

    other = ControlPlane(
        Database(f"sqlite:///{tmp_path}/other.db"), load_or_create_server_key(server.key_file)
    )
    try:
        other.db.migrate()
        for i in range(seq):
            other.create_tenant(f"other-{i}", "test")
        with other.db.engine.begin() as conn:
            foreign = (
                conn.execute(text("SELECT * FROM audit_log WHERE seq = :s"), {"s": seq})
                .mappings()
                .one()
            )
    finally:
        other.db.dispose()
    with server.plane.db.engine.begin() as conn:
        conn.execute(text("DELETE FROM audit_log WHERE seq = :s"), {"s": seq})
        conn.execute(
            text(
                "INSERT INTO audit_log (seq, tenant_id, at, actor, action, target, detail, "
                "prev_hash, row_hash) VALUES (:seq, :tenant_id, :at, :actor, :action, :target, "
                ":detail, :prev_hash, :row_hash)"
            ),
            dict(foreign),
        )
        conn.execute(text("UPDATE tokens SET revoked_at = NULL WHERE id = :id"), {"id": token_id})

    restarted = ControlPlane(
        Database(server.url), load_or_create_server_key(server.key_file), auth_cache_seconds=0
    )
    try:
        with pytest.raises(Unauthorized, match=f"broken at seq {seq} \\(it does not link"):
            restarted.authenticate(token)
        found = [str(p) for p in restarted.verify_audit() if not p.gap]
    finally:
        restarted.db.dispose()
    name = f"token {token_id} (tenant acme, user ops)"
    assert any(p.startswith(f"{name}: accepted by the database, but") for p in found), found
