"""DHCP (`spec.dhcp`): Kea DHCPv4/DHCPv6 and the allocator fence.

`section` (the document's model: pure data, loaded by the document model
through the catalog) and `keaconfig` (Kea's configuration from the section), `allocator` (the fence as Kea sees it), `changes` (what differs in a foreign configuration) and `subsystem` (observe, plan, execute). Importing the package loads the section
only; `DhcpSubsystem` is imported on first use, so that parsing a document never
imports the subsystem's implementation nor `trueup.system`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trueup.subsystems.dhcp.section import DhcpSection

if TYPE_CHECKING:
    from trueup.subsystems.dhcp.subsystem import DhcpSubsystem

__all__ = ["DhcpSection", "DhcpSubsystem"]


def __getattr__(name: str) -> object:
    if name == "DhcpSubsystem":
        from trueup.subsystems.dhcp.subsystem import DhcpSubsystem

        return DhcpSubsystem
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
