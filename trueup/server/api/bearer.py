"""The bearer credential in an `Authorization` header (RFC 9110 §11, RFC 6750 §2.1).

Called by the JSON API's authentication (`context`) and by the enrollment
exchange (`routes.agents`). The scheme is case-insensitive (`Bearer`,
`bearer`, `BEARER`); one or more spaces separate it from the credential, and
the optional whitespace around a field value is ignored. The credential is a
`token68` (letters, digits, `-._~+/`, then `=` padding). Anything else —
another scheme, a tab or nothing after the scheme, two credentials — is no
bearer credential (the caller answers 401 with `WWW-Authenticate: Bearer`).
"""

from __future__ import annotations

import re

__all__ = ["bearer_token"]

# credentials = auth-scheme 1*SP token68, with OWS (SP / HTAB) around the field value.
_CREDENTIALS = re.compile(r"[ \t]*([!#$%&'*+.^_`|~0-9A-Za-z-]+) +([A-Za-z0-9\-._~+/]+=*)[ \t]*")


def bearer_token(authorization: str | None) -> str | None:
    """The credential of a `Bearer` Authorization header value; None for anything else."""
    if not authorization:
        return None
    match = _CREDENTIALS.fullmatch(authorization)
    if match is None or match.group(1).lower() != "bearer":
        return None
    return match.group(2)
