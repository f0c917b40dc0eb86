"""Bearer tokens: 32 random bytes, shown once, stored only as a SHA-256 hash.

The hash is `trueup.model.digests.token_hash` (re-exported here as `hash_token`),
the one token hash in trueup.

A token's prefix names its kind so a leaked one is recognisable in logs and
scanners: `tu_u_` (user), `tu_d_` (device credential), `tu_e_` (one-time
enrollment token). The prefix is not trusted: the stored row decides.
"""

from __future__ import annotations

import hmac
import secrets
from enum import StrEnum

from trueup.model.digests import token_hash as hash_token

__all__ = ["Role", "TokenKind", "hash_token", "new_token", "role_at_least", "tokens_equal"]


class Role(StrEnum):
    VIEWER = "viewer"
    OPERATOR = "operator"
    ADMIN = "admin"


_RANK = {Role.VIEWER: 1, Role.OPERATOR: 2, Role.ADMIN: 3}


def role_at_least(role: Role, required: Role) -> bool:
    return _RANK[role] >= _RANK[required]


class TokenKind(StrEnum):
    USER = "user"
    DEVICE = "device"
    ENROLLMENT = "enrollment"


_PREFIX = {TokenKind.USER: "tu_u_", TokenKind.DEVICE: "tu_d_", TokenKind.ENROLLMENT: "tu_e_"}


def new_token(kind: TokenKind) -> str:
    return _PREFIX[kind] + secrets.token_urlsafe(32)


def tokens_equal(stored_hash: str, presented: str) -> bool:
    """Constant-time comparison of a stored hash with a presented token."""
    return hmac.compare_digest(stored_hash, hash_token(presented))
