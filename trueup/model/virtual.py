"""The HA virtual addresses a document names (`spec.ha.vips[*].addresses`).

Pure data, read generically from `document.spec` so that the scope builder,
the management listener and status can tell a virtual address apart from the
addresses the `addresses` and `management` subsystems own, without importing
the HA subsystem. A virtual address is compared by its host part: keepalived
adds it with the prefix length the document gives, and an interface may hold
the same host with another length only by mistake.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["host_of", "is_virtual", "virtual_addresses", "virtual_hosts"]


def host_of(prefix: str) -> str:
    """`203.0.113.254/24` → `203.0.113.254` (IPv6 lower-cased as the kernel reports it)."""
    return prefix.split("/", 1)[0].lower()


def virtual_addresses(document: Any) -> frozenset[str]:
    """Every `ADDRESS/LEN` under `spec.ha.vips` of `document` (a DeviceState), or none.

    The role does not matter: a virtual address is never the `addresses` or
    `management` subsystem's, whichever node holds it.
    """
    if document is None:
        return frozenset()
    section = document.spec.section("ha")
    if section is None:
        return frozenset()
    out: set[str] = set()
    for vip in getattr(section, "vips", ()) or ():
        out.update(str(a) for a in getattr(vip, "addresses", ()) or ())
    return frozenset(out)


def virtual_hosts(prefixes: Iterable[str]) -> frozenset[str]:
    return frozenset(host_of(p) for p in prefixes)


def is_virtual(address: str, prefixes: Iterable[str]) -> bool:
    """Whether `address` (`A` or `A/LEN`) is one of the virtual `prefixes` (by host)."""
    return host_of(address) in virtual_hosts(prefixes)
