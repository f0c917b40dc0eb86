"""Every subsystem trueup ships, by name: adding a subsystem is one line here.

Pure data — `module:Class` strings — so that the document model can find the
sections of `spec` that subsystems own without importing them statically
(`trueup.model.sections` loads them by name the first time it meets a
section it does not know), and `trueup.subsystems.registry` builds the
agent's subsystems from the same list. Extra subsystems (`agent run
--plugin MODULE:FACTORY`) register themselves when loaded.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["SUBSYSTEMS", "load"]

SUBSYSTEMS: tuple[str, ...] = (
    "trueup.subsystems.management:ManagementSubsystem",
    "trueup.subsystems.links:LinksSubsystem",
    "trueup.subsystems.addresses:AddressesSubsystem",
    "trueup.subsystems.routes:RoutesSubsystem",
    "trueup.subsystems.sysctl:SysctlSubsystem",
    "trueup.subsystems.firewall:FirewallSubsystem",
    "trueup.subsystems.dhcp:DhcpSubsystem",
    "trueup.subsystems.dns:DnsSubsystem",
    "trueup.subsystems.ha:HaSubsystem",
    "trueup.subsystems.proxy:ProxySubsystem",
    "trueup.subsystems.wireguard:WireguardSubsystem",
)


def load(reference: str) -> Any:
    """The object `module:attribute` names."""
    module, _, attribute = reference.partition(":")
    return getattr(importlib.import_module(module), attribute)
