"""Variables in a profile's document: where they may appear and how they are substituted.

A variable appears only in a value, never in a key:

    mtu: "${lan_mtu}"            the whole string: the variable's typed value (9000)
    name: "dns-${site}"          inside a string: its text ("dns-ams")
    rule: "price $${x}"          `$${` is a literal `${`

A typed value is a scalar or a list of scalars (never a mapping), so a
substitution can never add a key. A document is compiled once per profile:
only the values that hold a variable are revisited for each device.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trueup.model.layering.variables import VARIABLE_NAME
from trueup.model.limits import quoted

__all__ = [
    "Compiled",
    "Ref",
    "SubstitutionError",
    "SubstitutionErrors",
    "compile_document",
    "parse_template",
]

_TOKEN = re.compile(r"\$\$\{|\$\{")


@dataclass(frozen=True)
class Ref:
    """`${name}` inside a string."""

    name: str


class SubstitutionError(ValueError):
    """A value that cannot be substituted: `path` in the profile's document, the variable."""

    def __init__(self, path: str, variable: str | None, message: str) -> None:
        self.path = path
        self.variable = variable
        self.message = message
        super().__init__(f"{path}: {message}")


class SubstitutionErrors(ValueError):
    """Every value of a document that could not be substituted."""

    def __init__(self, errors: list[SubstitutionError]) -> None:
        self.errors = errors
        super().__init__("; ".join(str(e) for e in errors))


def parse_template(text: str) -> list[str | Ref]:
    """`text` as literal parts and references; ValueError for a malformed `${`."""
    parts: list[str | Ref] = []
    literal: list[str] = []
    position = 0
    while True:
        match = _TOKEN.search(text, position)
        if match is None:
            literal.append(text[position:])
            break
        literal.append(text[position : match.start()])
        if match.group() == "$${":
            literal.append("${")
            position = match.end()
            continue
        end = text.find("}", match.end())
        if end < 0:
            raise ValueError(f"unclosed ${{ at character {match.start() + 1} (a literal is $${{)")
        name = text[match.end() : end]
        if not VARIABLE_NAME.match(name):
            raise ValueError(f"{quoted('${' + name + '}')} does not name a variable")
        if literal:
            joined = "".join(literal)
            if joined:
                parts.append(joined)
            literal = []
        parts.append(Ref(name))
        position = end + 1
    joined = "".join(literal)
    if joined or not parts:
        parts.append(joined)
    return parts


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass(frozen=True)
class _Template:
    path: str
    parts: tuple[str | Ref, ...]
    in_list: bool = False

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.parts if isinstance(p, Ref))

    def render(self, values: Mapping[str, Any]) -> Any:
        if len(self.parts) == 1 and isinstance(self.parts[0], Ref):
            name = self.parts[0].name
            value = self._value(values, name)
            if isinstance(value, Mapping):
                raise SubstitutionError(
                    self.path, name, "a variable's value cannot be a mapping (it would add keys)"
                )
            if isinstance(value, list | tuple):
                if self.in_list:
                    raise SubstitutionError(
                        self.path,
                        name,
                        f"a list variable is a whole list, not an item of one: write "
                        f'the list as "${{{name}}}"',
                    )
                return list(value)
            return value
        out = []
        for part in self.parts:
            if isinstance(part, str):
                out.append(part)
                continue
            value = self._value(values, part.name)
            if isinstance(value, Mapping | list | tuple):
                raise SubstitutionError(
                    self.path,
                    part.name,
                    "a list cannot be interpolated into text; use the whole value "
                    f'"${{{part.name}}}"',
                )
            out.append(_text(value))
        return "".join(out)

    def _value(self, values: Mapping[str, Any], name: str) -> Any:
        if name not in values:
            raise SubstitutionError(self.path, name, f"unknown variable ${{{name}}}")
        value = values[name]
        if value is None:
            raise SubstitutionError(
                self.path,
                name,
                f"variable {name} has no value: set it for the device or give it a default",
            )
        return value


_Node = Any  # _Template | _Container | a plain value


@dataclass(frozen=True)
class _Container:
    """A mapping or list holding templates somewhere below: only those children are redone."""

    base: Mapping[str, Any] | list[Any]
    dynamic: tuple[tuple[Any, _Node], ...]

    def render(self, values: Mapping[str, Any], errors: list[SubstitutionError]) -> Any:
        out: Any = dict(self.base) if isinstance(self.base, Mapping) else list(self.base)
        for key, child in self.dynamic:
            if isinstance(child, _Container):
                out[key] = child.render(values, errors)
                continue
            try:
                out[key] = child.render(values)
            except SubstitutionError as exc:
                errors.append(exc)
        return out


@dataclass(frozen=True)
class Compiled:
    """A profile's document, ready to be rendered for many devices."""

    root: _Node
    templates: Mapping[str, tuple[str, ...]]  # path in the document → variables it uses
    problems: tuple[tuple[str, str], ...]  # (path, message): malformed `${`

    @property
    def references(self) -> frozenset[str]:
        return frozenset(name for names in self.templates.values() for name in names)

    def render(self, values: Mapping[str, Any]) -> Any:
        """The document with `values` substituted; SubstitutionErrors with every problem."""
        errors: list[SubstitutionError] = []
        if isinstance(self.root, _Container):
            out = self.root.render(values, errors)
        elif isinstance(self.root, _Template):
            try:
                out = self.root.render(values)
            except SubstitutionError as exc:
                errors.append(exc)
        else:
            out = self.root
        if errors:
            raise SubstitutionErrors(errors)
        return out


def compile_document(document: Any, path: str) -> Compiled:
    """Compile `document` (found at `path`, e.g. `spec.document`)."""
    templates: dict[str, tuple[str, ...]] = {}
    problems: list[tuple[str, str]] = []

    def walk(value: Any, where: str, in_list: bool = False) -> _Node:
        if isinstance(value, str):
            if "$" not in value:
                return value
            try:
                parts = parse_template(value)
            except ValueError as exc:
                problems.append((where, str(exc)))
                return value
            if len(parts) == 1 and isinstance(parts[0], str):
                return parts[0]  # only `$${` escapes
            template = _Template(where, tuple(parts), in_list)
            templates[where] = template.names
            return template
        if isinstance(value, Mapping):
            children = [(k, walk(v, f"{where}.{k}")) for k, v in value.items()]
        elif isinstance(value, list):
            children = [(i, walk(v, f"{where}[{i}]", True)) for i, v in enumerate(value)]
        else:
            return value
        dynamic = tuple((k, c) for k, c in children if isinstance(c, _Template | _Container))
        static = {k: c for k, c in children}
        base: Mapping[str, Any] | list[Any] = (
            static if isinstance(value, Mapping) else [c for _, c in children]
        )
        return _Container(base, dynamic) if dynamic else base

    root = walk(document, path)
    return Compiled(root, templates, tuple(problems))
