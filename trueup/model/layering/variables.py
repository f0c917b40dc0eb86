"""Typed variables: a profile's schema for the values each device gives it.

A variable declares a type and optional constraints:

    string                 pattern (a regular expression the whole value matches;
                           no unbounded repeat inside an unbounded repeat)
    integer                minimum, maximum
    boolean
    ipv4, ipv6, ip         an address (`192.0.2.1`, `2001:db8::1`)
    prefix, ipv4-prefix,   an address with its prefix length, as on an interface
    ipv6-prefix            (`192.0.2.1/24`; host bits allowed)
    list                   items: one of the types above; every item checked

and `default`, `required` (a device must give a value; no default then) and
`description`. Values are never mappings, so substituting a variable can never
add a key to a document. Addresses and prefixes are kept in their canonical
text (`2001:DB8::1` becomes `2001:db8::1`), so equal values give equal digests.
"""

from __future__ import annotations

import functools
import ipaddress
import re
import re._constants as sre_constants  # type: ignore[import-not-found]
import re._parser as sre_parser  # type: ignore[import-not-found]
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from trueup.model.digests import json_digest
from trueup.model.limits import quoted

__all__ = [
    "SCALAR_TYPES",
    "VARIABLE_NAME",
    "VARIABLE_TYPES",
    "Variable",
    "parse_variable",
    "variables_digest",
]

VARIABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}\Z")

SCALAR_TYPES = (
    "string",
    "integer",
    "boolean",
    "ipv4",
    "ipv6",
    "ip",
    "prefix",
    "ipv4-prefix",
    "ipv6-prefix",
)
VARIABLE_TYPES = (*SCALAR_TYPES, "list")

_FIELDS = ("type", "items", "default", "required", "pattern", "minimum", "maximum", "description")
_MAX_PATTERN = 1000
_NESTED_REPETITION = (
    "a repeated group that itself repeats without bound (like `(a+)+`) can take exponential "
    "time to match; make the inner part atomic (`((?>[a-z0-9]+)-)*`) or possessive (`a++`)"
)
_BOUNDED = 16  # a repeat of at most this many is not "without bound"
_MAX_STRING = 4096
_MAX_ITEMS = 1024


def _address(value: Any, family: int | None) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected an {_family_word(family)}address as text")
    return _canonical_address(value, family)


@functools.lru_cache(maxsize=65536)
def _canonical_address(value: str, family: int | None) -> str:
    """Parsed once per text (a fleet's values repeat across renders of a plan)."""
    try:
        address = ipaddress.ip_address(value.strip())
    except ValueError:
        raise ValueError(f"{quoted(value)} is not an {_family_word(family)}address") from None
    if family is not None and address.version != family:
        raise ValueError(f"{quoted(value)} is not an IPv{family} address")
    return str(address)


def _prefix(value: Any, family: int | None) -> str:
    if isinstance(value, str) and "/" in value:
        return _canonical_prefix(value, family)
    example = "2001:db8::1/64" if family == 6 else "192.0.2.1/24"
    raise ValueError(
        f"expected an {_family_word(family)}prefix ADDRESS/LENGTH (e.g. {example})"
        + (f", got {quoted(value)}" if isinstance(value, str) else "")
    )


@functools.lru_cache(maxsize=65536)
def _canonical_prefix(value: str, family: int | None) -> str:
    example = "2001:db8::1/64" if family == 6 else "192.0.2.1/24"
    try:
        prefix = ipaddress.ip_interface(value.strip())
    except ValueError:
        raise ValueError(
            f"{quoted(value)} is not an {_family_word(family)}prefix (e.g. {example})"
        ) from None
    if family is not None and prefix.version != family:
        raise ValueError(f"{quoted(value)} is not an IPv{family} prefix")
    return str(prefix)


def _family_word(family: int | None) -> str:
    return "IPv4/IPv6 " if family is None else f"IPv{family} "


class _VariableType(TypedDict):
    type: str


class VariableJSON(_VariableType, total=False):
    """A variable's declaration as a profile document holds it (`Variable.as_json`)."""

    items: str
    default: Any
    required: bool
    pattern: str
    minimum: int
    maximum: int
    description: str


@dataclass(frozen=True)
class Variable:
    """One declared variable. `check(value)` returns the canonical value or raises ValueError."""

    name: str
    type: str
    items: str | None = None
    default: Any = None
    required: bool = False
    pattern: str | None = None
    minimum: int | None = None
    maximum: int | None = None
    description: str = ""

    @property
    def has_default(self) -> bool:
        return self.default is not None

    def check(self, value: Any) -> Any:
        """`value` in canonical form; ValueError saying what was expected otherwise."""
        if self.type == "list":
            if not isinstance(value, list | tuple):
                raise ValueError(f"expected a list of {self.items}, got {_kind(value)}")
            if len(value) > _MAX_ITEMS:
                raise ValueError(f"at most {_MAX_ITEMS} items")
            out = []
            for index, item in enumerate(value):
                try:
                    out.append(self._scalar(str(self.items), item))
                except ValueError as exc:
                    raise ValueError(f"[{index}]: {exc}") from None
            return out
        return self._scalar(self.type, value)

    def _scalar(self, kind: str, value: Any) -> Any:
        if kind == "string":
            if not isinstance(value, str):
                raise ValueError(f"expected a string, got {_kind(value)}")
            if len(value) > _MAX_STRING:
                raise ValueError(f"longer than {_MAX_STRING} characters")
            if self.pattern is not None and re.fullmatch(self.pattern, value) is None:
                raise ValueError(f"{quoted(value)} does not match the pattern {self.pattern}")
            return value
        if kind == "integer":
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"expected an integer, got {_kind(value)}")
            if self.minimum is not None and value < self.minimum:
                raise ValueError(f"{value} is below the minimum {self.minimum}")
            if self.maximum is not None and value > self.maximum:
                raise ValueError(f"{value} is above the maximum {self.maximum}")
            return value
        if kind == "boolean":
            if not isinstance(value, bool):
                raise ValueError(f"expected true or false, got {_kind(value)}")
            return value
        if kind in ("ip", "ipv4", "ipv6"):
            return _address(value, None if kind == "ip" else int(kind[-1]))
        if kind in ("prefix", "ipv4-prefix", "ipv6-prefix"):
            return _prefix(value, None if kind == "prefix" else int(kind[3]))
        raise ValueError(f"unknown type {kind}")  # refused when the profile is parsed

    def from_text(self, text: str) -> Any:
        """A value given as text on a command line (`mtu=9000`, `ntp=192.0.2.1,192.0.2.2`),
        converted to this variable's type and checked."""
        if self.type == "list":
            parts = [p.strip() for p in text.split(",")] if text.strip() else []
            return self.check([_from_text(str(self.items), p) for p in parts])
        return self.check(_from_text(self.type, text))

    def as_json(self) -> VariableJSON:
        out: VariableJSON = {"type": self.type}
        if self.items is not None:
            out["items"] = self.items
        if self.default is not None:
            out["default"] = self.default
        if self.required:
            out["required"] = True
        if self.pattern is not None:
            out["pattern"] = self.pattern
        if self.minimum is not None:
            out["minimum"] = self.minimum
        if self.maximum is not None:
            out["maximum"] = self.maximum
        if self.description:
            out["description"] = self.description
        return out

    def schema_key(self) -> tuple[Any, ...]:
        """What two declarations of the same name must agree on."""
        return (self.type, self.items)


def _from_text(kind: str, text: str) -> Any:
    if kind == "integer":
        try:
            return int(text.strip())
        except ValueError:
            return text
    if kind == "boolean":
        lowered = text.strip().lower()
        return {"true": True, "false": False}.get(lowered, text)
    return text


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return f"a number ({value})"
    if isinstance(value, str):
        return f"the string {quoted(value)}"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return type(value).__name__


def parse_variable(name: str, data: Any) -> tuple[Variable | None, list[tuple[str, str]]]:
    """A declaration from a profile's `spec.variables.NAME`; problems as (suffix, message)
    pairs, the suffix relative to `variables.NAME` ("" for the variable itself)."""
    problems: list[tuple[str, str]] = []
    if not VARIABLE_NAME.match(name):
        problems.append(("", "not a variable name (a letter or _, then letters, digits, _)"))
    if not isinstance(data, Mapping):
        return None, [*problems, ("", "expected a mapping with at least a type")]
    for key in data:
        if key not in _FIELDS:
            problems.append((f".{key}", f"unknown field; expected one of {', '.join(_FIELDS)}"))
    kind = data.get("type")
    if kind not in VARIABLE_TYPES:
        problems.append((".type", f"expected one of {', '.join(VARIABLE_TYPES)}"))
        return None, problems
    items = data.get("items")
    if kind == "list":
        if items not in SCALAR_TYPES:
            problems.append((".items", f"a list needs items: one of {', '.join(SCALAR_TYPES)}"))
    elif items is not None:
        problems.append((".items", "only a list has items"))
    scalar = items if kind == "list" else kind
    pattern = data.get("pattern")
    if pattern is not None:
        if scalar != "string":
            problems.append((".pattern", "only a string (or a list of strings) has a pattern"))
        elif not isinstance(pattern, str) or len(pattern) > _MAX_PATTERN:
            problems.append((".pattern", f"expected a regular expression (≤ {_MAX_PATTERN})"))
        else:
            try:
                re.compile(pattern)
            except re.error as exc:
                problems.append((".pattern", f"not a regular expression: {exc}"))
            else:
                if _nested_repetition(pattern):
                    problems.append((".pattern", _NESTED_REPETITION))
    bounds: dict[str, int | None] = {}
    for bound in ("minimum", "maximum"):
        value = data.get(bound)
        bounds[bound] = None
        if value is None:
            continue
        if scalar != "integer":
            problems.append((f".{bound}", "only an integer (or a list of integers) has bounds"))
        elif isinstance(value, bool) or not isinstance(value, int):
            problems.append((f".{bound}", "expected an integer"))
        else:
            bounds[bound] = value
    low, high = bounds["minimum"], bounds["maximum"]
    if low is not None and high is not None and low > high:
        problems.append((".minimum", f"{low} is above the maximum {high}"))
    required = data.get("required", False)
    if not isinstance(required, bool):
        problems.append((".required", "expected true or false"))
        required = False
    description = data.get("description", "")
    if not isinstance(description, str) or len(description) > _MAX_STRING:
        problems.append((".description", f"expected text (≤ {_MAX_STRING} characters)"))
        description = ""
    default = data.get("default")
    if required and default is not None:
        problems.append((".default", "a required variable has no default (each device sets it)"))
    if problems:
        return None, problems
    variable = Variable(
        name=name,
        type=str(kind),
        items=str(items) if items is not None else None,
        default=None,
        required=required,
        pattern=pattern,
        minimum=low,
        maximum=high,
        description=description,
    )
    if default is not None:
        try:
            canonical = variable.check(default)
        except ValueError as exc:
            return None, [(".default", str(exc))]
        variable = Variable(**{**variable.__dict__, "default": canonical})
    return variable, []


def variables_digest(values: Mapping[str, Any]) -> str:
    """The digest of a device's variable values (key order does not matter)."""
    return json_digest(dict(values))


def _nested_repetition(pattern: str) -> bool:
    """Whether `pattern` repeats, without bound, a part that itself repeats without bound
    and may backtrack: the shape (`(a+)+`, `(a*)*`, `([a-z]+-)*`) whose matching time grows
    exponentially with the input. Atomic groups and possessive repeats never backtrack."""

    def walk(items: Any, inside: bool) -> bool:
        for op, av in items:
            if op in (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT):
                _low, high, sub = av
                unbounded = high == sre_constants.MAXREPEAT or high > _BOUNDED
                if (inside and unbounded) or walk(sub, inside or unbounded):
                    return True
                continue
            if op is sre_constants.SUBPATTERN:
                parts = [av[3]]
            elif op is sre_constants.BRANCH:
                parts = list(av[1])
            elif op in (sre_constants.ASSERT, sre_constants.ASSERT_NOT):
                parts = [av[1]]
            else:  # a literal, a class, an atomic group or a possessive repeat
                parts = []
            if any(walk(part, inside) for part in parts):
                return True
        return False

    return walk(sre_parser.parse(pattern), False)
