"""Small units with one job.

A module over 400 lines says at its top why it is long; none is over 600, and
no function is over 100 lines (a route registrar included: one registrar per
page or route group). Database migrations are history, not design, and are
left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "trueup"
EXPLAIN = 400
MODULE_LIMIT = 600
FUNCTION_LIMIT = 100
REASON = "Why this module is over 400 lines:"


def _modules() -> list[Path]:
    return [p for p in sorted(PACKAGE.rglob("*.py")) if "migrations" not in p.parts]


def _name(path: Path) -> str:
    return str(path.relative_to(PACKAGE.parent))


def test_long_modules_say_why() -> None:
    unexplained = []
    for path in _modules():
        text = path.read_text()
        if text.count("\n") <= EXPLAIN:
            continue
        docstring = ast.get_docstring(ast.parse(text)) or ""
        if REASON not in docstring:
            unexplained.append(f"{_name(path)} ({text.count(chr(10))} lines)")
    assert not unexplained, "split these, or say why at their top: " + ", ".join(unexplained)


def test_no_module_is_over_600_lines() -> None:
    long = [
        f"{_name(p)} ({n} lines)"
        for p in _modules()
        if (n := p.read_text().count("\n")) > MODULE_LIMIT
    ]
    assert not long, f"split these below {MODULE_LIMIT} lines: " + ", ".join(long)


def test_no_function_is_over_100_lines() -> None:
    long = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > FUNCTION_LIMIT:
                    long.append(f"{_name(path)}:{node.lineno} {node.name} ({length} lines)")
    assert not long, f"split these below {FUNCTION_LIMIT} lines: " + ", ".join(long)


def test_the_limits_catch_a_long_function(tmp_path: Path) -> None:
    """The walk sees nested functions (a registrar's routes) and decorators' bodies."""
    body = "\n".join(f"        x{i} = {i}" for i in range(FUNCTION_LIMIT))
    source = f"def register():\n    def route():\n{body}\n    return route\n"
    found = [
        n.name
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.FunctionDef)
        and (n.end_lineno or n.lineno) - n.lineno + 1 > FUNCTION_LIMIT
    ]
    assert found == ["register", "route"]
