"""Sections of `spec` that subsystems own, registered with the document model.

The core sections (`management`, `interfaces`, `routes`, `tables`,
`convergence`) are fields of `DeviceSpec`. Every other subsystem owns one
section: a pydantic model it defines in its own module and registers here
through the catalog (`trueup.model.catalog`, one line per subsystem) or, for
a plugin, when it is loaded. A section nobody registered is refused with its
path.
"""

from __future__ import annotations

from pydantic import BaseModel

from trueup.model import catalog

__all__ = ["register_section", "registered_sections", "section_model"]

_SECTIONS: dict[str, type[BaseModel]] = {}
_discovered = False


def _discover() -> None:
    """Register the sections of the subsystems in the catalog (once, on first need)."""
    global _discovered
    if _discovered:
        return
    _discovered = True
    for reference in catalog.SUBSYSTEMS:
        section = getattr(catalog.load(reference), "section", None)
        if section is not None:
            register_section(*section)


def register_section(name: str, model: type[BaseModel]) -> None:
    """Register `spec.NAME`; registering the same model twice is harmless."""
    known = _SECTIONS.get(name)
    if known is not None and known is not model:
        raise ValueError(f"spec.{name} is already owned by {known.__module__}.{known.__name__}")
    _SECTIONS[name] = model


def section_model(name: str) -> type[BaseModel] | None:
    if name not in _SECTIONS:
        _discover()
    return _SECTIONS.get(name)


def registered_sections() -> dict[str, type[BaseModel]]:
    _discover()
    return dict(_SECTIONS)
