"""Every subsystem trueup ships, by name: adding a subsystem is one line here.

Pure data — `module:attribute` strings. `SUBSYSTEMS` names each subsystem's
class: `trueup.subsystems.registry` builds the agent's subsystems from it.
`SECTIONS` names the sections of `spec` that subsystems own, each a
`trueup.model.sections.Section` in a light module of its own
(`trueup/subsystems/NAME/section.py`): the document model loads them by name
the first time it meets a section it does not know, and loading them imports
no `trueup.system` module and no subsystem's implementation, so whoever
parses a document (CLI, agent, control plane) imports only pure data. A
subsystem that owns a section has a line in each. Extra subsystems (`agent
run --plugin MODULE:FACTORY`) register themselves when loaded.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["SECTIONS", "SUBSYSTEMS", "load"]

SUBSYSTEMS: tuple[str, ...] = (
    "trueup.subsystems.management:ManagementSubsystem",
    "trueup.subsystems.links:LinksSubsystem",
    "trueup.subsystems.addresses:AddressesSubsystem",
    "trueup.subsystems.routes:RoutesSubsystem",
    "trueup.subsystems.sysctl.subsystem:SysctlSubsystem",
    "trueup.subsystems.firewall.subsystem:FirewallSubsystem",
    "trueup.subsystems.dhcp.subsystem:DhcpSubsystem",
    "trueup.subsystems.dns.subsystem:DnsSubsystem",
    "trueup.subsystems.ha.subsystem:HaSubsystem",
    "trueup.subsystems.proxy.subsystem:ProxySubsystem",
    "trueup.subsystems.wireguard.subsystem:WireguardSubsystem",
    "trueup.subsystems.routing.subsystem:RoutingSubsystem",
    "trueup.subsystems.gateways.subsystem:GatewaysSubsystem",
)

SECTIONS: tuple[str, ...] = (
    "trueup.subsystems.sysctl.section:SECTION",
    "trueup.subsystems.firewall.section:SECTION",
    "trueup.subsystems.dhcp.section:SECTION",
    "trueup.subsystems.dns.section:SECTION",
    "trueup.subsystems.ha.section:SECTION",
    "trueup.subsystems.proxy.section:SECTION",
    "trueup.subsystems.wireguard.section:SECTION",
    "trueup.subsystems.routing.section:SECTION",
    "trueup.subsystems.gateways.section:SECTION",
)


def load(reference: str) -> Any:
    """The object `module:attribute` names."""
    module, _, attribute = reference.partition(":")
    return getattr(importlib.import_module(module), attribute)
