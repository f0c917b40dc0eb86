"""Sections of `spec` that subsystems own, registered with the document model.

The core sections (`management`, `interfaces`, `routes`, `tables`,
`convergence`) are fields of `DeviceSpec`. Every other subsystem owns one
section: a pydantic model in a light module of its own
(`trueup/subsystems/NAME/section.py`: pure data, importing nothing of
`trueup.system` nor of the subsystem's implementation), declared as a
`Section` and listed in the catalog (`trueup.model.catalog.SECTIONS`) or, for
a plugin, registered when it is loaded. A section nobody registered is
refused with its path.

A section may check itself against the rest of `spec`: its `Section` declares
each `CrossCheck` — the other sections it reads (`against`) and a function
over the typed section, the spec and those sections. The function reads
another section only as a view model it defines (`others.get("dhcp",
DhcpRoles)`: the fields it needs, validated from that section's data), so
sections never import each other and every dependency between them is in
their declarations. Model code outside a section that reads one (the HA
virtual addresses: `trueup.model.virtual`) reads it the same way, through
`section_view` and a view model of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from pydantic import BaseModel

from trueup.model import catalog

if TYPE_CHECKING:
    from trueup.model.document import DeviceSpec

__all__ = [
    "CrossCheck",
    "OtherSections",
    "Problem",
    "Section",
    "cross_problems",
    "register_section",
    "registered_sections",
    "section_model",
    "section_view",
]

# (path below `spec`, message)
Problem = tuple[str, str]
M = TypeVar("M", bound=BaseModel)
V = TypeVar("V", bound=BaseModel)


class OtherSections:
    """The sections a cross-check declared it reads, each as a view model of the reader's."""

    def __init__(self, declared: tuple[str, ...], values: Mapping[str, BaseModel]) -> None:
        self._declared = declared
        self._values = values

    def get(self, name: str, view: type[V]) -> V | None:
        """`spec.NAME` read as `view` (its fields, from the section's data); None when absent."""
        if name not in self._declared:
            raise KeyError(f"spec.{name} is not among the sections this check declares")
        value = self._values.get(name)
        if value is None:
            return None
        return view.model_validate(value.model_dump(mode="python"))


def section_view(spec: DeviceSpec, name: str, view: type[V]) -> V | None:
    """`spec.NAME` read as `view`, as a cross-check reads it (`OtherSections.get`); None when
    the document has no such section."""
    extra = spec.model_extra or {}
    value = extra.get(name)
    values = {name: value} if isinstance(value, BaseModel) else {}
    return OtherSections((name,), values).get(name, view)


@dataclass(frozen=True)
class CrossCheck(Generic[M]):
    """Problems between a section and the rest of `spec`, reading the sections `against`."""

    function: Callable[[M, DeviceSpec, OtherSections], list[Problem]]
    against: tuple[str, ...] = ()


@dataclass(frozen=True)
class Section(Generic[M]):
    """`spec.NAME`: its model and its checks against the rest of `spec`."""

    name: str
    model: type[M]
    checks: tuple[CrossCheck[M], ...] = ()

    def problems(self, value: BaseModel, spec: DeviceSpec) -> list[Problem]:
        if not isinstance(value, self.model):
            return []
        extra = spec.model_extra or {}
        out: list[Problem] = []
        for cross in self.checks:
            others = OtherSections(
                cross.against, {n: extra[n] for n in cross.against if n in extra}
            )
            out.extend(cross.function(value, spec, others))
        return out


_SECTIONS: dict[str, Section[Any]] = {}
_discovered = False


def _discover() -> None:
    """Register the sections the catalog lists (once, on first need)."""
    global _discovered
    if _discovered:
        return
    _discovered = True
    for reference in catalog.SECTIONS:
        declared = catalog.load(reference)
        if not isinstance(declared, Section):
            raise TypeError(f"{reference} is not a trueup.model.sections.Section")
        _register(declared)


def _register(section: Section[Any]) -> None:
    known = _SECTIONS.get(section.name)
    if known is not None and known.model is not section.model:
        model = known.model
        raise ValueError(
            f"spec.{section.name} is already owned by {model.__module__}.{model.__name__}"
        )
    if known is None or section.checks:
        _SECTIONS[section.name] = section


def register_section(name: str | Section[Any], model: type[BaseModel] | None = None) -> None:
    """Register `spec.NAME` (a `Section`, or a name and its model); the same model twice is
    harmless, and registering a model without checks keeps the checks already declared."""
    if isinstance(name, Section):
        _register(name)
        return
    if model is None:
        raise TypeError("register_section(name, model): the model is missing")
    _register(Section(name, model))


def section_model(name: str) -> type[BaseModel] | None:
    if name not in _SECTIONS:
        _discover()
    known = _SECTIONS.get(name)
    return known.model if known is not None else None


def registered_sections() -> dict[str, type[BaseModel]]:
    _discover()
    return {name: section.model for name, section in _SECTIONS.items()}


def cross_problems(spec: DeviceSpec) -> list[Problem]:
    """Every declared cross-check of the sections `spec` holds, in section order."""
    _discover()
    problems: list[Problem] = []
    for name, value in sorted((spec.model_extra or {}).items()):
        section = _SECTIONS.get(name)
        if section is not None and isinstance(value, BaseModel):
            problems.extend(section.problems(value, spec))
    return problems
