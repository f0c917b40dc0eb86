"""Rendering a device's desired document from the profiles that select it.

1. The profiles whose selector matches the device's labels, in (priority, name)
   order; the device's own layer comes last.
2. Variables: every device value must be declared by a selected profile and fit
   each declaration of it (a name declared by several profiles is one variable;
   they must agree on its type); a required variable must be set; otherwise the
   last declared default applies.
3. Each profile's document with its variables substituted (values only).
4. The layers merged (`trueup.model.layering.merge`), wrapped as a DeviceState
   named for the device, and validated by `trueup.model.document.parse_document`
   like any document. A problem the model finds names its path and, where one
   layer set that path, the profile (and the variable) that put it there. A
   merge larger than any document may be (DOCUMENT_BYTES) is refused.

The result's digest is `document_digest`: the same inputs give the same digest
in every process. A device with no profile and a whole document as its own
layer renders to exactly that document.

Why this module is over 400 lines: rendering and naming the layer, profile and
variable behind a path the model refuses walk the same layers by the same path
and list-key rules; apart, each would restate the other's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from trueup.model.digests import canonical_json, json_digest, sha256_digest
from trueup.model.document import API_VERSION, DocumentError, parse_document
from trueup.model.layering.merge import (
    LIST_KEYS,
    check_layer,
    child_pattern,
    is_plain,
    item_key,
    item_pattern,
    merge_layers,
)
from trueup.model.layering.profiles import Profile
from trueup.model.layering.substitute import SubstitutionErrors
from trueup.model.layering.types import (
    DeviceInputs,
    Provenance,
    Rendered,
    RenderError,
    RenderProblem,
)
from trueup.model.layering.variables import Variable, variables_digest
from trueup.model.limits import DOCUMENT_BYTES

__all__ = ["OWN_LAYER", "Renderer", "render_device"]

OWN_LAYER = "the device's own layer"
_SEGMENT = re.compile(r"\.([^.\[\]]+)|\[(\d+)\]")


class Renderer:
    """Renders devices from one set of profiles (sorted and compiled once)."""

    def __init__(self, profiles: Sequence[Profile]) -> None:
        names: dict[str, Profile] = {}
        for profile in profiles:
            if profile.name in names:
                raise ValueError(f"two profiles named {profile.name}")
            names[profile.name] = profile
        self.profiles: tuple[Profile, ...] = tuple(
            sorted(profiles, key=lambda p: (p.priority, p.name))
        )

    def selected(self, labels: Mapping[str, str]) -> list[Profile]:
        """The profiles that select a device with these labels, in the order applied."""
        return [p for p in self.profiles if p.selector.matches(labels)]

    def references(self, labels: Mapping[str, str]) -> frozenset[str]:
        """The variables the documents of the selected profiles use: a change to any
        other variable cannot change this device's document."""
        out: set[str] = set()
        for profile in self.selected(labels):
            out |= profile.compiled.references
        return frozenset(out)

    def render(self, inputs: DeviceInputs) -> Rendered:
        """The device's validated document; RenderError with every problem otherwise."""
        selected = self.selected(inputs.labels)
        problems: list[RenderProblem] = []
        values = _resolve(selected, inputs, problems)
        reported = {p.variable for p in problems}
        layers: list[tuple[Profile | None, Any]] = []
        for profile in selected:
            compiled = profile.compiled
            for path, message in compiled.problems:
                problems.append(RenderProblem(message, path, profile.name))
            try:
                layers.append((profile, compiled.render(values)))
            except SubstitutionErrors as exc:
                problems += [
                    RenderProblem(e.message, e.path, profile.name, e.variable)
                    for e in exc.errors
                    if e.variable not in reported  # already refused: wrong or missing value
                ]
        own = _own_layer(inputs, problems)
        if own is not None:
            layers.append((None, own))
        if problems:
            raise RenderError(inputs.name, problems)
        spec = merge_layers(
            [layer for _, layer in layers],
            [p.plain if p is not None else is_plain(layer) for p, layer in layers],
        )
        body = {
            "apiVersion": API_VERSION,
            "kind": "DeviceState",
            "metadata": {"device": inputs.name},
            "spec": spec,
        }
        try:
            state = parse_document(body, source=f"device {inputs.name}")
        except DocumentError as exc:
            raise RenderError(
                inputs.name, [_attribute(p, spec, layers) for p in exc.problems]
            ) from None
        provenance = Provenance(
            profiles=tuple((p.name, p.version) for p in selected),
            variables_digest=variables_digest(inputs.variables),
            own_digest=json_digest(inputs.own) if inputs.own is not None else None,
        )
        document = state.canonical()  # metadata has no version: its digest is document_digest
        encoded = canonical_json(document)
        if len(encoded) > DOCUMENT_BYTES:
            # Every layer may be within the limit and their merge not: refused like any
            # document that size (no PUT stores it, no agent takes it).
            raise RenderError(
                inputs.name,
                [
                    RenderProblem(
                        f"the rendered document is {len(encoded)} bytes; a document is at "
                        f"most {DOCUMENT_BYTES} bytes",
                        "spec",
                    )
                ],
            )
        return Rendered(
            device=inputs.name,
            document=document,
            digest=sha256_digest(encoded),
            provenance=provenance,
        )


def render_device(profiles: Sequence[Profile], inputs: DeviceInputs) -> Rendered:
    """`Renderer(profiles).render(inputs)`."""
    return Renderer(profiles).render(inputs)


def _resolve(
    selected: Sequence[Profile], inputs: DeviceInputs, problems: list[RenderProblem]
) -> dict[str, Any]:
    """Each declared variable's value for this device (None: no value and no default)."""
    declared: dict[str, list[tuple[Profile, Variable]]] = {}
    for profile in selected:
        for name, variable in profile.variables.items():
            first = declared.setdefault(name, [])
            if first and first[0][1].schema_key() != variable.schema_key():
                other, theirs = first[0]
                problems.append(
                    RenderProblem(
                        f"declared as {_type(variable)} here but as {_type(theirs)} by "
                        f"profile {other.name}; a variable has one type",
                        f"spec.variables.{name}",
                        profile.name,
                        name,
                    )
                )
                continue
            first.append((profile, variable))
    values: dict[str, Any] = {}
    for name in sorted(inputs.variables):
        if name not in declared:
            chosen = ", ".join(p.name for p in selected) or "none"
            problems.append(
                RenderProblem(
                    f"not declared by any profile that selects this device (selected: {chosen})",
                    f"variables.{name}",
                    None,
                    name,
                )
            )
    for name, declarations in declared.items():
        if name in inputs.variables:
            value = inputs.variables[name]
            for profile, variable in declarations:
                try:
                    value = variable.check(value)
                except ValueError as exc:
                    problems.append(
                        RenderProblem(
                            f"{exc} (declared {_type(variable)})",
                            f"variables.{name}",
                            profile.name,
                            name,
                        )
                    )
                    break
            values[name] = value
            continue
        required = [p.name for p, v in declarations if v.required]
        if required:
            problems.append(
                RenderProblem(
                    "required: set it for this device", f"variables.{name}", required[0], name
                )
            )
        defaults = [(p, v.default) for p, v in declarations if v.has_default]
        if not defaults:
            values[name] = None
            continue
        owner, value = defaults[-1]
        for profile, variable in declarations:  # a default fits every declaration, too
            try:
                value = variable.check(value)
            except ValueError as exc:
                problems.append(
                    RenderProblem(
                        f"the default of profile {owner.name}: {exc} (declared "
                        f"{_type(variable)}); set it for this device",
                        f"variables.{name}",
                        profile.name,
                        name,
                    )
                )
                break
        values[name] = value
    return values


def _type(variable: Variable) -> str:
    return f"list of {variable.items}" if variable.type == "list" else variable.type


def _own_layer(inputs: DeviceInputs, problems: list[RenderProblem]) -> Mapping[str, Any] | None:
    """The device's own layer as a partial spec (a whole document gives its spec)."""
    own = inputs.own
    if own is None:
        return None
    if not isinstance(own, Mapping):
        problems.append(RenderProblem("expected a mapping (a partial spec)", "own"))
        return None
    root = "spec"
    if "apiVersion" in own or "kind" in own:
        metadata = own.get("metadata") or {}
        if not isinstance(metadata, Mapping):
            problems.append(RenderProblem("expected a mapping (device, …)", "own.metadata"))
            return None
        device = metadata.get("device")
        if device is not None and device != inputs.name:
            problems.append(
                RenderProblem(
                    f"names device {device}, not {inputs.name}", "own.metadata.device", None
                )
            )
        spec = own.get("spec", {})
        if not isinstance(spec, Mapping):
            problems.append(RenderProblem("expected a mapping of spec sections", "own.spec"))
            return None
        own = spec
    for path, message in check_layer(own):
        problems.append(RenderProblem(f"{message} ({OWN_LAYER})", f"{root}.{path}"))
    return own


def _segments(path: str) -> list[str | int] | None:
    """`spec.interfaces[1].mtu` → ["interfaces", 1, "mtu"]; None when not below spec."""
    if path != "spec" and not path.startswith(("spec.", "spec[")):
        return None
    out: list[str | int] = []
    position = 4
    while position < len(path):
        match = _SEGMENT.match(path, position)
        if match is None:
            return out
        out.append(match.group(1) if match.group(1) is not None else int(match.group(2)))
        position = match.end()
    return out


def _walk(node: Any, segments: list[str | int], keys: list[Any]) -> int:
    """How far `segments` reach into `node` (a layer), list items matched by `keys`
    (the identity of the rendered document's item at each list step)."""
    index = 0
    while index < len(segments):
        segment = segments[index]
        if isinstance(segment, int):
            if not isinstance(node, list):
                break
            key = keys[index]
            if key is None:
                if segment >= len(node):
                    break
                node = node[segment]
            else:
                found = [item for item in node if _key_of(key[0], item) == key]
                if not found:
                    break
                node = found[-1]
            index += 1
            continue
        if not isinstance(node, Mapping):
            break
        matched: tuple[int, str] | None = None
        # A key with dots in it (a sysctl name) spans several segments.
        for end in range(index + 1, len(segments) + 1):
            parts = segments[index:end]
            if not isinstance(parts[-1], str):
                break
            name = _spelled(node, ".".join(str(p) for p in parts))
            if name is not None:
                matched = (end, name)
                break
        if matched is None:
            break
        index, name = matched
        node = node[name]
    return index


def _spelled(node: Mapping[str, Any], name: str) -> str | None:
    """`name` as `node` spells it (a field may be written by its alias: `ip-address`)."""
    for candidate in (name, name.replace("-", "_"), name.replace("_", "-")):
        if candidate in node:
            return candidate
    return None


def _key_of(fields: tuple[str, ...], item: Any) -> Any:
    return (fields, item_key(fields, item))


def _item_keys(spec: Mapping[str, Any], segments: list[str | int]) -> list[Any]:
    """For each segment, the identity of the rendered list item it indexes (else None)."""
    keys: list[Any] = []
    node: Any = spec
    pattern = ""
    for segment in segments:
        if isinstance(segment, int):
            fields = LIST_KEYS.get(pattern)
            item = node[segment] if isinstance(node, list) and segment < len(node) else None
            if fields is not None and item is not None and item_key(fields, item) is not None:
                keys.append((fields, item_key(fields, item)))
            else:
                keys.append(None)
            node = item
            pattern = item_pattern(pattern)
        else:
            keys.append(None)
            node = node.get(segment) if isinstance(node, Mapping) else None
            pattern = child_pattern(pattern, segment)
    return keys


def _attribute(
    problem: str, spec: Mapping[str, Any], layers: list[tuple[Profile | None, Any]]
) -> RenderProblem:
    """A document problem as a RenderProblem naming the layer that set its path."""
    path, sep, message = problem.partition(": ")
    if not sep:
        return RenderProblem(problem)
    segments = _segments(path)
    if segments is None or not layers:
        return RenderProblem(message, path)
    keys = _item_keys(spec, segments)
    best: tuple[int, Profile | None, Any] | None = None
    for profile, layer in layers:
        depth = _walk(layer, segments, keys)
        if depth > 0 and (best is None or depth >= best[0]):
            best = (depth, profile, layer)
    if best is None:
        return RenderProblem(message, path)
    depth, profile, layer = best
    if profile is None:
        return RenderProblem(f"{message} ({OWN_LAYER})", path)
    variable = _variable_at(profile, layer, segments[:depth], keys)
    return RenderProblem(message, path, profile.name, variable)


def _variable_at(
    profile: Profile, layer: Any, segments: list[str | int], keys: list[Any]
) -> str | None:
    """The variable substituted at (or around) that path of the profile's document;
    `layer` is that document substituted (same positions), where keyed items are found
    by the keys a variable may have written."""
    node: Any = profile.document
    shadow: Any = layer
    where = "spec.document"
    for index, segment in enumerate(segments):
        if isinstance(segment, int):
            if not isinstance(node, list):
                return None
            key = keys[index]
            items = shadow if isinstance(shadow, list) and len(shadow) == len(node) else node
            positions = (
                [segment]
                if key is None
                else [i for i, item in enumerate(items) if _key_of(key[0], item) == key]
            )
            if not positions or positions[-1] >= len(node):
                # The item's key itself may come from a variable: look no further.
                return _only_variable(profile, where)
            node = node[positions[-1]]
            shadow = items[positions[-1]] if items is shadow else None
            where = f"{where}[{positions[-1]}]"
        else:
            name = _spelled(node, segment) if isinstance(node, Mapping) else None
            if name is None:
                return None
            node = node[name]
            shadow = shadow.get(name) if isinstance(shadow, Mapping) else None
            where = f"{where}.{name}"
    names = profile.compiled.templates.get(where)
    return names[0] if names else _only_variable(profile, where)


def _only_variable(profile: Profile, prefix: str) -> str | None:
    """The one variable used below `prefix`, if exactly one is."""
    found = {
        name
        for path, names in profile.compiled.templates.items()
        if path == prefix or path.startswith((prefix + ".", prefix + "["))
        for name in names
    }
    return next(iter(found)) if len(found) == 1 else None
