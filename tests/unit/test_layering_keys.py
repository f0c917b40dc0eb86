"""LIST_KEYS matches the document model: every list of objects in any section has a merge key
naming fields its items have, so a section added later cannot be merged by position silently."""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, RootModel

from trueup.model.document import DeviceSpec
from trueup.model.layering import LIST_KEYS
from trueup.model.sections import registered_sections


def _lists() -> dict[str, type[BaseModel] | None]:
    """Every list below spec: its pattern → the item model (None for plain values)."""
    found: dict[str, type[BaseModel] | None] = {}

    def annotation(kind: Any, pattern: str) -> None:
        origin = typing.get_origin(kind)
        if origin in (list, tuple):
            (item,) = typing.get_args(kind)[:1]
            models = _models(item)
            found[pattern] = models[0] if models else None
            for model in models:
                fields(model, pattern + "[]")
        elif origin in (typing.Union, types.UnionType, typing.Annotated):
            for arg in typing.get_args(kind):
                annotation(arg, pattern)
        elif isinstance(kind, type) and issubclass(kind, RootModel):
            annotation(kind.model_fields["root"].annotation, pattern)
        elif isinstance(kind, type) and issubclass(kind, BaseModel):
            fields(kind, pattern)

    def fields(model: type[BaseModel], pattern: str) -> None:
        for name, info in model.model_fields.items():
            annotation(info.annotation, f"{pattern}.{name}" if pattern else name)

    fields(DeviceSpec, "")
    for name, section in registered_sections().items():
        annotation(section, name)
    return found


def _models(kind: Any) -> list[type[BaseModel]]:
    if isinstance(kind, type) and issubclass(kind, BaseModel):
        return [kind]
    return [m for arg in typing.get_args(kind) for m in _models(arg)]


def test_every_list_of_objects_has_a_merge_key_its_items_have() -> None:
    lists = _lists()
    objects = {pattern: model for pattern, model in lists.items() if model is not None}
    assert objects, "no list of objects found: the walk is broken"
    for pattern, model in objects.items():
        assert pattern in LIST_KEYS, f"spec.{pattern}: a list of objects without a merge key"
        names = {n for n, i in model.model_fields.items()} | {
            i.alias for i in model.model_fields.values() if i.alias
        }
        for field in LIST_KEYS[pattern]:
            assert field in names, f"spec.{pattern}: items have no field {field}"


def test_every_merge_key_names_a_list_of_the_model() -> None:
    lists = _lists()
    for pattern, fields in LIST_KEYS.items():
        assert pattern in lists, f"LIST_KEYS names {pattern}, which is not a list"
        assert (lists[pattern] is None) == (fields == ()), pattern
