"""What the typer commands share: their declaration (`trueup.cli.commands`) made typer's,
help paragraphs on one line, and usage errors of the commands whose exit 2 means something
(`plan`, `fleet plan`: changes; `drift`: drift).

Click exits 2 on a usage error (an unknown option, a missing value); for those commands a
script would read that as "changes", so their usage errors exit 1 instead, as every other
error of theirs does (terraform's `-detailed-exitcode`: 1 is an error).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import typer
from typer._click.core import Context  # typer vendors click: its own classes, not click's
from typer._click.exceptions import UsageError
from typer.core import TyperCommand

from trueup.cli.commands import COMMANDS, Option

__all__ = ["DetailedExitCommand", "command_option", "declared", "option", "reflow_help"]

Verb = TypeVar("Verb", bound=Callable[..., None])


def option(spec: Option, **typer_only: Any) -> Any:
    """The typer option declared as `spec` (its flags, help, environment variable, metavar);
    `typer_only`: what only typer needs (a callback, `is_eager`)."""
    return typer.Option(
        *spec.flags, help=spec.help, envvar=spec.envvar, metavar=spec.metavar, **typer_only
    )


def command_option(command: str, dest: str, **typer_only: Any) -> Any:
    """The typer option of `COMMANDS[command]` filling `dest`."""
    return option(COMMANDS[command].option(dest), **typer_only)


def declared(app: typer.Typer, name: str) -> Callable[[Verb], Verb]:
    """Register a function as the command `name` of `trueup.cli.commands.COMMANDS` on `app`
    (its last word; `app` is the group's): its name, help and usage-error exit code."""
    spec = COMMANDS[name]
    register = app.command(
        name.rpartition(" ")[2],
        help=spec.help,
        cls=DetailedExitCommand if spec.usage_exit_1 else None,
    )

    def decorate(verb: Verb) -> Verb:
        register(verb)
        return verb

    return decorate


class DetailedExitCommand(TyperCommand):
    """A typer command whose usage errors exit 1, not 2."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: Context | None = None,
        **extra: Any,
    ) -> Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except UsageError as exc:
            exc.exit_code = 1
            raise


def reflow_help(app: typer.Typer) -> None:
    """Give every command of `app` (and of its groups) its docstring with each paragraph
    on one line: typer's rich help keeps a docstring's line breaks after the first
    paragraph, so text wrapped at 100 columns in the source came out ragged at 80. A
    paragraph with an indented line (an example) or a `\\b` keeps its breaks."""
    import inspect

    for command in app.registered_commands:
        if command.help is None and command.callback is not None:
            text = inspect.getdoc(command.callback)
            if text:
                command.help = _reflowed(text)
    for group in app.registered_groups:
        if group.typer_instance is not None:
            reflow_help(group.typer_instance)


def _reflowed(text: str) -> str:
    paragraphs = []
    for paragraph in text.split("\n\n"):
        lines = paragraph.split("\n")
        if any(line.startswith((" ", "\b")) for line in lines):
            paragraphs.append(paragraph)
        else:
            paragraphs.append(" ".join(line.strip() for line in lines))
    return "\n\n".join(paragraphs)
