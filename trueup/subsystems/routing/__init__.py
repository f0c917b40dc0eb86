"""Dynamic routing (`spec.routing`): BGP, OSPFv2 and OSPFv3, run by FRR.

`section` (the document's model: pure data, loaded by the document model
through the catalog) and `render` (frr.conf from the section) and `subsystem` (observe, plan, execute). Importing the package loads the section
only; `RoutingSubsystem` is imported on first use, so that parsing a document never
imports the subsystem's implementation nor `trueup.system`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trueup.subsystems.routing.section import RoutingSection

if TYPE_CHECKING:
    from trueup.subsystems.routing.subsystem import RoutingSubsystem

__all__ = ["RoutingSection", "RoutingSubsystem"]


def __getattr__(name: str) -> object:
    if name == "RoutingSubsystem":
        from trueup.subsystems.routing.subsystem import RoutingSubsystem

        return RoutingSubsystem
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
