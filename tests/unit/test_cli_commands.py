"""The CLI's commands are declared once (`trueup.cli.commands`), and every CLI says what it says.

The typer app registers each declared command with its name, help and options;
the fast path parses the hot commands with the options declared for them; and
`trueup --help` without typer (`trueup.cli.helptext.HELP`, generated) lists the
declared commands and groups with their help. Each test here fails when one of
them says something the declaration does not.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import typer
from typer._click.core import Context  # typer vendors click: its own classes

from trueup.cli import fast, helptext
from trueup.cli.commands import COMMANDS, GROUPS, ROOT, Command
from trueup.cli.main import app

COMPLETION = {"install_completion", "show_completion"}  # typer's own, added to the root


@functools.cache
def _root() -> Any:
    return typer.main.get_command(app)


def _click_command(name: str) -> Any:
    command = _root()
    for word in name.split():
        command = command.get_command(Context(command), word)
        assert command is not None, f"`trueup {name}` is declared but not registered"
    return command


def _options(command: Any) -> dict[str, tuple[Any, ...]]:
    return {
        param.name: (tuple(param.opts), param.help, param.envvar, param.metavar, param.is_flag)
        for param in command.params
        if param.param_type_name == "option" and param.name not in COMPLETION
    }


def _declared_options(spec: Command) -> dict[str, tuple[Any, ...]]:
    return {o.dest: (o.flags, o.help, o.envvar, o.metavar, not o.takes_value) for o in spec.options}


@pytest.mark.parametrize("name", sorted(COMMANDS), ids=lambda name: name.replace(" ", "-"))
def test_each_declared_command_is_the_typer_command(name: str) -> None:
    spec = COMMANDS[name]
    command = _click_command(name)
    assert command.help == spec.help
    arguments = [p.name for p in command.params if p.param_type_name == "argument"]
    assert tuple(arguments) == spec.arguments
    assert _options(command) == _declared_options(spec)
    detailed = type(command).__name__ == "DetailedExitCommand"
    assert detailed == spec.usage_exit_1


def test_the_root_options_are_declared() -> None:
    assert _root().help == ROOT.help
    assert _options(_root()) == _declared_options(ROOT)


def test_every_command_of_the_root_agent_and_audit_is_declared() -> None:
    root = _root()
    context = Context(root)
    registered = []
    for name in root.list_commands(context):
        command = root.get_command(context, name)
        if name in ("agent", "audit"):
            registered += [f"{name} {sub}" for sub in command.list_commands(Context(command))]
        elif not hasattr(command, "list_commands"):
            registered.append(name)
    assert sorted(registered) == sorted(COMMANDS)
    groups = [
        n
        for n in root.list_commands(context)
        if hasattr(root.get_command(context, n), "list_commands")
    ]
    assert groups == list(GROUPS)


@pytest.mark.parametrize("name", list(GROUPS))
def test_each_group_has_its_declared_help(name: str) -> None:
    group = _click_command(name)
    assert group.help == GROUPS[name].help
    # A group made elsewhere that still names its own help says the same.
    own = next(g.typer_instance for g in app.registered_groups if g.name == name)
    assert own is not None
    if isinstance(own.info.help, str):
        assert own.info.help == GROUPS[name].help


def _plain(pieces: list[list[str]]) -> str:
    return "".join(text for text, _style in pieces)


def test_the_generated_help_lists_the_declared_commands_and_groups() -> None:
    listed = [(name, _plain(pieces)) for name, pieces in helptext.HELP["commands"]]
    declared = [(c.name, c.short_help) for c in COMMANDS.values() if " " not in c.name]
    declared += [(g.name, g.help) for g in GROUPS.values()]
    assert listed == declared
    assert [_plain(paragraph) for paragraph in helptext.HELP["description"]] == [ROOT.help]
    listed_options = [_plain(help_) for _lead, help_ in helptext.HELP["options"]]
    assert listed_options[: len(ROOT.options)] == [o.help for o in ROOT.options]


def test_the_fast_path_parses_what_is_declared_for_its_commands() -> None:
    hot = {name for name, spec in COMMANDS.items() if spec.fast}
    assert hot == {"status", "drift", "plan", "confirm", "ack"}
    for name in hot:
        spec = COMMANDS[name]
        argv = [name, *(f"{a}-value" for a in spec.arguments)]
        for o in spec.options:
            if o.takes_value:
                argv += [o.flags[-1], "table" if o.dest == "output" else f"{o.dest}-value"]
        parsed = fast.parse(argv)
        assert parsed is not None, argv
        values = {*spec.arguments, *(o.dest for o in spec.options if o.takes_value)}
        assert set(parsed[1]) - {"output"} == values - {"output"}  # `-o` defaults to table
        flags = [o for o in spec.options if not o.takes_value]
        for flag in flags:  # a flag is typer's to handle
            assert fast.parse([*argv, flag.flags[0]]) is None
