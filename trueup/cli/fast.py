"""The CLI's fast path: the hot commands against a running agent, standard library only.

`trueup status`, `drift`, `plan`, `confirm` and `ack` against a running agent
are a request on the unix socket and a few lines of output; importing typer,
pydantic, the engine and the subsystems costs several times that. `run(argv)`
handles exactly those commands when an agent answers on the state directory's
socket, with the options the typer commands take (both parse what
`trueup.cli.commands` declares: `--state-dir`, then `TRUEUP_STATE_DIR`, then
the default; `-o json|yaml|table`), and prints through the renderers the typer
commands use (`trueup.cli.output`). Everything else —
another command, an option it does not know, `--help` on a command, a value
typer would refuse, no agent answering, an answer it does not expect before
anything was changed — is handed to the full typer CLI (`run` returns None),
which behaves as it always did. `trueup --help` is `trueup.cli.helptext`.

Reads (`status`, `drift`, `plan`) go straight to their route with the health
check's 2 s timeout and are repeated by the full CLI when not answered; writes
(`confirm`, `ack`) ask first whether an agent answers, as the full CLI does,
and are sent once through the same `trueup.cli.agentdevice.AgentDevice` the
typer commands use: an agent that stops answering then is one line and exit 1.
`plan` sends the document as decoded from the file and lets the agent validate
it; a 422 hands over to the full CLI, which prints each problem with its path
in the file, as before.
"""

from __future__ import annotations

import os

from trueup.agent.client import HEALTH_TIMEOUT, AgentClient, AgentUnavailable
from trueup.cli.agentdevice import AgentDevice, Failed, agent_client
from trueup.cli.commands import COMMANDS, STATE_DIR
from trueup.cli.output import (
    echo,
    print_acknowledged,
    print_confirmed,
    print_drift,
    print_plan,
    print_status,
)

TYPE_CHECKING = False  # typing's import time is measurable on the fast path
if TYPE_CHECKING:
    from typing import Any

    from trueup.cli.bodies import PlanBody
    from trueup.model.jsontypes import JSONObject

__all__ = [
    "DEFAULT_STATE_DIR",
    "FORMATS",
    "duration_seconds",
    "missing_state_dir",
    "parse",
    "run",
]

# = trueup.journal.state.DEFAULT_STATE_DIR (a unit test keeps them equal).
DEFAULT_STATE_DIR = "/var/lib/trueup"
STATE_DIR_ENV = STATE_DIR.envvar or "TRUEUP_STATE_DIR"
DEVICE_ENV = "TRUEUP_DEVICE"  # = trueup.journal.identity.DEVICE_ENV
FORMATS = ("json", "yaml", "table")

# command: (positional parameters, options taking a value by flag, required options), from
# the commands the declaration marks `fast`; a flag (`ack --clear`) is left to typer.
_COMMANDS: dict[str, tuple[tuple[str, ...], dict[str, str], tuple[str, ...]]] = {
    command.name: (
        command.arguments,
        {flag: o.dest for o in command.options if o.takes_value for flag in o.flags},
        command.fast_requires,
    )
    for command in COMMANDS.values()
    if command.fast
}


def missing_state_dir(state_dir: str) -> str | None:
    """The error line when `state_dir` is not a state directory (a typo, a forgotten option).

    Only `trueup agent run` and `trueup apply --init` create a state directory:
    anything else against one that does not exist, an empty folder, the parent
    of the agent's directory or a folder of other files would show an empty
    device (version 0, in sync) or start a second, empty history beside the
    agent's. One `lstat` when it is a state directory; the diagnosis
    (`trueup.journal.identity.problem`) is imported only when it is not.
    """
    try:
        os.lstat(os.path.join(state_dir, "state.json"))
        return None
    except OSError:
        from trueup.journal.identity import problem

        return problem(state_dir)


def duration_seconds(text: str) -> float | None:
    """`90s`, `30m`, `2h`, `1d` or plain seconds; None when it is none of those."""
    import re

    match = re.match(r"^(\d+(?:\.\d+)?)([smhd]?)$", text.strip())
    if not match:
        return None
    return float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]


def parse(argv: list[str]) -> tuple[str, dict[str, str]] | None:
    """(command, values) when argv is a hot command with options the fast path knows, else None.

    Conservative by design: anything unusual (an option given twice, `--`, a
    value that looks like an option, a missing value) returns None, and the
    full CLI decides what it means.
    """
    if not argv or argv[0] not in _COMMANDS:
        return None
    positional, options, required = _COMMANDS[argv[0]]
    values: dict[str, str] = {}
    given: list[str] = []
    rest = iter(argv[1:])
    for arg in rest:
        if arg.startswith("--") and arg != "--":
            name, has_value, value = arg.partition("=")
            if name not in options:
                return None
            if not has_value:
                value = next(rest, "-")
                if value.startswith("-"):
                    return None
        elif arg.startswith("-"):
            # Short options: `-o json` and `-ojson` only.
            if arg[:2] not in options or arg[2:3] == "=":
                return None
            name, value = arg[:2], arg[2:]
            if not value:
                value = next(rest, "-")
                if value.startswith("-"):
                    return None
        else:
            given.append(arg)
            continue
        key = options[name]
        if key in values:
            return None
        values[key] = value
    if len(given) != len(positional) or any(key not in values for key in required):
        return None
    values.update(zip(positional, given, strict=True))
    if values.setdefault("output", "table") not in FORMATS:
        return None
    if "state_dir" not in values:
        values["state_dir"] = os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR
    return argv[0], values


def run(argv: list[str]) -> int | None:
    """The exit code when the fast path answered; None: run the full typer CLI instead."""
    if argv == ["--help"]:
        from trueup.cli.helptext import print_help

        return print_help()
    parsed = parse(argv)
    if parsed is None:
        return None
    command, options = parsed
    if command == "ack" and not (duration_seconds(options["for_"]) or 0) > 0:
        return None  # typer's usage error, or its refusal of a duration that is not positive
    document: JSONObject | None = None
    if command == "plan":
        document = _read_document(options["file"])
        if document is None:
            return None  # the full CLI prints why the file is not a document
    if missing_state_dir(options["state_dir"]) is not None or os.environ.get(DEVICE_ENV):
        return None  # the full CLI names what is wrong, or checks the device named
    if document is not None and not _same_device(options["state_dir"], document):
        return None  # the full CLI refuses a document for another device (or finds out)
    # A write is sent once: it asks first whether an agent answers, as the full CLI does. A
    # read is repeated by the full CLI when it is not answered within the time the health
    # check would have allowed: one round trip instead of two.
    write = command in ("confirm", "ack")
    client = agent_client(options["state_dir"], write=write, read_timeout=HEALTH_TIMEOUT)
    if client is None:
        return None  # no agent: the full CLI works without one, or says so
    return _HANDLERS[command](client, options, document)


def _same_device(state_dir: str, document: JSONObject) -> bool:
    """Whether the document is for the device whose state directory this is, as far as
    `state.json` tells; False when it cannot tell (no device recorded, something applied):
    the full CLI then compares with the applied document (`trueup.cli.statedir`)."""
    from trueup.journal.identity import read_marker

    metadata = document.get("metadata")
    wanted = metadata.get("device") if isinstance(metadata, dict) else None
    owner = (read_marker(state_dir) or {}).get("device")
    if isinstance(owner, str) and owner:
        return not wanted or wanted == owner
    return not wanted or not os.path.lexists(os.path.join(state_dir, "applied.json"))


def _read_document(file: str) -> JSONObject | None:
    """The file decoded as `trueup.model.document.decode_text` does; None on any problem."""
    from trueup.model.decode import decode_json, decode_yaml

    try:
        with open(file, "rb") as stream:
            raw = stream.read()
        text = raw.decode("utf-8")
        if file.endswith(".json") or text.lstrip().startswith("{"):
            data = decode_json(raw)
        else:
            data = decode_yaml(raw)
    except Exception:
        return None
    return data if isinstance(data, dict) else None


# A handler: the agent's client, the options parsed, the document (`plan`'s, decoded from
# its file); the exit code, or None to hand over to the full CLI.
def _status(client: AgentClient, values: dict[str, str], document: JSONObject | None) -> int | None:
    def render(body: Any) -> int:
        print_status(body, values["output"])
        return 0

    return _read(client, "/v1/status", render)


def _drift(client: AgentClient, values: dict[str, str], document: JSONObject | None) -> int | None:
    # The agent's /v1/drift is `drift_report(status)`, what the full CLI derives from /v1/status.
    return _read(client, "/v1/drift", lambda body: print_drift(body, values["output"]))


def _read(client: AgentClient, path: str, render: Any) -> int | None:
    try:
        response = client.request("GET", path)
        body = response.json() if response.status_code == 200 else None
    except (AgentUnavailable, ValueError):
        return None  # the full CLI reads the state directory itself
    if not isinstance(body, dict):
        return None
    code: int = render(body)
    return code


def _plan(client: AgentClient, values: dict[str, str], document: JSONObject | None) -> int | None:
    try:
        response = client.request("POST", "/v1/plan", json=document)
        body: PlanBody | None = response.json() if response.status_code == 200 else None
    except (AgentUnavailable, ValueError, TypeError):
        return None  # planning changes nothing: the full CLI plans again, its own way
    if not isinstance(body, dict):
        return None  # e.g. 422: the full CLI prints each problem with its path in FILE
    return print_plan(body, values["output"], source=str(values["file"]))


def _confirm(
    client: AgentClient, values: dict[str, str], document: JSONObject | None
) -> int | None:
    return _write(lambda device: print_confirmed(device.confirm()), client)


def _ack(client: AgentClient, values: dict[str, str], document: JSONObject | None) -> int | None:
    seconds = duration_seconds(values["for_"]) or 0.0
    return _write(
        lambda device: print_acknowledged(
            device.acknowledge(values["subsystem"], seconds, values["reason"])
        ),
        client,
    )


def _write(verb: Any, client: AgentClient) -> int:
    """A write through the agent device, sent once: its exit code (1 when the agent stops
    answering, with the line saying what to run next)."""
    try:
        code: int = verb(AgentDevice(client))
    except Failed as failed:
        return failed.exit_code
    except AgentUnavailable as exc:
        echo(exc.next_step(), err=True)
        return 1
    return code


_HANDLERS = {
    "status": _status,
    "drift": _drift,
    "plan": _plan,
    "confirm": _confirm,
    "ack": _ack,
}
