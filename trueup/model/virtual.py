"""The HA virtual addresses a document names (`spec.ha.vips[*].addresses`).

Pure data, read from `document.spec` as a view of the HA section
(`trueup.model.sections.section_view`: the fields it needs, as a cross-section
check reads another section) so that the scope builder, the management
listener and status can tell a virtual address apart from the addresses the
`addresses` and `management` subsystems own, without importing the HA
subsystem. A virtual address is compared by its host part: keepalived
adds it with the prefix length the document gives, and an interface may hold
the same host with another length only by mistake.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from pydantic import BaseModel

from trueup.model.sections import section_view

if TYPE_CHECKING:
    from trueup.model.document import DeviceState

__all__ = ["HaVirtual", "host_of", "is_virtual", "virtual_addresses", "virtual_hosts"]


class _VipAddresses(BaseModel):
    addresses: list[str] = []


class HaVirtual(BaseModel):
    """What this module reads of `spec.ha`: each virtual address group's addresses."""

    vips: list[_VipAddresses] = []


def host_of(prefix: str) -> str:
    """`203.0.113.254/24` → `203.0.113.254` (IPv6 lower-cased as the kernel reports it)."""
    return prefix.split("/", 1)[0].lower()


def virtual_addresses(document: DeviceState | None) -> frozenset[str]:
    """Every `ADDRESS/LEN` under `spec.ha.vips` of `document`, or none.

    The role does not matter: a virtual address is never the `addresses` or
    `management` subsystem's, whichever node holds it.
    """
    if document is None:
        return frozenset()
    section = section_view(document.spec, "ha", HaVirtual)
    if section is None:
        return frozenset()
    return frozenset(address for vip in section.vips for address in vip.addresses)


def virtual_hosts(prefixes: Iterable[str]) -> frozenset[str]:
    return frozenset(host_of(p) for p in prefixes)


def is_virtual(address: str, prefixes: Iterable[str]) -> bool:
    """Whether `address` (`A` or `A/LEN`) is one of the virtual `prefixes` (by host)."""
    return host_of(address) in virtual_hosts(prefixes)
