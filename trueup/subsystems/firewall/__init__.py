"""nftables firewall (`spec.firewall`): the table `inet trueup`, owned whole by trueup.

`section` (the document's model), `canonical` (facts from nft's JSON),
`risks` (would the ruleset cut management off?) and `subsystem` (observe,
plan, execute). docs/firewall.md describes it for operators. Importing the
package loads the section only (the document model loads it through the
catalog); `FirewallSubsystem` and `FirewallError` are imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trueup.subsystems.firewall.section import FirewallSection

if TYPE_CHECKING:
    from trueup.subsystems.firewall.subsystem import FirewallError, FirewallSubsystem

__all__ = ["FirewallError", "FirewallSection", "FirewallSubsystem"]


def __getattr__(name: str) -> object:
    if name in ("FirewallError", "FirewallSubsystem"):
        from trueup.subsystems.firewall import subsystem

        return getattr(subsystem, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
