"""Secrets in a document: only references may be archived, never values in clear.

Who uses this: `trueup backup create` (refuses to write a secret in clear)
and `trueup.backup.analysis` (refuses an archive holding one). trueup/v1
documents hold no secret values today: keys (WireGuard, TSIG, API tokens)
are named by reference (`{secret_ref: NAME}` or a string `secret:NAME`),
resolved on the router. This check makes that a guarantee for archives:
any key whose name says it is secret must hold a reference. Pure.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["is_reference", "is_secret_key", "secrets_in_clear"]

_SECRET_KEY = re.compile(r"(secret|password|passphrase|private[_-]?key|psk|token)", re.IGNORECASE)


def is_secret_key(key: object) -> bool:
    """A key whose name says its value is secret (`private_key`, `token`, `psk`, …)."""
    return key != "secret_ref" and bool(_SECRET_KEY.search(str(key)))


def is_reference(value: Any) -> bool:
    """A secret reference: `{"secret_ref": NAME}` or the string `secret:NAME`."""
    if isinstance(value, dict):
        return set(value) == {"secret_ref"} and isinstance(value["secret_ref"], str)
    return isinstance(value, str) and value.startswith("secret:")


def secrets_in_clear(document: Any, path: str = "") -> list[tuple[str, str]]:
    """(path, what) for every value under a secret-sounding key that is not a reference."""
    out: list[tuple[str, str]] = []
    if isinstance(document, dict):
        for key, value in document.items():
            where = f"{path}.{key}" if path else str(key)
            if key == "secret_ref":
                continue
            if _SECRET_KEY.search(str(key)) and value not in (None, "", [], {}):
                if not is_reference(value):
                    out.append((where, "a secret value in clear"))
                continue
            out.extend(secrets_in_clear(value, where))
    elif isinstance(document, list):
        for i, value in enumerate(document):
            out.extend(secrets_in_clear(value, f"{path}[{i}]"))
    return out
