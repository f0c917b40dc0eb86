"""Interface names in a desired-state document, and renaming them by an explicit map.

Who uses this: `trueup.backup.analysis` (names an archive needs that this
router lacks) and the restore engine (the document it applies, renamed by
the operator's `--map old=new`). Names are never guessed: a name that is
neither here nor mapped is a problem, never a fuzzy match. Pure.

Where names are: `spec.management.interface`, `spec.interfaces[].name`,
and anywhere in `spec` a key `interface` or `dev` holds a string, or a key
`interfaces` holds a list of strings (`spec.dhcp.interfaces`,
`spec.dhcp.subnets[].interface`, `spec.routes[].dev`, …).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

from trueup.model.jsontypes import JSONObject

__all__ = ["interface_refs", "map_interfaces", "parse_mappings"]

_SCALAR_KEYS = {"interface", "dev"}
_LIST_KEYS = {"interfaces"}


def _walk(value: Any, path: str, in_interfaces: bool) -> Iterator[tuple[str, str]]:
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}"
            if (key in _SCALAR_KEYS and isinstance(item, str)) or (
                key == "name" and in_interfaces and isinstance(item, str)
            ):
                yield where, item
            elif key in _LIST_KEYS and isinstance(item, list):
                for i, element in enumerate(item):
                    if isinstance(element, str):
                        yield f"{where}[{i}]", element
                    else:
                        yield from _walk(element, f"{where}[{i}]", path == "spec")
            else:
                yield from _walk(item, where, False)
    elif isinstance(value, list):
        for i, element in enumerate(value):
            yield from _walk(element, f"{path}[{i}]", in_interfaces)


def interface_refs(document: JSONObject) -> list[tuple[str, str]]:
    """(path, name) for every interface name the document's `spec` uses, in document order."""
    return list(_walk(document.get("spec") or {}, "spec", False))


def map_interfaces(document: JSONObject, mappings: dict[str, str]) -> JSONObject:
    """A copy of `document` with every interface name in `mappings` renamed."""
    renamed = copy.deepcopy(document)

    def rename(value: Any, in_interfaces: bool, top: bool) -> None:
        if isinstance(value, dict):
            for key, item in list(value.items()):
                if (key in _SCALAR_KEYS or (key == "name" and in_interfaces)) and isinstance(
                    item, str
                ):
                    value[key] = mappings.get(item, item)
                elif key in _LIST_KEYS and isinstance(item, list):
                    for i, element in enumerate(item):
                        if isinstance(element, str):
                            item[i] = mappings.get(element, element)
                        else:
                            rename(element, top, False)
                else:
                    rename(item, False, False)
        elif isinstance(value, list):
            for element in value:
                rename(element, in_interfaces, False)

    rename(renamed.get("spec") or {}, False, True)
    return renamed


def parse_mappings(pairs: list[str]) -> dict[str, str]:
    """`["eth0=lan0", …]` as a dict; `ValueError` naming the bad pair (no `=`, empty, twice)."""
    out: dict[str, str] = {}
    for pair in pairs:
        old, sep, new = pair.partition("=")
        if not sep or not old or not new or "=" in new:
            raise ValueError(f"--map {pair!r}: expected OLD=NEW (two interface names)")
        if old in out and out[old] != new:
            raise ValueError(f"--map {pair!r}: {old} is already mapped to {out[old]}")
        out[old] = new
    return out
