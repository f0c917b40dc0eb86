"""WireGuard (`spec.wireguard`): interfaces and peers.

`section` (the document's model: pure data, loaded by the document model
through the catalog) and `resolution` (peer endpoints by name), `state` (what the kernel holds) and `subsystem` (observe, plan, execute). Importing the package loads the section
only; `WireguardSubsystem` is imported on first use, so that parsing a document never
imports the subsystem's implementation nor `trueup.system`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trueup.subsystems.wireguard.section import WireguardSection

if TYPE_CHECKING:
    from trueup.subsystems.wireguard.subsystem import WireguardSubsystem

__all__ = ["WireguardSection", "WireguardSubsystem"]


def __getattr__(name: str) -> object:
    if name == "WireguardSubsystem":
        from trueup.subsystems.wireguard.subsystem import WireguardSubsystem

        return WireguardSubsystem
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
