"""Address and name types shared by every section of the desired-state document.

Values are kept as canonical strings (what the kernel reports back), so that
desired and observed facts compare with plain equality.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any

from pydantic import BeforeValidator

from trueup.model.limits import quoted

__all__ = ["IfName", "IpAddress", "IpNetwork", "IpPrefix", "family_of"]

_IFNAME = re.compile(r"^[A-Za-z0-9_.\-@]{1,15}\Z")


def _prefix(value: Any) -> str:
    """An address with its prefix length, as put on an interface (`192.0.2.1/24`)."""
    if not isinstance(value, str) or "/" not in value:
        raise ValueError("not an IPv4/IPv6 prefix (expected ADDRESS/LENGTH, e.g. 192.0.2.1/24)")
    try:
        return str(ipaddress.ip_interface(value.strip()))
    except ValueError:
        raise ValueError(
            f"not an IPv4/IPv6 prefix: {quoted(value)} (expected ADDRESS/LENGTH, e.g. 192.0.2.1/24)"
        ) from None


def _network(value: Any) -> str:
    """A destination network (`203.0.113.0/24`, `default`); host bits must be zero."""
    if not isinstance(value, str):
        raise ValueError("not an IPv4/IPv6 network (expected NETWORK/LENGTH or 'default')")
    text = value.strip()
    if text == "default":
        text = "0.0.0.0/0"
    elif text == "default6":
        text = "::/0"
    try:
        return str(ipaddress.ip_network(text, strict=True))
    except ValueError as exc:
        raise ValueError(f"not an IPv4/IPv6 network: {quoted(value)} ({exc})") from None


def _address(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("not an IPv4/IPv6 address")
    try:
        return str(ipaddress.ip_address(value.strip()))
    except ValueError:
        raise ValueError(f"not an IPv4/IPv6 address: {quoted(value)}") from None


def _ifname(value: Any) -> str:
    if not isinstance(value, str) or not _IFNAME.match(value):
        raise ValueError(
            "not an interface name (1-15 characters: letters, digits, '_', '.', '-', '@')"
        )
    return value


IpPrefix = Annotated[str, BeforeValidator(_prefix)]
IpNetwork = Annotated[str, BeforeValidator(_network)]
IpAddress = Annotated[str, BeforeValidator(_address)]
IfName = Annotated[str, BeforeValidator(_ifname)]


def family_of(value: str) -> int:
    """4 or 6 for an address, prefix or network string."""
    return ipaddress.ip_interface(value).version
