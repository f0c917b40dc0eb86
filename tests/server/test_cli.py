"""`trueup server …` commands, including `server run` as a real process (with TLS)."""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from typer.testing import CliRunner

from tests.server.conftest import BACKENDS, create_pg_database, drop_pg_database, free_port
from trueup.agent.cpclient import ControlPlaneClient, ControlPlaneRefused
from trueup.cli.server import server_app
from trueup.server.db import Database
from trueup.server.tables import metadata

CLI = [sys.executable, "-m", "trueup.cli.server"]


def invoke(*args: str):
    return CliRunner().invoke(server_app, list(args))


def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "trueup test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


def test_server_run_with_tls_enrollment_pins_the_certificate(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/server.db"
    cert, key = self_signed(tmp_path)
    assert invoke("tenant", "create", "acme", "--db", db).exit_code == 0
    token = invoke(
        "token", "create", "--tenant", "acme", "--user", "alice", "--role", "operator", "--db", db
    ).output.strip()
    assert token.startswith("tu_u_")
    port = free_port()
    url = f"https://127.0.0.1:{port}"
    bundle = tmp_path / "edge.json"
    enrolled = invoke(
        "device",
        "enroll",
        "--tenant",
        "acme",
        "--device",
        "edge-01",
        "--url",
        url,
        "--out",
        str(bundle),
        "--tls-cert",
        str(cert),
        "--db",
        db,
    )
    assert enrolled.exit_code == 0, enrolled.output
    assert oct(bundle.stat().st_mode & 0o777) == "0o600"
    content = json.loads(bundle.read_text())
    assert content["server_certificate_sha256"].startswith("sha256:")
    process = subprocess.Popen(
        [
            *CLI,
            "run",
            "--db",
            db,
            "--listen",
            f"127.0.0.1:{port}",
            "--tls-cert",
            str(cert),
            "--tls-key",
            str(key),
        ],
        env=os.environ.copy(),
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/healthz", verify=False, timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline and process.poll() is None
            time.sleep(0.1)
        # A bundle whose pin does not match is refused before the token is sent.
        tampered = tmp_path / "tampered.json"
        tampered.write_text(json.dumps({**content, "server_certificate_sha256": "sha256:00"}))
        with pytest.raises(ControlPlaneRefused, match="pins"):
            ControlPlaneClient(None, tmp_path / "x").exchange_enrollment(tampered)
        client = ControlPlaneClient(None, tmp_path / "credential")
        client.exchange_enrollment(bundle)
        assert (tmp_path / "credential.server.pem").exists()
        device = ControlPlaneClient(url, tmp_path / "credential")
        assert device.wait_for_desired(0, 0) is None
        device.close()
        listed = httpx.get(
            url + "/api/v1/devices",
            headers={"Authorization": f"Bearer {token}"},
            verify=str(cert),
        )
        assert listed.json()["devices"][0]["device"] == "edge-01"
    finally:
        process.terminate()
        process.wait(10)  # exits promptly even with idle TLS keep-alive connections


def test_bad_input_is_named_and_changes_nothing(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/server.db"
    bad_url = invoke("tenant", "create", "acme", "--db", "mysql://x")
    assert bad_url.exit_code == 1 and "unsupported database URL" in bad_url.output
    assert invoke("tenant", "create", "acme", "--db", db).exit_code == 0
    duplicate = invoke("tenant", "create", "acme", "--db", db)
    assert duplicate.exit_code == 1 and "already exists" in duplicate.output
    missing = invoke("user", "create", "--tenant", "nope", "--user", "a", "--db", db)
    assert missing.exit_code == 1 and "tenant 'nope' does not exist" in missing.output
    bad_device = invoke(
        "device",
        "enroll",
        "--tenant",
        "acme",
        "--device",
        "bad/name",
        "--url",
        "http://x",
        "--out",
        str(tmp_path / "b.json"),
        "--db",
        db,
    )
    assert bad_device.exit_code == 1 and "not a valid device name" in bad_device.output
    assert not (tmp_path / "b.json").exists()
    pg_without_key = invoke("tenant", "create", "x", "--db", "postgresql://postgres@127.0.0.1/x")
    assert pg_without_key.exit_code == 1 and "--key-file" in pg_without_key.output
    bad_listen = invoke("run", "--db", db, "--listen", "nowhere")
    assert bad_listen.exit_code == 1 and "HOST:PORT" in bad_listen.output
    assert invoke("audit", "verify", "--db", db).exit_code == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_migrations_create_exactly_the_declared_schema(backend: str, tmp_path: Path) -> None:
    name = None
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path}/m.db"
    else:
        name = create_pg_database()
        url = f"postgresql://postgres@127.0.0.1:5432/{name}"
    database = Database(url)
    try:
        database.migrate()
        database.migrate()  # idempotent
        with database.engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), metadata)
        assert diff == []
    finally:
        database.dispose()
        if name:
            drop_pg_database(name)
