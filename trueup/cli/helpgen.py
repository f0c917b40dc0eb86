"""Generates `trueup.cli.helptext.HELP` from the typer app, with typer's own rich helpers.

Imports typer and rich: for maintainers and tests, never on the CLI's path.
`python -m trueup.cli.helpgen --write` rewrites the `HELP = …` line of
`trueup/cli/helptext.py`; without `--write` it prints that line.
"""

from __future__ import annotations

import sys
from typing import Any

from trueup.cli import helptext
from trueup.cli.helptext import Piece

__all__ = ["generate", "write"]


def generate() -> dict[str, Any]:
    """What `HELP` holds, from the typer app and typer's own rich helpers (as lists)."""
    import typer
    import typer.rich_utils as ru
    from rich.cells import cell_len
    from rich.color import ColorSystem
    from rich.style import Style
    from rich.text import Text

    from trueup.cli.main import app

    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    ctx = typer.Context(group, info_name="trueup")
    mode = group.rich_markup_mode
    if mode is None:
        raise ValueError("typer renders this help without rich: nothing to reproduce")
    console = ru._get_rich_console()

    def codes(style: Style | None) -> str:
        return "" if style is None else style._make_ansi_codes(ColorSystem.STANDARD)

    def pieces(text: Text, base: str = "") -> list[Piece]:
        if cell_len(text.plain) != len(text.plain):
            raise ValueError(f"{text.plain!r}: characters wider than one cell")
        base_style = console.get_style(base) if base else None
        out = []
        for segment in text.render(console, end=""):
            style = segment.style
            if base_style is not None:
                style = base_style + style if style is not None else base_style
            out.append((segment.text, codes(style)))
        return out

    usage = pieces(ru.highlighter(group.get_usage(ctx)), ru.STYLE_USAGE_COMMAND)
    description = []
    for renderable in ru._get_help_text(obj=group, markup_mode=mode).renderables:
        assert isinstance(renderable, Text)
        description.append(pieces(renderable))
    params = [p for p in group.get_params(ctx) if not getattr(p, "hidden", False)]
    options = []
    cells: list[list[Text]] = []
    for param in params:
        if getattr(param, "rich_help_panel", None) or not isinstance(param, typer.core.TyperOption):
            raise ValueError(f"{param.name}: only plain options are laid out here")
        longs = [o for o in param.opts if "--" in o]
        shorts = [o for o in param.opts if "--" not in o]
        types = Text(style=ru.STYLE_TYPES, overflow="fold")
        types.append(param.display_type_rich(ctx=ctx) or "")
        cells.append(
            [
                ru.highlighter(",".join(longs)),
                ru.highlighter(",".join(shorts)),
                ru.negative_highlighter(""),
                ru.negative_highlighter(""),
                ru.types_highlighter(types),
            ]
        )
        columns = ru._get_parameter_help(param=param, ctx=ctx, markup_mode=mode)
        if len(columns.renderables) != 1:
            raise ValueError(f"{param.name}: defaults and env vars are not laid out here")
        (help_text,) = columns.renderables
        assert isinstance(help_text, Text)
        options.append(pieces(help_text))
    widths = [max(len(row[i].plain) for row in cells) for i in range(5)]
    prefix_rows = []
    for row in cells:
        lead: list[Piece] = []
        for index, (cell, size) in enumerate(zip(row, widths, strict=True)):
            if index:
                lead.append((" ", ""))
            pad = " " * (size - len(cell.plain))
            if index == 4 and cell.plain and not cell.plain.startswith("<"):
                # A metavar (`NAME`): typer styles it and its padding as one piece.
                lead.append((cell.plain + pad, codes(console.get_style(ru.STYLE_TYPES))))
                pad = ""
            else:
                lead += pieces(cell)
            lead.append((pad + " ", ""))
        lead.append((" ", ""))  # the help column's left padding
        merged: list[Piece] = []
        for text, style in lead:
            if merged and not style and not merged[-1][1]:
                merged[-1] = (merged[-1][0] + text, "")
            elif text:
                merged.append((text, style))
        prefix_rows.append(merged)
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
        assert isinstance(command_help, Text)
        commands.append([command.name or "", pieces(command_help)])
    help_: dict[str, Any] = _lists(
        {
            "usage": usage,
            "usage_style": codes(console.get_style(ru.STYLE_USAGE_COMMAND)),
            "description": description,
            "options": [[lead, help_] for lead, help_ in zip(prefix_rows, options, strict=True)],
            "options_prefix": sum(widths) + 2 * 5 - 1 + 1,
            "commands": commands,
            "command_width": max(len(c[0]) for c in commands),
            "border": codes(console.get_style(ru.STYLE_OPTIONS_PANEL_BORDER)),
            "command_style": codes(console.get_style(ru.STYLE_COMMANDS_TABLE_FIRST_COLUMN)),
        }
    )
    return help_


def write(path: str = helptext.__file__) -> None:
    with open(path, encoding="utf-8") as stream:
        source = stream.read()
    start = source.index("HELP: dict[str, Any] = ")
    end = source.index("\n", start)
    literal = f"HELP: dict[str, Any] = {generate()!r}"
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
        print(f"HELP: dict[str, Any] = {generate()!r}")
