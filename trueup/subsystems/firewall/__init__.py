"""nftables firewall (`spec.firewall`): the table `inet trueup`, owned whole by trueup.

`section` (the document's model), `canonical` (facts from nft's JSON),
`risks` (would the ruleset cut management off?) and `subsystem` (observe,
plan, execute). docs/firewall.md describes it for operators.
"""

from trueup.subsystems.firewall.section import FirewallSection
from trueup.subsystems.firewall.subsystem import FirewallError, FirewallSubsystem

__all__ = ["FirewallError", "FirewallSection", "FirewallSubsystem"]
