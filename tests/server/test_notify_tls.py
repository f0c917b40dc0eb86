"""Webhooks over TLS to a pinned address: the server name sent is the target's name.

A TLS receiver on 127.0.0.1 with a self-signed certificate for
`hooks.example.net`; the notifier's resolver seam maps that name to 127.0.0.1
(allowlisted). The server does not trust the certificate, so the attempt fails
as a TLS error class, and the receiver saw the name (SNI), not the address.
"""

from __future__ import annotations

import datetime
import json
import socket
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.server.conftest import Server
from tests.server.test_notify import BASE, DRIFT, PARAMS, SECRET, deliveries, report, wait_for

NAME = "hooks.example.net"


def _certificate(tmp_path: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, NAME)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(NAME)]), critical=False)
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


class TlsReceiver:
    def __init__(self, tmp_path: Path) -> None:
        cert, key = _certificate(tmp_path)
        self.server_names: list[str | None] = []
        self.requests = 0
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        context.sni_callback = lambda _sock, name, _ctx: self.server_names.append(name)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                receiver.requests += 1
                self.send_response(204)
                self.end_headers()

            def log_message(self, *_args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def tls_receiver(tmp_path: Path) -> Iterator[TlsReceiver]:
    receiver = TlsReceiver(tmp_path)
    yield receiver
    receiver.stop()


@pytest.mark.parametrize("isolated_server", PARAMS, indirect=True)
def test_tls_to_the_pinned_address_sends_the_name_and_logs_a_tls_class(
    isolated_server: Server, tls_receiver: TlsReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = isolated_server
    tenant = server.tenant("ps", devices=("edge-s",))

    def resolve(host: str, port: int) -> list[str]:
        if host != NAME:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return ["127.0.0.1"]

    monkeypatch.setattr(server.plane.notifier, "resolve", resolve)
    admin = tenant.auth("admin")
    allow = server.client.put(
        f"{BASE}/allowlist", json={"entries": ["127.0.0.1/32"]}, headers=admin
    )
    assert allow.status_code == 200, allow.text
    target = {"name": "tls", "url": f"https://{NAME}:{tls_receiver.port}/hook", "secret": SECRET}
    assert server.client.post(f"{BASE}/targets", json=target, headers=admin).status_code == 201
    rule = {"name": "all", "target": "tls"}
    assert server.client.post(f"{BASE}/rules", json=rule, headers=admin).status_code == 201
    report(server, tenant, "edge-s", DRIFT)

    dead = wait_for(lambda: deliveries(server, tenant, "dead"), "the dead letter")
    errors = [a["error"] for a in dead[0]["log"]]
    assert errors == ["TLS: the certificate was not accepted for the name"] * len(errors)
    assert len(errors) == 3
    assert tls_receiver.requests == 0
    assert set(tls_receiver.server_names) == {NAME}
    assert "CERTIFICATE_VERIFY_FAILED" not in json.dumps(dead)
