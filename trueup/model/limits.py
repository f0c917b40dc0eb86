"""The bounds every input is held to, where the agent and the control plane share them.

The control plane's own limits (`trueup.server.limits`) reuse these, and its
columns are declared with them, so what a model accepts always fits storage:
an INTEGER column holds 2^31-1 on PostgreSQL (and on SQLite we keep the same
bound), a `String(n)` column holds n characters. Documents and reports are
also bounded in size and nesting depth before they are decoded.
"""

from __future__ import annotations

__all__ = [
    "CONTROL_CHARACTERS",
    "DIGEST_LENGTH",
    "DOCUMENT_BYTES",
    "EXCERPT_CHARS",
    "MAX_DEPTH",
    "MAX_INT32",
    "MAX_VERSION",
    "ORIGIN_LENGTH",
    "PROBLEM_CHARS",
    "QUOTE_CHARS",
    "REPORT_BYTES",
    "excerpt",
    "has_control_characters",
    "input_excerpt",
    "quoted",
]

MAX_INT32 = 2**31 - 1  # an INTEGER column on both databases
MAX_VERSION = MAX_INT32
DIGEST_LENGTH = 80  # `sha256:` + 64 hex digits, with room for another algorithm
ORIGIN_LENGTH = 32
DOCUMENT_BYTES = 1 << 20  # a desired-state document (JSON or YAML), before decoding
REPORT_BYTES = 1 << 20  # an agent report, before decoding
MAX_DEPTH = 64  # nesting of mappings and lists in a document
EXCERPT_CHARS = 200  # how much of an input an error message quotes
QUOTE_CHARS = 80  # how much of one value a document problem quotes
# A document problem longer than this can only be quoting a huge input (a library's own
# message repeating it): what is past it is cut, marked as an input excerpt.
PROBLEM_CHARS = 1000

# C0 controls (NUL included) and DEL: refused in names and in text that is stored.
CONTROL_CHARACTERS = "".join(chr(c) for c in (*range(0x20), 0x7F))
_CONTROLS = frozenset(CONTROL_CHARACTERS)


def has_control_characters(text: str, *, allow: str = "") -> bool:
    """True if `text` holds a C0 control character or DEL (other than those in `allow`)."""
    return any(c in _CONTROLS and c not in allow for c in text)


def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """`text` cut to `limit` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit} more characters)"


def input_excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """A piece of user input quoted in a message, cut to `limit` characters and marked as
    such: a message itself is never cut, only what it quotes."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… (input excerpt, {len(text) - limit} more characters)"


def quoted(value: object, limit: int = QUOTE_CHARS) -> str:
    """`repr(value)` as a message quotes user input: at most `limit` characters of it."""
    return input_excerpt(repr(value), limit)
