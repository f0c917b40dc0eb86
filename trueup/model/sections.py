"""Sections of `spec` that subsystems own, registered with the document model.

The core sections (`management`, `interfaces`, `routes`, `tables`,
`convergence`) are fields of `DeviceSpec`. Every other subsystem owns one
section: a pydantic model it defines in its own module and registers here
through `trueup.subsystems.registry` (one line per subsystem). A section that
nobody registered is refused with its path, as before.
"""

from __future__ import annotations

from pydantic import BaseModel

__all__ = ["register_section", "registered_sections", "section_model"]

_SECTIONS: dict[str, type[BaseModel]] = {}


def register_section(name: str, model: type[BaseModel]) -> None:
    """Register `spec.NAME`; registering the same model twice is harmless."""
    known = _SECTIONS.get(name)
    if known is not None and known is not model:
        raise ValueError(f"spec.{name} is already owned by {known.__module__}.{known.__name__}")
    _SECTIONS[name] = model


def section_model(name: str) -> type[BaseModel] | None:
    return _SECTIONS.get(name)


def registered_sections() -> dict[str, type[BaseModel]]:
    return dict(_SECTIONS)
