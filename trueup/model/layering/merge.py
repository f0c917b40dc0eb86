"""How layers of a device's `spec` merge: rules an operator can predict from one table.

Layers are applied in order (profiles by priority then name, the device's own
layer last); each layer is merged onto the result of the ones before it:

* a mapping is merged key by key; a key the later layer sets wins on a scalar;
  `null` removes the key (a field then has its default, a sysctl is no longer
  managed);
* a list named in `LIST_KEYS` is merged item by item by its key: an item whose
  key is already present is merged into it (in place, keeping the order), a new
  one is appended. `{name: eth9, $delete: true}` (the key fields plus
  `$delete: true`) removes that item;
* a list whose key is `()` in `LIST_KEYS` holds plain values (interface
  addresses): the later layer's values are added to the earlier ones, once each;
* every other list is replaced whole by the later layer's;
* `{$replace: [...]}` in place of a merged list replaces it whole.

Paths in `LIST_KEYS` are below `spec`, with `[]` for "every item of a list".
"""

from __future__ import annotations

import functools
import ipaddress
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, RootModel

from trueup.model.document import DeviceSpec
from trueup.model.sections import registered_sections

__all__ = [
    "DELETE",
    "LIST_KEYS",
    "REPLACE",
    "check_layer",
    "child_pattern",
    "is_plain",
    "item_key",
    "item_label",
    "item_pattern",
    "merge_layers",
    "merge_onto",
]

DELETE = "$delete"
REPLACE = "$replace"

LIST_KEYS: Mapping[str, tuple[str, ...]] = {
    "interfaces": ("name",),
    "interfaces[].addresses": (),
    "routes": ("to", "table", "metric"),
    "firewall.sets": ("name",),
    "firewall.chains": ("name",),
    "dhcp.subnets": ("subnet",),
    "dhcp.subnets[].reservations": ("ip_address",),
    "dhcp.ha.peers": ("name",),
    "dns.records": ("name", "type", "value"),
    "ha.vips": ("interface", "vrid"),
    "proxies": ("name",),
    "proxies[].backend.servers": ("name",),
    "wireguard.interfaces": ("name",),
    "wireguard.interfaces[].peers": ("public_key",),
    "routing.bgp.neighbors": ("address",),
    "routing.ospf.areas": ("id",),
    "routing.ospf.areas[].interfaces": ("name",),
    "routing.ospf6.areas": ("id",),
    "routing.ospf6.areas[].interfaces": ("name",),
    "routing.prefix_lists": ("name",),
    "routing.prefix_lists[].entries": ("seq",),
    "routing.route_maps": ("name",),
    "routing.route_maps[].entries": ("seq",),
    "gateways.uplinks": ("name",),
}


def _network(value: Any) -> Any:
    if value == "default":
        return "0.0.0.0/0"
    if value == "default6":
        return "::/0"
    try:
        return str(ipaddress.ip_network(str(value).strip(), strict=False))
    except ValueError:
        return value


def _address(value: Any) -> Any:
    try:
        return str(ipaddress.ip_address(str(value).strip()))
    except ValueError:
        return value


def _table(value: Any) -> Any:
    if value is None or value == "main":
        return 254
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return value


def _value(value: Any) -> Any:
    """A plain list value in the form the document model keeps it (prefixes canonical)."""
    if isinstance(value, str) and "/" in value:
        try:
            return str(ipaddress.ip_interface(value.strip()))
        except ValueError:
            return value
    return value


_NORMALISE: dict[str, Callable[[Any], Any]] = {
    "to": _network,
    "subnet": _network,
    "ip_address": _address,
    "table": _table,
    "metric": lambda v: 0 if v is None else v,
}


@functools.cache
def aliases() -> Mapping[str, Mapping[str, str]]:
    """Field aliases by path pattern (`dhcp.subnets[].reservations[]`: `ip-address` →
    `ip_address`): a layer may spell a field either way; merged, it has the field's name
    (the spelling of a stored document)."""
    found: dict[str, dict[str, str]] = {}

    def annotation(kind: Any, pattern: str, depth: int) -> None:
        origin = typing.get_origin(kind)
        if depth > 12:
            return
        if origin in (list, tuple):
            for arg in typing.get_args(kind)[:1]:
                annotation(arg, item_pattern(pattern), depth + 1)
        elif origin in (typing.Union, types.UnionType, typing.Annotated):
            for arg in typing.get_args(kind):
                annotation(arg, pattern, depth + 1)
        elif isinstance(kind, type) and issubclass(kind, RootModel):
            annotation(kind.model_fields["root"].annotation, pattern, depth + 1)
        elif isinstance(kind, type) and issubclass(kind, BaseModel):
            model(kind, pattern, depth + 1)

    def model(kind: type[BaseModel], pattern: str, depth: int) -> None:
        for name, info in kind.model_fields.items():
            if info.alias and info.alias != name:
                found.setdefault(pattern, {})[info.alias] = name
            annotation(info.annotation, child_pattern(pattern, info.alias or name), depth)
            if info.alias and info.alias != name:
                annotation(info.annotation, child_pattern(pattern, name), depth)

    model(DeviceSpec, "", 0)
    for name, section in sorted(registered_sections().items()):
        annotation(section, name, 0)
    return found


def _named(value: Mapping[str, Any], pattern: str) -> Mapping[str, Any]:
    """`value` with aliased fields under their names."""
    table = aliases().get(pattern)
    if not table or not any(key in table for key in value):
        return value
    return {table.get(key, key): item for key, item in value.items()}


def child_pattern(pattern: str, key: str) -> str:
    return f"{pattern}.{key}" if pattern else key


def item_pattern(pattern: str) -> str:
    return pattern + "[]"


def item_key(fields: tuple[str, ...], item: Any) -> Any:
    """The identity of a list item: a tuple of its (normalised) key fields, or the value
    itself for a list of plain values; None when a keyed item is not a mapping."""
    if not fields:
        return _value(item) if isinstance(item, str | int | float | bool) else None
    if not isinstance(item, Mapping):
        return None
    out = []
    for name in fields:
        value = item.get(name)
        normalise = _NORMALISE.get(name)
        if normalise is not None:
            value = normalise(value)
        if isinstance(value, list | dict):
            return None
        out.append(value)
    return tuple(out)


def item_label(fields: tuple[str, ...], item: Any) -> str:
    """How a diff names an item: `eth0`, or `to=0.0.0.0/0,table=main,metric=0`."""
    key = item_key(fields, item)
    if key is None:
        return "?"
    if not fields:
        return str(key)
    if len(fields) == 1:
        return str(key[0])
    parts = []
    for name, value in zip(fields, key, strict=True):
        shown = "main" if name == "table" and value == 254 else value
        parts.append(f"{name}={shown}")
    return ",".join(parts)


def _is_delete(item: Any) -> bool:
    return isinstance(item, Mapping) and item.get(DELETE) is True


def _clean(value: Any, pattern: str) -> Any:
    """A layer's subtree with no markers left: deleted items dropped, replacements unwrapped."""
    if isinstance(value, Mapping):
        if REPLACE in value and len(value) == 1:
            return _clean(value[REPLACE], pattern)
        value = _named(value, pattern)
        return {
            k: _clean(v, child_pattern(pattern, str(k))) for k, v in value.items() if v is not None
        }
    if isinstance(value, list):
        inner = item_pattern(pattern)
        return [_clean(v, inner) for v in value if not _is_delete(v)]
    return value


@functools.cache
def _aliased_names() -> frozenset[str]:
    return frozenset(alias for table in aliases().values() for alias in table)


def is_plain(value: Any) -> bool:
    """True when `value` holds no marker, no `null` and no aliased field name: merging
    may then share its subtrees as they are instead of copying them."""
    if isinstance(value, Mapping):
        names = _aliased_names()
        return all(
            v is not None
            and not (isinstance(k, str) and (k.startswith("$") or k in names))
            and is_plain(v)
            for k, v in value.items()
        )
    if isinstance(value, list):
        return all(is_plain(v) for v in value)
    return True


def merge_onto(base: Any, layer: Any, pattern: str = "", *, plain: bool = False) -> Any:
    """`layer` merged onto `base` (neither is changed; untouched subtrees are shared).
    `plain`: the caller knows `layer` is plain (`is_plain`)."""
    if not plain and isinstance(layer, Mapping) and REPLACE in layer and len(layer) == 1:
        return _clean(layer[REPLACE], pattern)
    if isinstance(base, Mapping) and isinstance(layer, Mapping):
        if not plain:
            layer = _named(layer, pattern)
        out = dict(base)
        for key, value in layer.items():
            child = child_pattern(pattern, str(key))
            if value is None:
                out.pop(key, None)
            elif key in out:
                out[key] = merge_onto(out[key], value, child, plain=plain)
            else:
                out[key] = value if plain else _clean(value, child)
        return out
    fields = LIST_KEYS.get(pattern)
    if fields is not None and isinstance(base, list) and isinstance(layer, list):
        return _merge_list(base, layer, fields, item_pattern(pattern), plain)
    return layer if plain else _clean(layer, pattern)


def _merge_list(
    base: list[Any], layer: list[Any], fields: tuple[str, ...], inner: str, plain: bool
) -> Any:
    out: list[Any] = list(base)
    where: dict[Any, int] = {}
    for position, present in enumerate(out):
        known = item_key(fields, present)
        if known is not None:
            where.setdefault(known, position)
    removed: set[int] = set()
    merged: set[int] = set()  # earlier items this layer merged into
    for item in layer:
        if not plain and isinstance(item, Mapping):
            item = _named(item, inner)
        key = item_key(fields, item)
        index = where.get(key) if key is not None else None
        if _is_delete(item):
            if index is not None:
                removed.add(index)
                del where[key]
            continue
        if index is None or (fields and index in merged):
            # Matched against the earlier layers only, once: a layer repeating a key is
            # left for the document model to refuse, never silently folded.
            out.append(item if plain else _clean(item, inner))
        elif fields:
            out[index] = merge_onto(out[index], item, inner, plain=plain)
            merged.add(index)
    return [item for index, item in enumerate(out) if index not in removed]


def merge_layers(
    layers: Sequence[Mapping[str, Any]], plain: Sequence[bool] | None = None
) -> dict[str, Any]:
    """Every layer merged onto the ones before it, in order; `{}` for none. `plain[i]`:
    layer i is known to be plain (`is_plain`); by default each layer is cleaned."""
    result: dict[str, Any] = {}
    for index, layer in enumerate(layers):
        merged = merge_onto(result, layer, plain=bool(plain and plain[index]))
        assert isinstance(merged, dict)
        result = merged
    return result


def check_layer(value: Any, path: str = "", pattern: str = "") -> list[tuple[str, str]]:
    """Where a layer misuses structure: a `${…}` in a key, a `$` key other than the markers,
    a marker where it has no meaning. (path, message) pairs; path below the layer's root."""
    problems: list[tuple[str, str]] = []
    if isinstance(value, Mapping):
        if REPLACE in value:
            if len(value) != 1:
                problems.append((path, f"{REPLACE} stands alone: {{{REPLACE}: [...]}}"))
            elif not isinstance(value[REPLACE], list):
                problems.append((f"{path}.{REPLACE}", "expected the list that replaces"))
            else:
                problems += check_layer(value[REPLACE], f"{path}.{REPLACE}", pattern)
            return problems
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if not isinstance(key, str):
                problems.append((where, "keys are text"))
            elif "${" in key:
                problems.append(
                    (where, "a variable cannot name a key: variables substitute into values only")
                )
            elif key == DELETE:
                if not pattern.endswith("[]") or not LIST_KEYS.get(pattern[:-2]):
                    problems.append(
                        (where, f"{DELETE} belongs in an item of a keyed list ({_keyed()})")
                    )
                elif item is not True:
                    problems.append((where, f"expected {DELETE}: true"))
            elif key.startswith("$"):
                problems.append((where, f"unknown marker; expected {DELETE} or {REPLACE}"))
            else:
                problems += check_layer(item, where, child_pattern(pattern, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            problems += check_layer(item, f"{path}[{index}]", item_pattern(pattern))
    return problems


def _keyed() -> str:
    return ", ".join(
        f"{path} by {'+'.join(fields)}" for path, fields in LIST_KEYS.items() if fields
    )
