"""Kernel parameters (`spec.sysctl`): the worked example of adding a subsystem.

`section` (the document's model: pure data, loaded by the document model
through the catalog) and `subsystem` (observe, plan, execute). Importing the package loads the section
only; `SysctlSubsystem` is imported on first use, so that parsing a document never
imports the subsystem's implementation nor `trueup.system`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trueup.subsystems.sysctl.section import SysctlSection

if TYPE_CHECKING:
    from trueup.subsystems.sysctl.subsystem import SysctlSubsystem

__all__ = ["SysctlSection", "SysctlSubsystem"]


def __getattr__(name: str) -> object:
    if name == "SysctlSubsystem":
        from trueup.subsystems.sysctl.subsystem import SysctlSubsystem

        return SysctlSubsystem
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
