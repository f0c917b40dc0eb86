"""Small units with one job: a module over 400 lines says at its top why it is long."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "trueup"
LIMIT = 400
REASON = "Why this module is over 400 lines:"


def test_long_modules_say_why() -> None:
    unexplained = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "migrations" in path.parts:
            continue
        text = path.read_text()
        if text.count("\n") <= LIMIT:
            continue
        docstring = ast.get_docstring(ast.parse(text)) or ""
        if REASON not in docstring:
            unexplained.append(f"{path.relative_to(PACKAGE.parent)} ({text.count(chr(10))} lines)")
    assert not unexplained, "split these, or say why at their top: " + ", ".join(unexplained)
