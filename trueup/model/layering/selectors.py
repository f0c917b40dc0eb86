"""Device labels and label selectors, in the Kubernetes syntax and with its rules.

A selector is a comma-separated list of requirements, all of which must hold
(comma = AND); whitespace around tokens is ignored; the empty selector selects
every device:

    site=ams            site==ams       the label is present with this value
    site!=ams                           the label is absent or has another value
    role in (edge,core)                 present, with one of these values
    role notin (lab)                    absent, or none of these values
    edge                                the label is present (any value)
    !lab                                the label is absent

`Selector.text` is the canonical form: requirements sorted by key, `==`
written `=`, set values sorted and de-duplicated, one space around `in` and
`notin`. Parsing the canonical form gives an equal selector.

Label keys are `[prefix/]name`: the optional prefix a DNS subdomain (at most
253 characters), the name 1-63 characters of letters, digits, `-`, `_` and
`.`, beginning and ending with a letter or digit. Values follow the name rule
but may be empty.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "LABEL_KEY_RULE",
    "LABEL_VALUE_RULE",
    "Requirement",
    "Selector",
    "SelectorError",
    "label_key_problem",
    "label_problems",
    "label_value_problem",
    "parse_selector",
]

Operator = Literal["=", "!=", "in", "notin", "exists", "!"]

_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_NAME_MAX = 63
_PREFIX_MAX = 253

LABEL_KEY_RULE = (
    "a label key: [prefix/]name, name 1-63 characters of A-Z, a-z, 0-9, '-', '_', '.' "
    "beginning and ending with a letter or digit, prefix a lowercase DNS subdomain "
    "of at most 253 characters"
)
LABEL_VALUE_RULE = (
    "a label value: empty, or at most 63 characters of A-Z, a-z, 0-9, '-', '_', '.' "
    "beginning and ending with a letter or digit"
)


def label_key_problem(key: object) -> str | None:
    """Why `key` is not a valid label key (None when it is)."""
    if not isinstance(key, str):
        return f"not a string; expected {LABEL_KEY_RULE}"
    if key == "":
        return f"empty; expected {LABEL_KEY_RULE}"
    prefix, slash, name = key.rpartition("/")
    if slash:
        if prefix == "":
            return f"empty prefix before '/'; expected {LABEL_KEY_RULE}"
        if len(prefix) > _PREFIX_MAX:
            return f"prefix is {len(prefix)} characters (at most {_PREFIX_MAX}); expected {LABEL_KEY_RULE}"
        if not _DNS_SUBDOMAIN.fullmatch(prefix):
            return f"prefix {prefix!r} is not a DNS subdomain; expected {LABEL_KEY_RULE}"
    if name == "":
        return f"empty name; expected {LABEL_KEY_RULE}"
    if len(name) > _NAME_MAX:
        return f"name is {len(name)} characters (at most {_NAME_MAX}); expected {LABEL_KEY_RULE}"
    if not _NAME.fullmatch(name):
        return f"name {name!r} has a character not allowed here; expected {LABEL_KEY_RULE}"
    return None


def label_value_problem(value: object) -> str | None:
    """Why `value` is not a valid label value (None when it is)."""
    if not isinstance(value, str):
        return f"value is not a string; expected {LABEL_VALUE_RULE}"
    if value == "":
        return None
    if len(value) > _NAME_MAX:
        return (
            f"value is {len(value)} characters (at most {_NAME_MAX}); expected {LABEL_VALUE_RULE}"
        )
    if not _NAME.fullmatch(value):
        return f"value {value!r} has a character not allowed here; expected {LABEL_VALUE_RULE}"
    return None


def label_problems(labels: Mapping[str, object]) -> list[str]:
    """Every problem with a set of labels, each as `labels.<key>: what is wrong and expected`.

    An empty list means the labels are valid.
    """
    problems: list[str] = []
    for key in sorted(labels, key=str):
        key_problem = label_key_problem(key)
        if key_problem is not None:
            problems.append(f"labels.{key}: key {key_problem}")
        value_problem = label_value_problem(labels[key])
        if value_problem is not None:
            problems.append(f"labels.{key}: {value_problem}")
    return problems


class SelectorError(ValueError):
    """A selector that does not parse; names the (1-based) character position and what was expected."""

    def __init__(self, text: str, position: int, expected: str, found: str) -> None:
        self.text = text
        self.position = position
        self.expected = expected
        self.found = found
        super().__init__(
            f"selector {text!r}: at position {position}: expected {expected}, found {found}"
        )


_OPERATOR_ORDER: dict[Operator, int] = {"exists": 0, "!": 1, "=": 2, "!=": 3, "in": 4, "notin": 5}


@dataclass(frozen=True)
class Requirement:
    """One term of a selector: a key, an operator and the values it compares with."""

    key: str
    operator: Operator
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.operator == "exists":
            return present
        if self.operator == "!":
            return not present
        if self.operator in ("=", "in"):
            return present and value in self.values
        return not present or value not in self.values

    @property
    def text(self) -> str:
        if self.operator == "exists":
            return self.key
        if self.operator == "!":
            return f"!{self.key}"
        if self.operator in ("=", "!="):
            return f"{self.key}{self.operator}{self.values[0]}"
        return f"{self.key} {self.operator} ({','.join(self.values)})"

    def sort_key(self) -> tuple[str, int, tuple[str, ...]]:
        return (self.key, _OPERATOR_ORDER[self.operator], self.values)


@dataclass(frozen=True)
class Selector:
    """A parsed selector: the requirements, all of which must hold (none = every device)."""

    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(requirement.matches(labels) for requirement in self.requirements)

    @property
    def text(self) -> str:
        """The canonical form; `parse_selector(s.text) == s`."""
        return ",".join(requirement.text for requirement in self.requirements)

    @property
    def selects_everything(self) -> bool:
        return not self.requirements

    def __str__(self) -> str:
        return self.text


_Token = tuple[str, str, int]  # (kind, text, 1-based position)
_SPECIAL = {"!=": "!=", "==": "==", "=": "=", "!": "!", "(": "(", ")": ")", ",": ","}
_IDENT_CHARS = re.compile(r"[A-Za-z0-9._/-]+")
_SPACE = re.compile(r"\s+")


def _tokens(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    index = 0
    while index < len(text):
        space = _SPACE.match(text, index)
        if space:
            index = space.end()
            continue
        two = text[index : index + 2]
        if two in ("!=", "=="):
            tokens.append((two, two, index + 1))
            index += 2
            continue
        char = text[index]
        if char in _SPECIAL:
            tokens.append((char, char, index + 1))
            index += 1
            continue
        ident = _IDENT_CHARS.match(text, index)
        if ident is None:
            raise SelectorError(
                text,
                index + 1,
                "a label key, a value or one of = == != ! ( ) , in notin",
                repr(char),
            )
        word = ident.group()
        kind = word if word in ("in", "notin") else "ident"
        tokens.append((kind, word, index + 1))
        index = ident.end()
    tokens.append(("end", "", len(text) + 1))
    return tokens


def _describe(token: _Token) -> str:
    kind, word, _ = token
    if kind == "end":
        return "the end of the selector"
    return repr(word)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokens(text)
        self.index = 0

    def peek(self) -> _Token:
        return self.tokens[self.index]

    def take(self) -> _Token:
        token = self.tokens[self.index]
        self.index += 1
        return token

    def fail(self, token: _Token, expected: str) -> SelectorError:
        return SelectorError(self.text, token[2], expected, _describe(token))

    def key(self) -> str:
        token = self.take()
        if token[0] != "ident":
            raise self.fail(token, "a label key")
        problem = label_key_problem(token[1])
        if problem is not None:
            raise SelectorError(self.text, token[2], LABEL_KEY_RULE, repr(token[1]))
        return token[1]

    def value(self, *, optional: bool) -> str:
        token = self.peek()
        if token[0] not in ("ident", "in", "notin"):
            if optional:
                return ""
            raise self.fail(token, "a label value")
        self.take()
        if label_value_problem(token[1]) is not None:
            raise SelectorError(self.text, token[2], LABEL_VALUE_RULE, repr(token[1]))
        return token[1]

    def requirement(self) -> Requirement:
        if self.peek()[0] == "!":
            self.take()
            return Requirement(self.key(), "!")
        key = self.key()
        token = self.peek()
        kind = token[0]
        if kind in (",", "end"):
            return Requirement(key, "exists")
        if kind in ("=", "==", "!="):
            self.take()
            # `site=` compares with the empty value, as Kubernetes does.
            value = self.value(optional=True)
            return Requirement(key, "!=" if kind == "!=" else "=", (value,))
        if kind in ("in", "notin"):
            self.take()
            opening = self.take()
            if opening[0] != "(":
                raise self.fail(opening, f"'(' after {kind!r}")
            values = {self.value(optional=False)}
            while self.peek()[0] == ",":
                self.take()
                values.add(self.value(optional=False))
            closing = self.take()
            if closing[0] != ")":
                raise self.fail(closing, "',' or ')' in the list of values")
            operator: Operator = "in" if kind == "in" else "notin"
            return Requirement(key, operator, tuple(sorted(values)))
        raise self.fail(token, "one of = == != in notin, ',' or the end of the selector")

    def selector(self) -> Selector:
        if self.peek()[0] == "end":
            return Selector()
        requirements = {self.requirement()}
        while True:
            token = self.take()
            if token[0] == "end":
                break
            if token[0] != ",":
                raise self.fail(token, "',' or the end of the selector")
            requirements.add(self.requirement())
        return Selector(tuple(sorted(requirements, key=Requirement.sort_key)))


def parse_selector(text: str) -> Selector:
    """Parse a Kubernetes-style label selector; raises SelectorError naming the position."""
    if not isinstance(text, str):
        raise SelectorError(repr(text), 1, "a selector string", type(text).__name__)
    return _Parser(text).selector()
