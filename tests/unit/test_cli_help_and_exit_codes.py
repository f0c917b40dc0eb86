"""A command's help wraps its paragraphs at the terminal's width, not where the source
broke the docstring. A usage error of a command whose exit 2 means "changes" (`plan`, `fleet plan`) or "drift"
(`drift`) exits 1, so a script never reads a typo as pending changes; other commands keep
click's 2."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from trueup.cli.main import app


@pytest.mark.parametrize(
    "args",
    [
        ["fleet", "plan", "--profle", "edge-mtu.yaml"],
        ["fleet", "plan", "-l"],
        ["plan", "--nosuch", "doc.yaml"],
        ["plan"],
        ["drift", "--bogus"],
    ],
)
def test_a_usage_error_of_plan_or_drift_exits_1_not_2(args: list[str]) -> None:
    result = CliRunner().invoke(app, args, env={"TRUEUP_SERVER": "http://127.0.0.1:9"})
    assert result.exit_code == 1, result.output
    assert "Error" in result.output


def test_other_commands_keep_clicks_usage_exit_code() -> None:
    result = CliRunner().invoke(app, ["fleet", "publish", "--nosuch"])
    assert result.exit_code == 2, result.output
    assert "No such option: --nosuch" in result.output


def test_help_paragraphs_wrap_at_the_terminal_not_at_the_docstrings_breaks() -> None:
    result = CliRunner().invoke(app, ["fleet", "vars", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    lines = [line.strip() for line in result.output.splitlines()]
    assert any(
        line.startswith("NAME=VALUE takes VALUE as JSON") and "else as text; NAME- removes" in line
        for line in lines
    ), result.output
    narrow = CliRunner().invoke(app, ["fleet", "--help"], env={"COLUMNS": "80"})
    assert "last report, in sync since." in narrow.output, narrow.output
