"""Host names and addresses as the resolver reads them, for the webhook target policy.

IPv4 in every spelling `inet_aton` accepts (`127.1`, `2130706433`, `0x7f.1`,
`0177.0.0.1`), a trailing dot, IDNA folding (`ⓛocalhost` is `localhost`, and
the ideographic full stops are dots), IPv6 with a zone. The policy judges the
host this returns, never the spelling it was given.
"""

from __future__ import annotations

import ipaddress
import re
import unicodedata

import idna

__all__ = ["Address", "inet_aton", "parse_host"]

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
_LABEL = re.compile(r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?")
_DOTS = str.maketrans({"\u3002": ".", "\uff0e": ".", "\uff61": "."})


def inet_aton(text: str) -> ipaddress.IPv4Address | None:
    """IPv4 as the C resolver reads it: 1-4 parts, each decimal, octal (0…) or hex (0x…)."""
    parts = text.split(".")
    if not 1 <= len(parts) <= 4:
        return None
    values = []
    for part in parts:
        if re.fullmatch(r"0[xX][0-9a-fA-F]+", part):
            values.append(int(part[2:], 16))
        elif re.fullmatch(r"0[0-7]*", part):
            values.append(int(part, 8))
        elif re.fullmatch(r"[1-9][0-9]*", part):
            values.append(int(part))
        else:
            return None
    *leading, last = values
    if any(v > 255 for v in leading) or last >= 256 ** (5 - len(values)):
        return None
    value = last
    for index, v in enumerate(leading):
        value |= v << (8 * (3 - index))
    return ipaddress.IPv4Address(value)


def parse_host(host: str) -> tuple[str, Address | None]:
    """The host as the resolver sees it: (lower-case ASCII name without a trailing dot,
    the address it spells or None). Raises ValueError for a host no resolver would take."""
    text = host.strip("[]") if host.startswith("[") else host
    if ":" in text:  # IPv6, perhaps with a zone (fe80::1%25eth0)
        literal = text.replace("%25", "%", 1)
        return literal.lower(), ipaddress.IPv6Address(literal.split("%")[0])
    folded = unicodedata.normalize("NFKC", text).translate(_DOTS)
    if not folded.isascii():
        folded = idna.uts46_remap(folded, std3_rules=False, transitional=False)
        folded = idna.encode(folded, uts46=False).decode("ascii")
    name = folded.lower()
    name = name[:-1] if name.endswith(".") else name
    v4 = inet_aton(name)
    if v4 is not None:
        return str(v4), v4
    if not name or len(name) > 253 or not all(_LABEL.fullmatch(p) for p in name.split(".")):
        raise ValueError(f"{host!r} is not a valid host name")
    return name, None
