"""SHA-256 digests: one implementation for tokens, certificates and documents' bytes.

Two presentations of the same digest:

    sha256_hex(data)      64 hex digits; what a column named for its hash stores
                          (the control plane's `tokens.token_hash`)
    sha256_digest(data)   "sha256:<64 hex>"; the labelled form trueup shows and
                          keeps in files (document digests, certificate
                          fingerprints, the agent's API token hashes)

`token_hash` is the one way to hash a bearer token: a token is 32 random bytes,
so a plain SHA-256 is enough (no salt or stretching needed), and it must be
deterministic so the stored hash can be looked up by index. Pure; no I/O.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

__all__ = ["canonical_json", "json_digest", "sha256_digest", "sha256_hex", "token_hash"]

_LABEL = "sha256:"


def sha256_hex(data: bytes | str) -> str:
    """The SHA-256 of `data` (text is UTF-8 encoded) as 64 hex digits."""
    blob = data.encode() if isinstance(data, str) else data
    return hashlib.sha256(blob).hexdigest()


def sha256_digest(data: bytes | str) -> str:
    """The SHA-256 of `data` in trueup's labelled form, `sha256:<64 hex>`."""
    return _LABEL + sha256_hex(data)


def token_hash(token: str) -> str:
    """What is stored for a bearer token: 64 hex digits (`sha256_digest` gives it labelled)."""
    return sha256_hex(token)


def canonical_json(value: Any) -> bytes:
    """The one canonical JSON encoding trueup hashes: sorted keys, no spaces, UTF-8."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()


def json_digest(value: Any) -> str:
    """`sha256:<hex>` of `canonical_json(value)`: documents, revisions, observations."""
    return sha256_digest(canonical_json(value))
