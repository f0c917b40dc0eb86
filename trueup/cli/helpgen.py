"""Generates `trueup.cli.helptext.HELP` from the typer app, with typer's own rich helpers.

Imports typer and rich: for maintainers and tests, never on the CLI's path.
`python -m trueup.cli.helpgen --write` rewrites the `HELP = …` line of
`trueup/cli/helptext.py`; without `--write` it prints that line.
"""

from __future__ import annotations

import sys
from typing import Any

from trueup.cli import helptext
from trueup.cli.bodies import HelpScreen
from trueup.cli.helptext import Piece

__all__ = ["generate", "write"]


def generate() -> HelpScreen:
    """What `HELP` holds, from the typer app and typer's own rich helpers (as lists)."""
    import typer
    import typer.rich_utils as ru

    from trueup.cli.main import app

    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    ctx = typer.Context(group, info_name="trueup")
    mode = group.rich_markup_mode
    if mode is None:
        raise ValueError("typer renders this help without rich: nothing to reproduce")
    rich = _Rich(ru._get_rich_console())
    description = []
    for renderable in ru._get_help_text(obj=group, markup_mode=mode).renderables:
        description.append(rich.pieces(renderable))
    prefix_rows, options, prefix = _option_rows(group, ctx, mode, rich)
    commands = _command_rows(group, ctx, mode, rich)
    help_: HelpScreen = _lists(
        {
            "usage": rich.pieces(ru.highlighter(group.get_usage(ctx)), ru.STYLE_USAGE_COMMAND),
            "usage_style": rich.style(ru.STYLE_USAGE_COMMAND),
            "description": description,
            "options": [[lead, help_] for lead, help_ in zip(prefix_rows, options, strict=True)],
            "options_prefix": prefix,
            "commands": commands,
            "command_width": max(len(c[0]) for c in commands),
            "border": rich.style(ru.STYLE_OPTIONS_PANEL_BORDER),
            "command_style": rich.style(ru.STYLE_COMMANDS_TABLE_FIRST_COLUMN),
        }
    )
    return help_


class _Rich:
    """Text as rich renders it on typer's console: pieces of text and their SGR codes."""

    def __init__(self, console: Any) -> None:
        self.console = console

    def codes(self, style: Any) -> str:
        from rich.color import ColorSystem

        return "" if style is None else str(style._make_ansi_codes(ColorSystem.STANDARD))

    def style(self, name: str) -> str:
        return self.codes(self.console.get_style(name))

    def pieces(self, text: Any, base: str = "") -> list[Piece]:
        from rich.cells import cell_len
        from rich.text import Text

        assert isinstance(text, Text)
        if cell_len(text.plain) != len(text.plain):
            raise ValueError(f"{text.plain!r}: characters wider than one cell")
        base_style = self.console.get_style(base) if base else None
        out = []
        for segment in text.render(self.console, end=""):
            style = segment.style
            if base_style is not None:
                style = base_style + style if style is not None else base_style
            out.append((segment.text, self.codes(style)))
        return out


def _option_rows(
    group: Any, ctx: Any, mode: Any, rich: _Rich
) -> tuple[list[list[Piece]], list[list[Piece]], int]:
    """The options panel: each row's lead (flags, metavar) and help, and the help's column."""
    import typer
    import typer.rich_utils as ru
    from rich.text import Text

    options = []
    cells: list[list[Text]] = []
    for param in [p for p in group.get_params(ctx) if not getattr(p, "hidden", False)]:
        if getattr(param, "rich_help_panel", None) or not isinstance(param, typer.core.TyperOption):
            raise ValueError(f"{param.name}: only plain options are laid out here")
        types = Text(style=ru.STYLE_TYPES, overflow="fold")
        types.append(param.display_type_rich(ctx=ctx) or "")
        cells.append(
            [
                ru.highlighter(",".join(o for o in param.opts if "--" in o)),
                ru.highlighter(",".join(o for o in param.opts if "--" not in o)),
                ru.negative_highlighter(""),
                ru.negative_highlighter(""),
                ru.types_highlighter(types),
            ]
        )
        columns = ru._get_parameter_help(param=param, ctx=ctx, markup_mode=mode)
        if len(columns.renderables) != 1:
            raise ValueError(f"{param.name}: defaults and env vars are not laid out here")
        options.append(rich.pieces(columns.renderables[0]))
    widths = [max(len(row[i].plain) for row in cells) for i in range(5)]
    return [_lead(row, widths, rich) for row in cells], options, sum(widths) + 2 * 5 - 1 + 1


def _lead(row: list[Any], widths: list[int], rich: _Rich) -> list[Piece]:
    """One option's cells padded to their columns, as rich lays the table out."""
    import typer.rich_utils as ru

    lead: list[Piece] = []
    for index, (cell, size) in enumerate(zip(row, widths, strict=True)):
        if index:
            lead.append((" ", ""))
        pad = " " * (size - len(cell.plain))
        if index == 4 and cell.plain and not cell.plain.startswith("<"):
            # A metavar (`NAME`): typer styles it and its padding as one piece.
            lead.append((cell.plain + pad, rich.style(ru.STYLE_TYPES)))
            pad = ""
        else:
            lead += rich.pieces(cell)
        lead.append((pad + " ", ""))
    lead.append((" ", ""))  # the help column's left padding
    merged: list[Piece] = []
    for text, style in lead:
        if merged and not style and not merged[-1][1]:
            merged[-1] = (merged[-1][0] + text, "")
        elif text:
            merged.append((text, style))
    return merged


def _command_rows(group: Any, ctx: Any, mode: Any, rich: _Rich) -> list[list[Any]]:
    """The commands panel: each command's name and its help's first paragraph."""
    import typer.rich_utils as ru

    commands: list[list[Any]] = []
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if command is None or command.hidden:
            continue
        if command.deprecated or getattr(command, "rich_help_panel", None):
            raise ValueError(f"{name}: deprecated commands and panels are not laid out here")
        command_help = ru._make_command_help(
            help_text=command.short_help or command.help or "", markup_mode=mode
        )
        commands.append([command.name or "", rich.pieces(command_help)])
    return commands


def write(path: str = helptext.__file__) -> None:
    with open(path, encoding="utf-8") as stream:
        source = stream.read()
    start = source.index("HELP: HelpScreen = ")
    end = source.index("\n", start)
    literal = f"HELP: HelpScreen = {generate()!r}"
    with open(path, "w", encoding="utf-8") as stream:
        stream.write(source[:start] + literal + source[end:])


def _lists(value: Any) -> Any:
    """Lists for tuples: what the literal in helptext.py reads back as."""
    if isinstance(value, (list, tuple)):
        return [_lists(v) for v in value]
    if isinstance(value, dict):
        return {k: _lists(v) for k, v in value.items()}
    return value


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write()
    else:
        print(f"HELP: HelpScreen = {generate()!r}")
