"""What the delivery log says about a failed attempt: an error class, never socket text.

A raw error ("[Errno 111] Connection refused", a resolver's message, a TLS
library's) tells a tenant admin more about the server's network than whether
their receiver works; the log keeps only the class:

    refused by policy: …     the target policy refused the URL or what it resolves to
    DNS: …                   the name does not resolve
    connection refused       nothing listens at the vetted address and port
    timed out                connecting, sending or waiting for the answer
    TLS: …                   the handshake failed, or the certificate was not accepted
    unreachable              no route to the vetted address
    connection closed        the receiver closed the connection without an answer
    HTTP <status>            the receiver answered, but not with a 2xx
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator

import httpx

__all__ = ["DNS_FAILURE", "POLICY", "failure_class", "status_class"]

POLICY = "refused by policy"
DNS_FAILURE = "DNS: the name does not resolve"


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        pending.extend((current.__cause__, current.__context__))


def failure_class(exc: BaseException) -> str:
    """The class of a request that got no answer."""
    chain = list(_chain(exc))
    if any(isinstance(e, ssl.SSLCertVerificationError) for e in chain):
        return "TLS: the certificate was not accepted for the name"
    if any(isinstance(e, ssl.SSLError) for e in chain):
        return "TLS: the handshake failed"
    if isinstance(exc, httpx.TimeoutException) or any(isinstance(e, TimeoutError) for e in chain):
        return "timed out"
    if any(isinstance(e, ConnectionRefusedError) for e in chain):
        return "connection refused"
    if any(isinstance(e, socket.gaierror) for e in chain):
        return DNS_FAILURE
    if isinstance(exc, httpx.ConnectError):
        return "unreachable"
    if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)):
        return "connection closed"
    return "request failed"


def status_class(status: int) -> str | None:
    """None for a 2xx answer (delivered); otherwise what the log says."""
    if 200 <= status < 300:
        return None
    if 300 <= status < 400:
        return f"HTTP {status} (redirects are not followed)"
    return f"HTTP {status}"
