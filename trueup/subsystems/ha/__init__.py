"""HA (`spec.ha`): virtual addresses held by a VRRP role, through keepalived.

`section` (the document's model: pure data, loaded by the document model
through the catalog) and `subsystem` (keepalived's configuration, observe, plan, execute). Importing the package loads the section
only; `HaSubsystem` is imported on first use, so that parsing a document never
imports the subsystem's implementation nor `trueup.system`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trueup.subsystems.ha.section import HaSection

if TYPE_CHECKING:
    from trueup.subsystems.ha.subsystem import HaSubsystem

__all__ = ["HaSection", "HaSubsystem"]


def __getattr__(name: str) -> object:
    if name == "HaSubsystem":
        from trueup.subsystems.ha.subsystem import HaSubsystem

        return HaSubsystem
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
