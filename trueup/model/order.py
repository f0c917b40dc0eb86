"""Natural order for what an operator reads: addresses numerically, indexes as numbers.

`203.0.113.20` comes before `203.0.113.100`, `2001:db8::9` before
`2001:db8::10`, and `spec.interfaces[2]` before `spec.interfaces[10]`. Used
wherever lists of addresses or document paths are shown (drift paths, DHCP
leases, audit output). Pure and standard library only (the CLI's fast path
imports it).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from typing import Any

__all__ = ["natural_key", "natural_sorted"]

# An IPv4 address, an IPv6 address (hex groups with at least two colons), or a digit run.
_TOKEN = re.compile(
    r"(?P<v4>(?<![\d.])\d{1,3}(?:\.\d{1,3}){3}(?![\d.]))"
    r"|(?P<v6>(?<![0-9A-Fa-f:])[0-9A-Fa-f]{0,4}(?::[0-9A-Fa-f]{0,4}){2,7}(?![0-9A-Fa-f:]))"
    r"|(?P<num>\d+)"
)


def _address(text: str) -> int | None:
    try:
        return int(ipaddress.ip_address(text))
    except ValueError:
        return None


def natural_key(value: Any) -> tuple[tuple[int, int, str], ...]:
    """A sort key: text in order, addresses and numbers inside it by value."""
    text = "" if value is None else str(value)
    key: list[tuple[int, int, str]] = []
    position = 0
    for match in _TOKEN.finditer(text):
        if match.start() > position:
            key.append((0, 0, text[position : match.start()]))
        token = match.group(0)
        number = _address(token) if match.group("num") is None else int(token)
        if number is None:
            key.append((0, 0, token))
        else:
            family = 6 if match.group("v6") else 4 if match.group("v4") else 0
            # Numbers sort before text, IPv4 before IPv6 at the same place.
            key.append((1 + family, number, token))
        position = match.end()
    if position < len(text):
        key.append((0, 0, text[position:]))
    return tuple(key)


def natural_sorted(values: Iterable[Any]) -> list[Any]:
    return sorted(values, key=natural_key)
