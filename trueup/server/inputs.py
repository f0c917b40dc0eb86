"""One input layer: each value a caller sends, declared once, for the JSON API and the dashboard.

A `Rule` is a value's type, its bounds (those of the column it reaches, `limits.py`) and
what it expects, in words. The API's request models and its path, query and header
parameters take their constraints from a rule (`rule.field()`, `rule.path()`,
`rule.query()`, `rule.header()`), so the OpenAPI document states them; the dashboard parses
its form fields, query strings and path parameters with `rule.parse(field, raw)`, which
raises `InputError` naming the field, what is expected and what was given; the service
checks the values it stores with `rule.problems(field, value)`. So a value is refused the
same way (422, the field named) wherever it comes in, and nothing is stored that the API
would refuse — on SQLite, which would store a NUL, as on PostgreSQL, which refuses one.

Numbers sent as text are ASCII digits only: Python's `int()` takes '٣' and `str.isdigit()`
passes '²', which `int()` then refuses; pydantic takes ' 1_2' and '12.0'. An integer rule's
text must be `[0-9]+` and within its bounds (an INTEGER column: at most 2^31-1).

Callers: `api/models.py`, `api/responses.py` and the route modules (schemas and
parameters), `dashboard/` (forms, query strings, path parameters), `service/` (defence in
depth for what it stores). It imports only `limits` and the libraries.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, TypedDict

from fastapi import Path, Query
from pydantic import Field, GetCoreSchemaHandler, TypeAdapter, ValidationError
from pydantic_core import PydanticCustomError, core_schema

from trueup.model.jsontypes import JSONObject
from trueup.model.limits import quoted
from trueup.server.limits import (
    DEVICE_NAME_LENGTH,
    MAX_INT32,
    MAX_VERSION,
    NAME_LENGTH,
    QUERY_LENGTH,
    SUBSYSTEM_LENGTH,
    TEXT_LENGTH,
    TOKEN_LABEL_LENGTH,
    has_control_characters,
)

__all__ = [
    "ACK_REASON",
    "ACK_SECONDS",
    "COMMENT",
    "COMMENT_HEADER",
    "DELETED_MARK",
    "DEVICE",
    "DEVICE_NAME_PATTERN",
    "EXPECTED_VERSION",
    "IDENTIFIER",
    "IF_MATCH",
    "IF_MATCH_PATTERN",
    "LABEL",
    "MAX_ACK_SECONDS",
    "NAME",
    "NAME_PATTERN",
    "PAGE",
    "REVISION",
    "SEARCH",
    "SUBSYSTEM",
    "TARGET_NAME",
    "TEXT",
    "AckReason",
    "AckSeconds",
    "Comment",
    "DeviceName",
    "DevicePath",
    "IdPath",
    "InputError",
    "Label",
    "Name",
    "NamePath",
    "Revision",
    "RevisionPath",
    "Rule",
    "SubsystemName",
    "TargetName",
    "Text",
    "at_most",
    "check_label",
    "check_text",
]

MAX_ACK_SECONDS = 30 * 86400.0

NAME_PATTERN = rf"^[A-Za-z0-9][A-Za-z0-9_.\-]{{0,{NAME_LENGTH - 1}}}$"
DEVICE_NAME_PATTERN = rf"^[A-Za-z0-9][A-Za-z0-9_.\-]{{0,{DEVICE_NAME_LENGTH - 1}}}$"
_SUBSYSTEM_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$"
# Stored free text: no C0 control character (NUL included) or DEL, but tab and newline.
# The pattern is what the OpenAPI document states; `check_text` checks the same set.
_TEXT_PATTERN = r"^[^\x00-\x08\x0b-\x1f\x7f]*$"
_LABEL_PATTERN = r"^[^\x00-\x1f\x7f]*$"
# Not blank (`str.strip()` leaves something), and free text as above.
_NOT_BLANK_TEXT_PATTERN = (
    r"^[^\x00-\x08\x0b-\x1f\x7f]*[^\s\x00-\x1f\x7f][^\x00-\x08\x0b-\x1f\x7f]*$"
)
_DIGITS = re.compile(r"[0-9]+", re.ASCII)
_MAX_DIGITS = 20  # more than any bound here needs; int() of a huge text is never tried


def at_most(limit: int) -> str:
    """A regular expression (no anchors) for the decimal numbers 0 to `limit`, with any
    leading zeros: what a header's pattern can say of a bounded number."""
    text = str(limit)
    alternatives = []
    # As many digits as `limit`: its first i digits, then a smaller one, then any.
    for i, digit in enumerate(text):
        low = 1 if i == 0 else 0
        if int(digit) > low:
            span = str(low) if int(digit) - 1 == low else f"[{low}-{int(digit) - 1}]"
            rest = len(text) - i - 1
            alternatives.append(text[:i] + span + (f"[0-9]{{{rest}}}" if rest else ""))
    alternatives.append(text)
    # Fewer digits.
    if len(text) > 1:
        alternatives.append(f"[1-9][0-9]{{0,{len(text) - 2}}}")
    alternatives.append("0")
    return "0*(?:" + "|".join(alternatives) + ")"


class InputError(ValueError):
    """A value that breaks its rule: `field: expected …; got '…'`."""

    def __init__(self, field_name: str, expected: str, got: object) -> None:
        self.field = field_name
        self.expected = expected
        self.got = got
        super().__init__(f"{field_name}: expected {expected}; got {quoted(got)}")


def _ascii_integer(value: object) -> object:
    if isinstance(value, str):
        if len(value) > _MAX_DIGITS or not _DIGITS.fullmatch(value):
            raise ValueError("not a number in ASCII digits")
        return int(value)
    return value


def check_text(value: str) -> str:
    if has_control_characters(value, allow="\t\n"):
        raise ValueError("control characters (NUL, escape, …) are not accepted")
    return value


def check_label(value: str) -> str:
    if has_control_characters(value):
        raise ValueError("control characters (NUL, escape, newline, …) are not accepted")
    return value


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be blank")
    return value


class _Described(TypedDict):
    """What a field, path or query parameter says of itself in the OpenAPI document."""

    description: str
    json_schema_extra: JSONObject | None  # a JSON Schema fragment


@dataclass(frozen=True, eq=False)
class Rule:
    """A value's type, bounds and checks, and what it expects in words (`expected`).

    `bounds` are pydantic/FastAPI constraint arguments (pattern, min_length, max_length,
    ge, le, gt, allow_inf_nan); `checks` run after them with a message of their own, and
    `schema` adds what the OpenAPI document says of those checks (a pattern)."""

    expected: str
    kind: type
    bounds: Mapping[str, Any]
    checks: tuple[Callable[[Any], Any], ...] = ()
    schema: Mapping[str, Any] = field(default_factory=dict)

    def _extra(self) -> _Described:
        return {"description": self.expected, "json_schema_extra": dict(self.schema) or None}

    def field(self, *default: Any) -> Any:
        """The constraints for a request model's field (`pydantic.Field`)."""
        return Field(*default, **self.bounds, **self._extra())

    def path(self) -> Any:
        return Path(**self.bounds, **self._extra())

    def query(self, default: Any = None) -> Any:
        return Query(default, **self.bounds, **self._extra())

    def header(self, name: str) -> JSONObject:  # an OpenAPI parameter object
        """An optional header as an OpenAPI parameter (for `openapi_extra`): the route reads
        and parses the header itself (with `parse` or its own parser), so its message says
        what is expected, and an absent header can mean something of its own (428)."""
        names = {"pattern": "pattern", "max_length": "maxLength", "min_length": "minLength"}
        stated = {names[k]: v for k, v in self.bounds.items()}
        return {
            "name": name,
            "in": "header",
            "required": False,
            "description": self.expected,
            "schema": {"type": "string", **stated},
        }

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        """As the last annotation of a type (`Annotated[str, RULE.field(), RULE]`): the
        bounds before it (the schema states them), then the integer-text check and the
        rule's own checks, and every refusal in the rule's words."""
        schema = handler(source)
        for check in self.checks:
            schema = core_schema.no_info_after_validator_function(check, schema)
        if self.kind is int:
            schema = core_schema.no_info_before_validator_function(_ascii_integer, schema)
        return core_schema.no_info_wrap_validator_function(self._in_words, schema)

    def _in_words(self, value: Any, validate: core_schema.ValidatorFunctionWrapHandler) -> Any:
        try:
            return validate(value)
        except ValidationError:
            raise PydanticCustomError(
                "input_rule",
                "expected {expected}; got {got}",
                {"expected": self.expected, "got": quoted(value)},
            ) from None

    def annotated(self) -> Any:
        """`Annotated[kind, constraints, self]`: the type the dashboard parses text with."""
        return Annotated[self.kind, Field(**self.bounds), self]

    def adapter(self) -> TypeAdapter[Any]:
        return _adapter(self)

    def parse(self, field_name: str, raw: object) -> Any:
        """`raw` (text from a form, a query string or a path) as this rule's value, or
        `InputError` naming `field_name`."""
        try:
            return self.adapter().validate_python(raw)
        except ValidationError:
            raise InputError(field_name, self.expected, raw) from None

    def problems(self, field_name: str, value: object) -> list[str]:
        """[] if `value` keeps this rule, else the one problem naming `field_name`."""
        try:
            self.parse(field_name, value)
        except InputError as exc:
            return [str(exc)]
        return []


_ADAPTERS: dict[int, TypeAdapter[Any]] = {}


def _adapter(rule: Rule) -> TypeAdapter[Any]:
    found = _ADAPTERS.get(id(rule))
    if found is None:
        found = _ADAPTERS[id(rule)] = TypeAdapter(rule.annotated())
    return found


def _number(expected: str, low: int, high: int) -> Rule:
    return Rule(f"{expected} between {low} and {high}", int, {"ge": low, "le": high})


_NAME_WORDS = "letters, digits, '_', '.', '-', starting with a letter or digit"

NAME = Rule(
    f"a name ({_NAME_WORDS}; 1-{NAME_LENGTH} characters)",
    str,
    {"min_length": 1, "max_length": NAME_LENGTH, "pattern": NAME_PATTERN},
)
DEVICE = Rule(
    f"a device name ({_NAME_WORDS}; 1-{DEVICE_NAME_LENGTH} characters)",
    str,
    {"min_length": 1, "max_length": DEVICE_NAME_LENGTH, "pattern": DEVICE_NAME_PATTERN},
)
SUBSYSTEM = Rule(
    f"a subsystem name ({_NAME_WORDS}; 1-{SUBSYSTEM_LENGTH} characters)",
    str,
    {"min_length": 1, "max_length": SUBSYSTEM_LENGTH, "pattern": _SUBSYSTEM_PATTERN},
)
DELETED_MARK = ".deleted-"  # in a deleted notification target's name


def _not_deleted_mark(value: str) -> str:
    if DELETED_MARK in value:
        raise ValueError(f"{DELETED_MARK!r} marks deleted targets; choose another name")
    return value


TARGET_NAME = Rule(
    f"a target name ({_NAME_WORDS}; 1-{NAME_LENGTH} characters; not containing {DELETED_MARK!r})",
    str,
    NAME.bounds,
    (_not_deleted_mark,),
    {"not": {"pattern": r"\.deleted-"}},
)
REVISION = _number("a revision number", 1, MAX_VERSION)
# The version a write expects to replace (If-Match): 0 for a device without revisions;
# the last version cannot be replaced (its successor would not fit).
EXPECTED_VERSION = _number("the version you expect to replace (If-Match)", 0, MAX_VERSION - 1)
_IF_MATCH_VERSION = at_most(MAX_VERSION - 1)
IF_MATCH_PATTERN = rf'^[ \t]*(?:W/)?(?:"{_IF_MATCH_VERSION}"|{_IF_MATCH_VERSION})[ \t]*$'
IF_MATCH = Rule(
    "the version you expect to replace: a number from 0 to "
    f'{MAX_VERSION - 1}, as 3, "3" or W/"3" (0 for a device without revisions)',
    str,
    {"pattern": IF_MATCH_PATTERN},
)
# X-Trueup-Comment: HTTP carries header bytes and Starlette reads them as latin-1, so the
# header's pattern says "UTF-8 text without control characters" in latin-1 characters, and
# the length is the header's (at most TEXT_LENGTH bytes).
_UTF8_TEXT_AS_LATIN1 = (
    r"^(?:[\t\x20-\x7e]|[\xc2-\xdf][\x80-\xbf]|\xe0[\xa0-\xbf][\x80-\xbf]"
    r"|[\xe1-\xec\xee\xef][\x80-\xbf]{2}|\xed[\x80-\x9f][\x80-\xbf]"
    r"|\xf0[\x90-\xbf][\x80-\xbf]{2}|[\xf1-\xf3][\x80-\xbf]{3}|\xf4[\x80-\x8f][\x80-\xbf]{2})*$"
)
COMMENT_HEADER = Rule(
    f"a comment: UTF-8 text of at most {TEXT_LENGTH} bytes, without control characters",
    str,
    {"max_length": TEXT_LENGTH, "pattern": _UTF8_TEXT_AS_LATIN1},
)
IDENTIFIER = _number("an id", 1, MAX_INT32)
PAGE = _number("a page number", 1, MAX_INT32)
TEXT = Rule(
    f"text of at most {TEXT_LENGTH} characters, without control characters but tab and newline",
    str,
    {"max_length": TEXT_LENGTH},
    (check_text,),
    {"pattern": _TEXT_PATTERN},
)
COMMENT = TEXT
ACK_REASON = Rule(
    f"a reason: text of 1-{TEXT_LENGTH} characters, not blank, without control characters "
    "but tab and newline",
    str,
    {"min_length": 1, "max_length": TEXT_LENGTH},
    (check_text, _not_blank),
    {"pattern": _NOT_BLANK_TEXT_PATTERN},
)
ACK_SECONDS = Rule(
    f"a number of seconds, more than 0 and at most {int(MAX_ACK_SECONDS)} (30 days)",
    float,
    {"gt": 0, "le": MAX_ACK_SECONDS, "allow_inf_nan": False},
)
LABEL = Rule(
    f"a label of at most {TOKEN_LABEL_LENGTH} characters, without control characters",
    str,
    {"max_length": TOKEN_LABEL_LENGTH},
    (check_label,),
    {"pattern": _LABEL_PATTERN},
)
SEARCH = Rule(
    f"search text of at most {QUERY_LENGTH} characters, without control characters",
    str,
    {"max_length": QUERY_LENGTH},
    (check_label,),
    {"pattern": _LABEL_PATTERN},
)

# The same rules as types: request models' fields and route parameters.
Name = Annotated[str, NAME.field(), NAME]
TargetName = Annotated[str, TARGET_NAME.field(), TARGET_NAME]
NamePath = Annotated[str, NAME.path(), NAME]
DeviceName = Annotated[str, DEVICE.field(), DEVICE]
DevicePath = Annotated[str, DEVICE.path(), DEVICE]
SubsystemName = Annotated[str, SUBSYSTEM.field(), SUBSYSTEM]
Revision = Annotated[int, REVISION.field(), REVISION]
RevisionPath = Annotated[int, REVISION.path(), REVISION]
IdPath = Annotated[int, IDENTIFIER.path(), IDENTIFIER]
Text = Annotated[str, TEXT.field(), TEXT]
Comment = Text
AckReason = Annotated[str, ACK_REASON.field(), ACK_REASON]
AckSeconds = Annotated[float, ACK_SECONDS.field(), ACK_SECONDS]
Label = Annotated[str, LABEL.field(), LABEL]
