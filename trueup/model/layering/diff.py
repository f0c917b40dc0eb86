"""What changes between two device documents, path by path.

Paths name list items by their merge key where the list has one
(`spec.interfaces[eth0].mtu`, `spec.routes[to=0.0.0.0/0,table=main,metric=0].via`,
`spec.interfaces[lan0].addresses[192.0.2.1/24]`), by position elsewhere
(the whole list is one change: `spec.firewall.chains[input].rules`). A keyed
list whose items only moved is one change at the list's path, old and new
being the item keys in order. `metadata.version` is not a change. The result
is sorted by path: the same documents give the same list in every process.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trueup.model.layering.merge import LIST_KEYS, child_pattern, item_label, item_pattern
from trueup.model.layering.types import PathChange

__all__ = ["diff_documents"]


def diff_documents(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> list[PathChange]:
    """Every change from `old` to `new` (documents as dicts); `old=None` for a device that
    has no document yet: each section of the new spec is an addition."""
    changes: list[PathChange] = []
    if old is None:
        spec = new.get("spec")
        if isinstance(spec, Mapping):
            for name in spec:
                changes.append(PathChange(f"spec.{name}", "add", None, spec[name]))
        return sorted(changes, key=lambda c: c.path)
    _diff_mapping(dict(old), dict(new), "", "", changes, top=True)
    return sorted(changes, key=lambda c: c.path)


def _same(old: Any, new: Any) -> bool:
    """Equal as JSON: Python's `1 == True == 1.0` is not (the digests differ)."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        return old.keys() == new.keys() and all(_same(old[k], new[k]) for k in old)
    if isinstance(old, list) and isinstance(new, list):
        return len(old) == len(new) and all(map(_same, old, new))
    return type(old) is type(new) and bool(old == new)


def _diff(old: Any, new: Any, path: str, pattern: str, changes: list[PathChange]) -> None:
    if old == new and _same(old, new):
        return
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        _diff_mapping(old, new, path, pattern, changes)
        return
    fields = LIST_KEYS.get(pattern)
    if fields is not None and isinstance(old, list) and isinstance(new, list):
        _diff_keyed(old, new, path, fields, item_pattern(pattern), changes)
        return
    changes.append(PathChange(path, "change", old, new))


def _diff_mapping(
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    path: str,
    pattern: str,
    changes: list[PathChange],
    *,
    top: bool = False,
) -> None:
    for key in sorted({*old, *new}, key=str):
        where = f"{path}.{key}" if path else str(key)
        # Below spec, patterns are what LIST_KEYS names (no "spec." in front).
        child = "" if top and key == "spec" else child_pattern(pattern, str(key))
        if top and key == "metadata":
            old_meta = {k: v for k, v in (old.get(key) or {}).items() if k != "version"}
            new_meta = {k: v for k, v in (new.get(key) or {}).items() if k != "version"}
            _diff(old_meta, new_meta, where, child, changes)
            continue
        if key not in new:
            changes.append(PathChange(where, "remove", old[key], None))
        elif key not in old:
            changes.append(PathChange(where, "add", None, new[key]))
        else:
            _diff(old[key], new[key], where, child, changes)


def _diff_keyed(
    old: list[Any],
    new: list[Any],
    path: str,
    fields: tuple[str, ...],
    inner: str,
    changes: list[PathChange],
) -> None:
    old_items = {item_label(fields, item): item for item in old}
    new_items = {item_label(fields, item): item for item in new}
    if len(old_items) != len(old) or len(new_items) != len(new):
        # Repeated keys (a document the model would refuse): compare the lists whole.
        changes.append(PathChange(path, "change", old, new))
        return
    for label in sorted({*old_items, *new_items}):
        where = f"{path}[{label}]"
        if label not in new_items:
            changes.append(PathChange(where, "remove", old_items[label], None))
        elif label not in old_items:
            changes.append(PathChange(where, "add", None, new_items[label]))
        else:
            _diff(old_items[label], new_items[label], where, inner, changes)
    old_order = [label for label in old_items if label in new_items]
    new_order = [label for label in new_items if label in old_items]
    if old_order != new_order:
        changes.append(PathChange(path, "change", old_order, new_order))
