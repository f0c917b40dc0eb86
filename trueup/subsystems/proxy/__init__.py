"""Reverse proxies (`spec.proxies`): HAProxy frontends and backends.

`section` (the document's model: pure data, loaded by the document model
through the catalog) and `subsystem` (observe, plan, execute). Importing the package loads the section
only; `ProxySubsystem` is imported on first use, so that parsing a document never
imports the subsystem's implementation nor `trueup.system`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trueup.subsystems.proxy.section import ProxySection

if TYPE_CHECKING:
    from trueup.subsystems.proxy.subsystem import ProxySubsystem

__all__ = ["ProxySection", "ProxySubsystem"]


def __getattr__(name: str) -> object:
    if name == "ProxySubsystem":
        from trueup.subsystems.proxy.subsystem import ProxySubsystem

        return ProxySubsystem
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
