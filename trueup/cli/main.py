"""`trueup …` — the command line.

Commands reach a running agent through its unix socket in the state
directory; `plan`, `apply`, `rollback`, `status` and `drift` also work without
one, under the same writer lock.

Exit codes: 0 success / in sync; 1 error or invalid input; 2 changes pending
(`plan`) or drift (`drift`); 3 STATE_CONCURRENT_MODIFICATION; 4
STATE_VERSION_SKEW.

Why this module is over 400 lines: one typer command per CLI verb of the
contract in DESIGN.md, each a few lines over the agent API or the engine;
the hot verbs also have a stdlib fast path (`trueup.cli.fast`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn, cast

import typer

from trueup.agent.client import AgentUnavailable
from trueup.cli.backup import backup_app, restore_app
from trueup.cli.commands import (
    CONFIRM_WITHIN,
    GROUPS,
    OUTPUT,
    OVERRIDE,
    ROOT,
)
from trueup.cli.device import device_for, load_models
from trueup.cli.dhcp import dhcp_app
from trueup.cli.evidence import doctor, evidence
from trueup.cli.exitcodes import command_option, declared, option, reflow_help
from trueup.cli.fast import DEFAULT_STATE_DIR, duration_seconds, missing_state_dir
from trueup.cli.fleet import fleet_app
from trueup.cli.fleet_inputs import add_commands as add_fleet_input_commands
from trueup.cli.fleet_rollout import rollout_app
from trueup.cli.limitation import limitation_app
from trueup.cli.management import management_app
from trueup.cli.output import (
    emit,
    print_acknowledged,
    print_apply,
    print_confirmed,
    print_drift,
    print_plan,
    print_status,
)
from trueup.cli.secret import secret_app
from trueup.cli.server import server_app
from trueup.cli.server_notify import notify_app
from trueup.cli.statedir import (
    NewStateDirOpt,
    StateDirOpt,
    check_device,
    require_new,
    require_state_dir,
)

if TYPE_CHECKING:
    from trueup.cli.bodies import DriftReport
    from trueup.model.document import DeviceState
    from trueup.subsystems.base import Subsystem

# Imports are lazy: the commands import the engine, the document model and the
# subsystems when they run (`python -X importtime -m trueup.cli --help`), and the
# hot commands against a running agent never import this module at all
# (`trueup.cli.fast`). Loading the document model goes through `_models()`: the
# subsystem registry registers its sections of `spec` on import.

__all__ = ["app", "main"]

app = typer.Typer(
    name="trueup",
    help=ROOT.help,
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)
agent_app = typer.Typer(no_args_is_help=True)
audit_app = typer.Typer(no_args_is_help=True)
server_app.add_typer(notify_app, name="notify")
add_fleet_input_commands(fleet_app)
fleet_app.add_typer(rollout_app, name="rollout")
_GROUP_APPS = {
    "agent": agent_app,
    "audit": audit_app,
    "server": server_app,
    "fleet": fleet_app,
    "management": management_app,
    "dhcp": dhcp_app,
    "backup": backup_app,
    "restore": restore_app,
    "secret": secret_app,
    "limitation": limitation_app,
}
for _name, _group in GROUPS.items():  # in `trueup --help`'s order
    app.add_typer(_GROUP_APPS[_name], name=_name, help=_group.help)

_DEBUG = {"on": False}


def _version_line(state_dir: str) -> str:
    """`trueup X`, plus the version of the agent answering on the state directory, if one does."""
    from trueup import __version__

    line = f"trueup {__version__}"
    agent = device_for(Path(state_dir), write=False).agent() if os.path.isdir(state_dir) else {}
    if agent.get("pid"):
        line += f"\nagent {agent.get('version') or 'unknown'} (pid {agent['pid']}, {state_dir})"
    return line


def _show_version(value: bool) -> None:
    if value:
        state_dir = os.environ.get("TRUEUP_STATE_DIR") or DEFAULT_STATE_DIR
        typer.echo(_version_line(state_dir))
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool, option(ROOT.option("version"), callback=_show_version, is_eager=True)
    ] = False,
    debug: Annotated[bool, option(ROOT.option("debug"))] = False,
    device: Annotated[str | None, option(ROOT.option("device"))] = None,
) -> None:
    del version
    if device:
        # Read by every command's --state-dir check (trueup.cli.statedir).
        os.environ["TRUEUP_DEVICE"] = device
    _DEBUG["on"] = debug or os.environ.get("TRUEUP_DEBUG", "") not in ("", "0")


OutputOpt = Annotated[str, option(OUTPUT)]
DEFAULT_DIR = Path(DEFAULT_STATE_DIR)


def _fail(message: str, code: int = 1) -> NoReturn:
    typer.echo(f"trueup: {message}", err=True)
    raise typer.Exit(code)


def _load(file: Path) -> DeviceState:
    load_models()
    from trueup.model.document import DocumentError, load_document
    from trueup.model.reasons import ReasonCode

    try:
        return load_document(file)
    except DocumentError as exc:
        typer.echo(str(exc), err=True)
        if exc.unsupported_version:
            typer.echo(f"{ReasonCode.VERSION_SKEW.value}: document schema not supported", err=True)
        raise typer.Exit(1) from None


# -- documents -----------------------------------------------------------------
@declared(app, "validate")
def validate(file: Path) -> None:
    document = _load(file)
    typer.echo(f"{file}: valid ({document.apiVersion}, device {document.metadata.device})")


@declared(app, "schema")
def schema() -> None:
    load_models()
    from trueup.model.document import json_schema

    typer.echo(json.dumps(json_schema(), indent=2))


@declared(app, "plan")
def plan(file: Path, state_dir: StateDirOpt = DEFAULT_DIR, output: OutputOpt = "table") -> None:
    document = _load(file)
    check_device(state_dir, document.metadata.device)
    body = device_for(state_dir).plan(document)
    raise typer.Exit(print_plan(body, output, source=str(file)))


OverrideOpt = Annotated[str | None, option(OVERRIDE)]
ConfirmOpt = Annotated[float | None, option(CONFIRM_WITHIN)]


@declared(app, "apply")
def apply(
    file: Path,
    state_dir: NewStateDirOpt = DEFAULT_DIR,
    mode: Annotated[str, command_option("apply", "mode")] = "atomic",
    expect_version: Annotated[int | None, command_option("apply", "expect_version")] = None,
    confirm_within: ConfirmOpt = None,
    override: OverrideOpt = None,
    init: Annotated[bool, command_option("apply", "init")] = False,
    output: OutputOpt = "table",
) -> None:
    if mode not in ("atomic", "best-effort"):
        _fail("--mode: expected atomic or best-effort")
    (require_new if init else require_state_dir)(state_dir)
    document = _load(file)
    check_device(state_dir, document.metadata.device)
    result = device_for(state_dir).apply(
        document,
        source=file,
        mode=mode,
        expect_version=expect_version,
        confirm_within=confirm_within,
        override=override,
        init=init,
    )
    raise typer.Exit(print_apply(result, output))


@declared(app, "rollback")
def rollback(
    state_dir: StateDirOpt = DEFAULT_DIR,
    to: Annotated[int | None, command_option("rollback", "to")] = None,
    confirm_within: ConfirmOpt = None,
    override: OverrideOpt = None,
    output: OutputOpt = "table",
) -> None:
    result = device_for(state_dir).rollback(to, confirm_within=confirm_within, override=override)
    raise typer.Exit(print_apply(result, output))


@declared(app, "confirm")
def confirm(state_dir: StateDirOpt = DEFAULT_DIR) -> None:
    raise typer.Exit(print_confirmed(device_for(state_dir).confirm()))


# -- observation -----------------------------------------------------------------
@declared(app, "status")
def status(state_dir: StateDirOpt = DEFAULT_DIR, output: OutputOpt = "table") -> None:
    print_status(device_for(state_dir).status(), output)


@declared(app, "drift")
def drift(state_dir: StateDirOpt = DEFAULT_DIR, output: OutputOpt = "table") -> None:
    current = device_for(state_dir).status()
    from trueup.reconcile.status import drift_report

    # `drift_report` answers `DriftBody.to_json()`: what the agent serves on /v1/drift.
    report = cast("DriftReport", drift_report(current))
    raise typer.Exit(print_drift(report, output))


@declared(app, "reconcile")
def reconcile(
    state_dir: StateDirOpt = DEFAULT_DIR,
    subsystem: Annotated[str | None, command_option("reconcile", "subsystem")] = None,
    output: OutputOpt = "table",
) -> None:
    raise typer.Exit(print_apply(device_for(state_dir).reconcile(subsystem), output))


def parse_duration(text: str) -> float:
    seconds = duration_seconds(text)
    if seconds is None:
        raise typer.BadParameter(f"{text!r}: expected a duration like 90s, 30m, 2h, 1d")
    return seconds


@declared(app, "ack")
def ack(
    subsystem: str,
    for_: Annotated[str | None, command_option("ack", "for_")] = None,
    reason: Annotated[str | None, command_option("ack", "reason")] = None,
    clear: Annotated[bool, command_option("ack", "clear")] = False,
    state_dir: StateDirOpt = DEFAULT_DIR,
) -> None:
    if clear:
        if for_ is not None or reason is not None:
            _fail("--clear takes no --for or --reason")
        raise typer.Exit(print_acknowledged(device_for(state_dir).clear_acknowledgement(subsystem)))
    if for_ is None or reason is None:
        _fail("ack needs --for DURATION and --reason TEXT (or --clear to withdraw one)")
    seconds = parse_duration(for_)
    if seconds <= 0:
        _fail(f"--for {for_}: an acknowledgement needs a positive duration, e.g. 30m or 2h")
    body = device_for(state_dir).acknowledge(subsystem, seconds, reason)
    raise typer.Exit(print_acknowledged(body))


declared(app, "evidence")(evidence)  # trueup.cli.evidence: works with the agent stopped or hung


# -- audit -----------------------------------------------------------------------
@declared(audit_app, "audit verify")
def audit_verify(state_dir: StateDirOpt = DEFAULT_DIR) -> None:
    from trueup.journal.state import StateDir

    state = StateDir(state_dir)
    problems = state.audit.verify()
    if not problems:
        typer.echo(f"audit log intact: {len(state.audit.records())} record(s)")
        return
    typer.echo(f"audit log broken: first problem at {problems[0]}", err=True)
    for problem in problems[1:]:
        typer.echo(f"  also {problem}", err=True)
    raise typer.Exit(1)


# -- agent -----------------------------------------------------------------------
@declared(agent_app, "agent run")
def agent_run(
    config: Annotated[Path | None, command_option("agent run", "config")] = None,
    state_dir: NewStateDirOpt = DEFAULT_DIR,
    control_plane: Annotated[str | None, command_option("agent run", "control_plane")] = None,
    token_file: Annotated[Path | None, command_option("agent run", "token_file")] = None,
    management_fallback: Annotated[
        Path | None, command_option("agent run", "management_fallback")
    ] = None,
    listen_port: Annotated[int | None, command_option("agent run", "listen_port")] = None,
    plugin: Annotated[list[str] | None, command_option("agent run", "plugin")] = None,
    log_level: Annotated[str, command_option("agent run", "log_level")] = "info",
) -> None:
    # The console entry sends `agent run` to trueup.agent.fastboot (management up
    # before this module is even imported); this is the same agent without it.
    from trueup.agent.fastboot import AgentOptions, agent_run_problem
    from trueup.agent.launch import run_agent

    options = AgentOptions(
        state_dir=state_dir,
        config=config,
        control_plane=control_plane,
        token_file=token_file,
        management_fallback=management_fallback,
        listen_port=listen_port,
        plugins=plugin,
        log_level=log_level,
    )
    refused = agent_run_problem(options)
    if refused is not None:
        _fail(f"agent run: {refused.removeprefix('trueup: ')}")
    raise typer.Exit(run_agent(options))


def _subsystems(plugins: list[str] | None) -> list[Subsystem]:
    from trueup.subsystems.registry import default_subsystems, load_plugin, ordered

    subsystems = default_subsystems()
    for reference in plugins or []:
        try:
            subsystems.append(load_plugin(reference))
        except (ImportError, AttributeError, ValueError) as exc:
            _fail(f"--plugin {reference}: {exc}")
    return ordered(subsystems)


@declared(app, "preflight")
def preflight(
    state_dir: NewStateDirOpt = DEFAULT_DIR,
    config: Annotated[Path | None, command_option("preflight", "config")] = None,
    management_fallback: Annotated[
        Path | None, command_option("preflight", "management_fallback")
    ] = None,
    plugin: Annotated[list[str] | None, command_option("preflight", "plugin")] = None,
    output: OutputOpt = "table",
) -> None:
    from trueup.startup.preflight import preflight as run_preflight

    # A directory an agent is about to make its state directory: it must exist (the
    # installer makes it) and may be empty; a parent of state directories is refused.
    missing = missing_state_dir(str(state_dir)) if not state_dir.is_dir() else None
    if missing is not None:
        _fail(missing.removeprefix("trueup: "))
    require_new(state_dir)
    findings = run_preflight(
        state_dir,
        _subsystems(plugin),
        config=config,
        fallback=management_fallback,
        agent_pid=device_for(state_dir).agent().get("pid"),
    )
    blockers = [f for f in findings if f.severity == "blocker"]
    if output != "table":
        emit({"ok": not blockers, "findings": [f.to_json() for f in findings]}, output)
    else:
        for f in findings:
            typer.echo(f"{f.severity.upper():<8} {f.check}: {f.message}")
        typer.echo(f"\n{len(blockers)} blocker(s)" if blockers else "\nready: no blockers")
    raise typer.Exit(1 if blockers else 0)


declared(app, "doctor")(doctor)  # trueup.cli.evidence: the runbook's checks, --until-stable


@declared(agent_app, "agent enroll")
def agent_enroll(
    bundle: Annotated[Path, command_option("agent enroll", "bundle")],
    token_file: Annotated[Path, command_option("agent enroll", "token_file")],
    control_plane: Annotated[str | None, command_option("agent enroll", "control_plane")] = None,
) -> None:
    from trueup.agent.cpclient import ControlPlaneClient, ControlPlaneError

    client = ControlPlaneClient(control_plane, token_file)
    try:
        client.exchange_enrollment(bundle)
    except ControlPlaneError as exc:
        _fail(f"enrollment with {bundle} failed: {exc}")
    finally:
        client.close()
    typer.echo(f"enrolled: credential stored in {token_file} (control plane {client.url})")


@declared(agent_app, "agent token")
def agent_token(
    name: Annotated[str, command_option("agent token", "name")] = "operator",
    state_dir: StateDirOpt = DEFAULT_DIR,
) -> None:
    from trueup.agent.process import create_api_token
    from trueup.journal.state import StateDir

    typer.echo(create_api_token(StateDir(state_dir), name))


reflow_help(app)  # after every command above is registered


def main() -> None:
    """The full typer CLI; a failure is one line with what to do, exit 1 (`--debug`: traceback)."""
    try:
        app(standalone_mode=True)
    except AgentUnavailable as exc:
        if _DEBUG["on"]:
            import traceback

            traceback.print_exc()
        typer.echo(exc.next_step(), err=True)
        raise SystemExit(1) from None
    except Exception as exc:
        if _DEBUG["on"]:
            raise
        typer.echo(
            f"trueup: {type(exc).__name__}: {exc} (run with `trueup --debug …` for the traceback)",
            err=True,
        )
        raise SystemExit(1) from None
