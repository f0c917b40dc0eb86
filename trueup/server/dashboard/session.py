"""Dashboard sessions: a sealed, HttpOnly, SameSite=Strict cookie and its CSRF token.

The cookie holds the bearer token encrypted and authenticated with a key
derived from the server key (AES-GCM), so every server process of a
`--workers N` deployment opens it and the token is never in a page, a URL or
readable by scripts. Each request re-authenticates the token through the same
`Authenticator` as the JSON API: a revoked token or a lowered role takes
effect on the next page. Every form that changes something carries the
session's CSRF token, checked against the cookie in constant time.
"""

from __future__ import annotations

import base64
import hmac
import json
import os
import secrets
import time
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from trueup.server.keys import ServerKey

__all__ = ["COOKIE", "SESSION_SECONDS", "Session", "Sessions"]

COOKIE = "trueup_session"
SESSION_SECONDS = 8 * 3600
_AAD = b"trueup-dashboard-session/1"


@dataclass(frozen=True)
class Session:
    token: str
    csrf: str
    expires_at: float

    def csrf_ok(self, presented: str | None) -> bool:
        return bool(presented) and hmac.compare_digest(self.csrf, presented or "")


class Sessions:
    def __init__(self, key: ServerKey) -> None:
        self._aead = AESGCM(key.derive("dashboard-session"))

    def seal(self, token: str, now: float | None = None) -> tuple[str, Session]:
        session = Session(
            token=token,
            csrf=secrets.token_urlsafe(24),
            expires_at=(now or time.time()) + SESSION_SECONDS,
        )
        body = json.dumps({"t": session.token, "c": session.csrf, "e": session.expires_at})
        nonce = os.urandom(12)
        sealed = nonce + self._aead.encrypt(nonce, body.encode(), _AAD)
        return base64.urlsafe_b64encode(sealed).decode().rstrip("="), session

    def open(self, cookie: str | None, now: float | None = None) -> Session | None:
        """The session in a cookie; None when absent, forged, damaged or expired."""
        if not cookie or len(cookie) > 4096:
            return None
        try:
            raw = base64.urlsafe_b64decode(cookie + "=" * (-len(cookie) % 4))
            body = json.loads(self._aead.decrypt(raw[:12], raw[12:], _AAD))
            session = Session(
                token=str(body["t"]), csrf=str(body["c"]), expires_at=float(body["e"])
            )
        except (ValueError, InvalidTag, KeyError, TypeError):
            return None
        if session.expires_at < (now or time.time()):
            return None
        return session
