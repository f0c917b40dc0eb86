"""Dashboard sessions: a sealed, HttpOnly, SameSite=Strict cookie and its CSRF token.

The cookie holds the bearer token encrypted and authenticated with a key
derived from the server key (AES-GCM), so every server process of a
`--workers N` deployment opens it and the token is never in a page, a URL or
readable by scripts. Each request re-authenticates the token through the same
`Authenticator` as the JSON API: a revoked token or a lowered role takes
effect on the next page. Every form that changes something carries the
session's CSRF token, checked against the cookie in constant time.

Signing in has no session yet, so the sign-in form carries a pre-session
token instead (`LoginTokens`): rendering /ui/login sets a short-lived
HttpOnly, SameSite=Strict cookie holding a random nonce and its expiry, and
puts the HMAC of that cookie (a key derived from the server key) in a hidden
field. A sign-in is accepted only with both, and only when the field is the
HMAC of the cookie that came with it: a page on another site can neither read
the field nor, without the server key, make a pair that matches. (A pair the
server issued to the attacker is valid in any browser it is planted in; the
Origin / Sec-Fetch-Site checks in sameorigin.py refuse such a cross-site post.)
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

__all__ = [
    "COOKIE",
    "LOGIN_COOKIE",
    "LOGIN_COOKIE_PATH",
    "LOGIN_SECONDS",
    "SESSION_SECONDS",
    "LoginTokens",
    "Session",
    "Sessions",
]

COOKIE = "trueup_session"
SESSION_SECONDS = 8 * 3600
_AAD = b"trueup-dashboard-session/1"
# The sign-in form's pre-session token: sent only to /ui/login, valid for an hour.
LOGIN_COOKIE = "trueup_login"
LOGIN_COOKIE_PATH = "/ui/login"
LOGIN_SECONDS = 3600


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


class LoginTokens:
    """The sign-in form's pre-session token: a cookie `NONCE.EXPIRY` and the hidden
    field `HMAC(cookie)`, a double submit bound to the server key."""

    def __init__(self, key: ServerKey) -> None:
        self._key = key.derive("dashboard-login")

    def issue(self, now: float | None = None) -> tuple[str, str]:
        """A new (cookie, field) pair."""
        expires = int((now or time.time()) + LOGIN_SECONDS)
        cookie = f"{secrets.token_urlsafe(24)}.{expires}"
        return cookie, self._field(cookie)

    def field_for(self, cookie: str | None, now: float | None = None) -> str | None:
        """The field that goes with a cookie still valid for a few minutes (so a page
        reload keeps the form of another tab working); None otherwise."""
        if not self._well_formed(cookie, (now or time.time()) + 300):
            return None
        return self._field(cookie or "")

    def check(self, cookie: str | None, field: str | None, now: float | None = None) -> bool:
        if not field or not self._well_formed(cookie, now or time.time()):
            return False
        return hmac.compare_digest(self._field(cookie or ""), field)

    def _field(self, cookie: str) -> str:
        digest = hmac.new(self._key, cookie.encode(), "sha256").digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    @staticmethod
    def _well_formed(cookie: str | None, now: float) -> bool:
        if not cookie or len(cookie) > 128:
            return False
        _nonce, _sep, expiry = cookie.rpartition(".")
        return bool(_nonce) and expiry.isascii() and expiry.isdigit() and int(expiry) > now
