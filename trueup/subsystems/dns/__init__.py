"""DNS (`spec.dns`): a local zone served by Knot DNS.

`section` (the document's model: pure data, loaded by the document model
through the catalog) and `records` (records as canonical text, and those the leases give) and `subsystem` (observe, plan, execute). Importing the package loads the section
only; `DnsSubsystem` is imported on first use, so that parsing a document never
imports the subsystem's implementation nor `trueup.system`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trueup.subsystems.dns.section import DnsSection

if TYPE_CHECKING:
    from trueup.subsystems.dns.subsystem import DnsSubsystem

__all__ = ["DnsSection", "DnsSubsystem"]


def __getattr__(name: str) -> object:
    if name == "DnsSubsystem":
        from trueup.subsystems.dns.subsystem import DnsSubsystem

        return DnsSubsystem
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
