"""Decoding untrusted JSON and YAML text with bounded cost.

A document is refused, with a message quoting at most a short excerpt, when

- it is larger than its limit (checked before decoding);
- it nests mappings and lists deeper than `MAX_DEPTH` (checked while
  composing YAML, and after decoding JSON; a JSON text deep enough to exhaust
  the decoder's recursion is refused the same way);
- it is YAML with an alias (`*name`): aliases let a few hundred bytes expand
  to gigabytes ("billion laughs"), and a trueup document never needs one.
  Anchors without aliases are harmless and allowed.
- a string (key or value) holds a lone surrogate (`"\\ud800"`, which JSON and
  YAML escapes can produce): it is not Unicode text, cannot be encoded as
  UTF-8, and would fail whatever answers or stores it.

The decoders raise `DecodeError` (a ValueError) with one line saying what is
wrong and where.
"""

from __future__ import annotations

import json
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.events import AliasEvent
from yaml.nodes import Node

from trueup.model.limits import DOCUMENT_BYTES, MAX_DEPTH, excerpt

__all__ = ["DecodeError", "check_tree", "decode_json", "decode_yaml"]


class DecodeError(ValueError):
    pass


def _check_size(text: str | bytes, max_bytes: int) -> str:
    size = len(text) if isinstance(text, bytes) else len(text.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise DecodeError(f"too large: {size} bytes, at most {max_bytes} are accepted")
    if isinstance(text, bytes):
        try:
            return text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DecodeError(f"not UTF-8 text (byte {exc.start})") from None
    return text


def _check_text(text: str) -> None:
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise DecodeError(
                f"a string holds a lone surrogate (\\u{ord(text[exc.start]):04x}), "
                "which is not Unicode text"
            ) from None


def check_tree(value: Any, max_depth: int = MAX_DEPTH) -> None:
    """Raise DecodeError if mappings and lists nest deeper than `max_depth`, or a key or
    value is a string that is not Unicode text (a lone surrogate). Iterative."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            _check_text(item)
            continue
        if isinstance(item, dict):
            children: Any = [*item.keys(), *item.values()]
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > max_depth:
            raise DecodeError(f"nested deeper than {max_depth} levels")
        stack.extend((child, depth + 1) for child in children)


def decode_json(
    text: str | bytes, *, max_bytes: int = DOCUMENT_BYTES, max_depth: int = MAX_DEPTH
) -> Any:
    decoded = _check_size(text, max_bytes)
    try:
        value = json.loads(decoded)
    except RecursionError:
        raise DecodeError(f"nested deeper than {max_depth} levels") from None
    except json.JSONDecodeError as exc:
        raise DecodeError(
            f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise DecodeError(f"not valid JSON: {excerpt(str(exc))}") from None
    check_tree(value, max_depth)
    return value


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses aliases and nesting deeper than `max_depth`."""

    max_depth = MAX_DEPTH

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        if self.check_event(AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise ComposerError(
                None,
                None,
                "aliases (*name) are not accepted in a trueup document",
                event.start_mark,
            )
        self._depth += 1
        if self._depth > self.max_depth:
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise ComposerError(
                None, None, f"nested deeper than {self.max_depth} levels", event.start_mark
            )
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _yaml_message(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError):
        where = exc.problem_mark
        at = f" at line {where.line + 1} column {where.column + 1}" if where is not None else ""
        return excerpt(f"{exc.problem or exc.context or 'invalid'}{at}")
    return excerpt(str(exc))


def decode_yaml(
    text: str | bytes, *, max_bytes: int = DOCUMENT_BYTES, max_depth: int = MAX_DEPTH
) -> Any:
    decoded = _check_size(text, max_bytes)
    try:
        # The reader checks the text as the loader is made: a control character is refused there.
        loader = _BoundedLoader(decoded)
    except yaml.YAMLError as exc:
        raise DecodeError(f"not valid YAML: {_yaml_message(exc)}") from None
    loader.max_depth = max_depth
    try:
        value = loader.get_single_data()
    except yaml.YAMLError as exc:
        raise DecodeError(f"not valid YAML: {_yaml_message(exc)}") from None
    except RecursionError:
        raise DecodeError(f"nested deeper than {max_depth} levels") from None
    except ValueError as exc:  # a scalar the constructor refuses (huge integer, bad date)
        raise DecodeError(f"not valid YAML: {excerpt(str(exc))}") from None
    finally:
        loader.dispose()
    check_tree(value, max_depth)
    return value
