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
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from trueup.agent.client import AgentClient, AgentUnavailable
from trueup.cli.backup import backup_app, restore_app
from trueup.cli.dhcp import dhcp_app
from trueup.cli.evidence import doctor, evidence
from trueup.cli.exitcodes import DetailedExitCommand, reflow_help
from trueup.cli.fast import DEFAULT_STATE_DIR, duration_seconds, missing_state_dir
from trueup.cli.fleet import fleet_app
from trueup.cli.fleet_inputs import add_commands as add_fleet_input_commands
from trueup.cli.fleet_rollout import rollout_app
from trueup.cli.limitation import limitation_app
from trueup.cli.management import management_app
from trueup.cli.output import (
    api_result,
    emit,
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
    from trueup.model.document import DeviceState
    from trueup.reconcile.engine import Engine
    from trueup.subsystems.base import Subsystem

# Imports are lazy: the commands import the engine, the document model and the
# subsystems when they run (`python -X importtime -m trueup.cli --help`), and the
# hot commands against a running agent never import this module at all
# (`trueup.cli.fast`). Loading the document model goes through `_models()`: the
# subsystem registry registers its sections of `spec` on import.

__all__ = ["app", "main"]

app = typer.Typer(
    name="trueup",
    help="Keep Linux edge routers at their desired configuration.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)
agent_app = typer.Typer(help="Run and administer the router agent.", no_args_is_help=True)
audit_app = typer.Typer(help="The agent's hash-chained audit log.", no_args_is_help=True)
app.add_typer(agent_app, name="agent")
app.add_typer(audit_app, name="audit")
app.add_typer(server_app, name="server")
server_app.add_typer(notify_app, name="notify")
app.add_typer(fleet_app, name="fleet")
add_fleet_input_commands(fleet_app)
fleet_app.add_typer(rollout_app, name="rollout")
app.add_typer(management_app, name="management")
app.add_typer(dhcp_app, name="dhcp")
app.add_typer(backup_app, name="backup")
app.add_typer(restore_app, name="restore")
app.add_typer(secret_app, name="secret")
app.add_typer(limitation_app, name="limitation")

_DEBUG = {"on": False}


def _version_line(state_dir: str) -> str:
    """`trueup X`, plus the version of the agent answering on the state directory, if one does."""
    from trueup import __version__

    line = f"trueup {__version__}"
    client = AgentClient.at(state_dir, timeout=2.0) if os.path.isdir(state_dir) else None
    if client is not None:
        try:
            agent = client.request("GET", "/v1/status").json().get("agent", {})
        except (AgentUnavailable, ValueError, AttributeError):
            agent = {}
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
        bool,
        typer.Option(
            "--version",
            callback=_show_version,
            is_eager=True,
            help="Print trueup's version (and the running agent's) and exit.",
        ),
    ] = False,
    debug: Annotated[
        bool,
        typer.Option("--debug", help="Print the traceback when a command fails."),
    ] = False,
    device: Annotated[
        str | None,
        typer.Option(
            "--device",
            metavar="NAME",
            help="Refuse another device's state directory (also TRUEUP_DEVICE).",
        ),
    ] = None,
) -> None:
    """Keep Linux edge routers at their desired configuration."""
    del version
    if device:
        # Read by every command's --state-dir check (trueup.cli.statedir).
        os.environ["TRUEUP_DEVICE"] = device
    _DEBUG["on"] = debug or os.environ.get("TRUEUP_DEBUG", "") not in ("", "0")


OutputOpt = Annotated[str, typer.Option("-o", "--output", help="json | yaml | table")]
DEFAULT_DIR = Path(DEFAULT_STATE_DIR)


def _models() -> None:
    """The document model with every subsystem's section of `spec` registered."""
    import trueup.subsystems.registry  # noqa: F401


def _fail(message: str, code: int = 1) -> NoReturn:
    typer.echo(f"trueup: {message}", err=True)
    raise typer.Exit(code)


def _refused(code: str, message: str) -> NoReturn:
    from trueup.model.reasons import EXIT_CODES, ReasonCode

    typer.echo(f"{code}: {message}", err=True)
    raise typer.Exit(EXIT_CODES.get(ReasonCode(code), 1))


def _load(file: Path) -> DeviceState:
    _models()
    from trueup.model.document import DocumentError, load_document
    from trueup.model.reasons import ReasonCode

    try:
        return load_document(file)
    except DocumentError as exc:
        typer.echo(str(exc), err=True)
        if exc.unsupported_version:
            typer.echo(f"{ReasonCode.VERSION_SKEW.value}: document schema not supported", err=True)
        raise typer.Exit(1) from None


def _engine(
    state_dir: Path,
    *,
    create: bool,
    init: bool = False,
    device: str | None = None,
    created_by: str | None = None,
) -> Engine:
    """The engine on a state directory its command already checked (trueup.cli.statedir)."""
    _models()
    from trueup.journal.state import StateDir, StateDirError
    from trueup.reconcile.engine import Engine

    state = StateDir(state_dir)
    if create:
        from trueup.journal.agentlock import agent_holder

        holder = agent_holder(state.root)
        if holder is not None and int(holder.get("pid", 0)) != os.getpid():
            # An agent runs on this state directory but did not answer on its
            # socket (hung, or starting): writing from here would observe and
            # change this process's namespace, perhaps not the router's.
            _fail(
                f"an agent (pid {holder.get('pid')}) runs on {state.root} but does not answer "
                f"on {state.root / 'agent.sock'}; nothing was changed. Check it (`trueup "
                "doctor`, its log) or stop it, then retry"
            )
    try:
        if create:
            state.ensure(
                created_by="trueup apply --init" if init else created_by,
                device=device,
                actor=f"cli:{os.getuid()}",
            )
        elif state.exists():
            state.check_schema()
    except (StateDirError, OSError) as exc:
        _fail(str(exc))
    return Engine(state)


def _agent(state_dir: Path) -> AgentClient | None:
    return AgentClient.connect(state_dir)


def _api_result(response: Any) -> dict[str, Any]:
    result = api_result(response)
    if isinstance(result, int):
        raise typer.Exit(result)
    return result


def _print_apply(result: dict[str, Any], output: str) -> None:
    from trueup.model.reasons import ReasonCode

    if output != "table":
        emit(result, output)
    else:
        for step in result.get("steps", []):
            typer.echo(f"  {step}")
        outcome = result["outcome"]
        txn = f" ({result['txn']})" if result.get("txn") else ""
        if outcome == "rolled_back":
            why = "; ".join(f"{n}: {e}" for n, e in result.get("failed", {}).items())
            tried = result.get("attempted_version")
            typer.echo(
                (f"version {tried} was not applied; " if tried is not None else "not applied; ")
                + f"version {result['version']} remains (rolled back: {why or 'a step failed'})"
                + txn
            )
        else:
            typer.echo(f"version {result['version']}: {outcome}{txn}")
        for name, error in result.get("failed", {}).items():
            typer.echo(f"  failed {name}: {error}", err=True)
        for name, why in result.get("waiting", {}).items():
            typer.echo(f"  waiting {name}: {why}", err=True)
        for name, error in result.get("carried", {}).items():
            typer.echo(
                f"  still failing {name} (unchanged by this write; the agent keeps healing it): "
                f"{error}",
                err=True,
            )
        for error in result.get("rollback_errors", []):
            typer.echo(f"  rollback error: {error}", err=True)
        for cleared in result.get("cleared", []):
            typer.echo(f"  {cleared}")
        if result.get("pending_confirmation"):
            pending = result["pending_confirmation"]
            typer.echo(
                f"pending confirmation: run `trueup confirm` before {pending['deadline']}"
                " or this version is rolled back"
            )
    if outcome_code := {"partial": ReasonCode.PARTIAL_UPDATE}.get(result["outcome"]):
        typer.echo(
            f"{outcome_code.value}: failed subsystems: {', '.join(result.get('failed', {}))}",
            err=True,
        )
    if not result["ok"]:
        raise typer.Exit(1)


# -- documents -----------------------------------------------------------------
@app.command()
def validate(file: Path) -> None:
    """Validate a desired-state document: exit 0 valid, 1 invalid (every problem with its path)."""
    document = _load(file)
    typer.echo(f"{file}: valid ({document.apiVersion}, device {document.metadata.device})")


@app.command()
def schema() -> None:
    """Print the JSON Schema of the desired-state document."""
    _models()
    from trueup.model.document import json_schema

    typer.echo(json.dumps(json_schema(), indent=2))


def _print_plan(body: dict[str, Any], output: str, file: Path) -> NoReturn:
    raise typer.Exit(print_plan(body, output, source=str(file)))


@app.command(cls=DetailedExitCommand)
def plan(file: Path, state_dir: StateDirOpt = DEFAULT_DIR, output: OutputOpt = "table") -> None:
    """Show what applying FILE would change: exit 0 no changes, 2 changes, 1 error.

    With an agent running on the state directory, the agent observes (the same
    system `apply` changes); without one, this process observes its own
    network namespace and says so.
    """
    document = _load(file)
    check_device(state_dir, document.metadata.device)
    client = _agent(state_dir)
    if client is not None:
        _print_plan(
            _api_result(client.request("POST", "/v1/plan", json=document.canonical())),
            output,
            file,
        )
        return
    from trueup.reconcile.planning import plan_answer

    engine = _engine(state_dir, create=False)
    answer = plan_answer(engine, document, previous=engine.applied_document(), agent_pid=None)
    body = answer.to_json()
    _print_plan(body, output, file)


OverrideOpt = Annotated[
    str | None,
    typer.Option(
        help="on a device managed by a control plane: apply locally anyway, reported "
        "upstream as a local override with this reason"
    ),
]
ConfirmOpt = Annotated[
    float | None, typer.Option(help="roll back unless `trueup confirm` within SECONDS")
]


@app.command()
def apply(
    file: Path,
    state_dir: NewStateDirOpt = DEFAULT_DIR,
    mode: Annotated[str, typer.Option(help="atomic | best-effort")] = "atomic",
    expect_version: Annotated[
        int | None, typer.Option(help="refuse unless the applied version is this")
    ] = None,
    confirm_within: ConfirmOpt = None,
    override: OverrideOpt = None,
    init: Annotated[
        bool,
        typer.Option(
            "--init",
            help="make the state directory if it is not one yet (first apply; "
            "an empty or missing directory)",
        ),
    ] = False,
    output: OutputOpt = "table",
) -> None:
    """Apply FILE as one journaled transaction."""
    if mode not in ("atomic", "best-effort"):
        _fail("--mode: expected atomic or best-effort")
    from trueup.reconcile.changes import Change, NeedsConfirmation, Refused

    (require_new if init else require_state_dir)(state_dir)
    document = _load(file)
    check_device(state_dir, document.metadata.device)
    client = _agent(state_dir)
    actor = f"cli:{os.getuid()}"
    if client is not None:
        headers = {"If-Match": str(expect_version)} if expect_version is not None else {}
        params: dict[str, Any] = {"mode": mode, "actor": actor}
        if confirm_within is not None:
            params["confirm_within"] = confirm_within
        if override is not None:
            params["override"] = override
        response = client.request(
            "POST", "/v1/apply", json=document.canonical(), headers=headers, params=params
        )
        _print_apply(_api_result(response), output)
        return
    if confirm_within is not None:
        _fail(
            "--confirm-within needs a running agent to roll back on time "
            "(start it with `trueup agent run`)"
        )
    engine = _engine(state_dir, create=True, init=init, device=document.metadata.device)
    try:
        result = engine.transact(
            Change.apply(
                document,
                origin="local-cli",
                actor=actor,
                mode=mode,
                expect_version=expect_version,
                override=override,
                source=str(file),
            )
        )
    except Refused as exc:
        _refused(exc.code.value, str(exc))
    except NeedsConfirmation as exc:
        _fail(str(exc))
    _print_apply(result.to_json(), output)


@app.command()
def rollback(
    state_dir: StateDirOpt = DEFAULT_DIR,
    to: Annotated[
        int | None, typer.Option(help="an accepted revision; default the previous")
    ] = None,
    confirm_within: ConfirmOpt = None,
    override: OverrideOpt = None,
    output: OutputOpt = "table",
) -> None:
    """Apply an earlier accepted revision again (as a new version)."""
    client = _agent(state_dir)
    actor = f"cli:{os.getuid()}"
    if client is not None:
        params: dict[str, Any] = {"actor": actor}
        if to is not None:
            params["to"] = to
        if confirm_within is not None:
            params["confirm_within"] = confirm_within
        if override is not None:
            params["override"] = override
        response = client.request("POST", "/v1/rollback", params=params)
        if response.status_code == 404:
            _fail(response.json().get("detail", "unknown revision"))
        _print_apply(_api_result(response), output)
        return
    if confirm_within is not None:
        _fail(
            "--confirm-within needs a running agent to roll back on time "
            "(start it with `trueup agent run`)"
        )
    from trueup.reconcile.changes import NeedsConfirmation, Refused, UnknownRevision

    engine = _engine(state_dir, create=True)
    try:
        result = engine.rollback_to(to, actor=actor, override=override)
    except Refused as exc:
        _refused(exc.code.value, str(exc))
    except UnknownRevision as exc:
        _fail(str(exc))
    except NeedsConfirmation as exc:
        _fail(str(exc))
    _print_apply(result.to_json(), output)


@app.command()
def confirm(state_dir: StateDirOpt = DEFAULT_DIR) -> None:
    """Keep the version applied with --confirm-within."""
    client = _agent(state_dir)
    if client is None:
        _fail(f"no agent answers on {state_dir / 'agent.sock'}")
    body = _api_result(client.request("POST", "/v1/confirm"))
    typer.echo(body.get("message", json.dumps(body)))
    if not body.get("ok", True):
        raise typer.Exit(1)


# -- observation -----------------------------------------------------------------
def _status(state_dir: Path) -> dict[str, Any]:
    client = _agent(state_dir)
    if client is not None:
        try:
            response = client.request("GET", "/v1/status")
            return dict(response.json())
        except AgentUnavailable:
            pass
    engine = _engine(state_dir, create=False)
    from trueup.journal.agentlock import agent_holder
    from trueup.reconcile.status import gather

    current = gather(engine)
    # No agent answering: nothing heals, nothing reports upstream; `status` says so (exit 0).
    holder = agent_holder(state_dir)
    current["agent"] = {
        "running": holder is not None,
        "answering": False,
        "state_dir": str(state_dir),
        **({"pid": holder.get("pid")} if holder else {}),
    }
    return current


@app.command()
def status(state_dir: StateDirOpt = DEFAULT_DIR, output: OutputOpt = "table") -> None:
    """Versions, management readiness, per-subsystem health, reason codes."""
    print_status(_status(state_dir), output)


@app.command(cls=DetailedExitCommand)
def drift(state_dir: StateDirOpt = DEFAULT_DIR, output: OutputOpt = "table") -> None:
    """Differences between observed and applied state: exit 0 in sync, 2 drift."""
    current = _status(state_dir)
    from trueup.reconcile.status import drift_report

    raise typer.Exit(print_drift(drift_report(current), output))


@app.command()
def reconcile(
    state_dir: StateDirOpt = DEFAULT_DIR,
    subsystem: Annotated[str | None, typer.Option(help="only this subsystem")] = None,
    output: OutputOpt = "table",
) -> None:
    """Converge now to the applied version (and close an open circuit breaker)."""
    client = _agent(state_dir)
    if client is not None:
        params = {"subsystem": subsystem} if subsystem else {}
        response = client.request("POST", "/v1/reconcile", params=params)
        if response.status_code == 404:
            _fail(response.json().get("detail", "unknown subsystem"))
        _print_apply(_api_result(response), output)
        return
    from trueup.reconcile.changes import Kind, Refused

    engine = _engine(state_dir, create=True)
    document = engine.applied_document()
    if document is None:
        _fail("nothing applied yet; run `trueup apply FILE`")
    try:
        result = engine.apply_document(
            document, actor=f"cli:{os.getuid()}", kind=Kind.RECONCILE, origin="reconcile"
        )
    except Refused as exc:
        _refused(exc.code.value, str(exc))
    _print_apply(result.to_json(), output)


def parse_duration(text: str) -> float:
    seconds = duration_seconds(text)
    if seconds is None:
        raise typer.BadParameter(f"{text!r}: expected a duration like 90s, 30m, 2h, 1d")
    return seconds


@app.command()
def ack(
    subsystem: str,
    for_: Annotated[str | None, typer.Option("--for", help="how long, e.g. 2h")] = None,
    reason: Annotated[str | None, typer.Option(help="why healing stops (audited)")] = None,
    clear: Annotated[
        bool, typer.Option("--clear", help="withdraw SUBSYSTEM's acknowledgement now (audited)")
    ] = False,
    state_dir: StateDirOpt = DEFAULT_DIR,
) -> None:
    """Stop healing SUBSYSTEM (never detection) until the acknowledgement expires; --clear ends it."""
    if clear:
        if for_ is not None or reason is not None:
            _fail("--clear takes no --for or --reason")
    else:
        if for_ is None or reason is None:
            _fail("ack needs --for DURATION and --reason TEXT (or --clear to withdraw one)")
        seconds = parse_duration(for_)
        if seconds <= 0:
            _fail(f"--for {for_}: an acknowledgement needs a positive duration, e.g. 30m or 2h")
    client = _agent(state_dir)
    if client is None:
        _fail(
            f"no agent answers on {state_dir / 'agent.sock'}: acknowledgements are held by the "
            "running agent (start it: trueup agent run)"
        )
    if clear:
        response = client.request(
            "DELETE", "/v1/ack", params={"subsystem": subsystem, "actor": f"cli:{os.getuid()}"}
        )
    else:
        response = client.request(
            "POST",
            "/v1/ack",
            params={
                "subsystem": subsystem,
                "seconds": seconds,
                "reason": reason,
                "actor": f"cli:{os.getuid()}",
            },
        )
    if response.status_code == 404:
        _fail(response.json().get("detail", "unknown subsystem"))
    body = _api_result(response)
    if not body.get("ok", True):
        _fail(str(body.get("message", json.dumps(body))))
    typer.echo(body.get("message", json.dumps(body)))


app.command()(evidence)  # trueup.cli.evidence: works with the agent stopped or hung


# -- audit -----------------------------------------------------------------------
@audit_app.command("verify")
def audit_verify(state_dir: StateDirOpt = DEFAULT_DIR) -> None:
    """Check the audit log's hash chain; name the first line edited, removed or reordered."""
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
@agent_app.command("run")
def agent_run(
    config: Annotated[Path | None, typer.Option("--config", help="desired-state document")] = None,
    state_dir: NewStateDirOpt = DEFAULT_DIR,
    control_plane: Annotated[str | None, typer.Option(help="control-plane URL")] = None,
    token_file: Annotated[Path | None, typer.Option(help="device credential file")] = None,
    management_fallback: Annotated[
        Path | None, typer.Option(help="installer document used when nothing was accepted yet")
    ] = None,
    listen_port: Annotated[
        int | None, typer.Option(help="override spec.management.api.port")
    ] = None,
    plugin: Annotated[
        list[str] | None, typer.Option(help="extra subsystem MODULE:FACTORY (repeatable)")
    ] = None,
    log_level: Annotated[str, typer.Option(help="debug | info | warning")] = "info",
) -> None:
    """Run the agent: management first, then recovery, subsystems and the reconcile loop."""
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


@app.command()
def preflight(
    state_dir: NewStateDirOpt = DEFAULT_DIR,
    config: Annotated[Path | None, typer.Option(help="the document the new agent will use")] = None,
    management_fallback: Annotated[Path | None, typer.Option(help="installer fallback")] = None,
    plugin: Annotated[list[str] | None, typer.Option(help="extra subsystem MODULE:FACTORY")] = None,
    output: OutputOpt = "table",
) -> None:
    """Check startup prerequisites before an agent is replaced; changes nothing."""
    from trueup.startup.preflight import preflight as run_preflight

    # A directory an agent is about to make its state directory: it must exist (the
    # installer makes it) and may be empty; a parent of state directories is refused.
    missing = missing_state_dir(str(state_dir)) if not state_dir.is_dir() else None
    if missing is not None:
        _fail(missing.removeprefix("trueup: "))
    require_new(state_dir)
    agent_pid = None
    client = _agent(state_dir)
    if client is not None:
        try:
            agent_pid = client.request("GET", "/v1/status").json()["agent"]["pid"]
        except (AgentUnavailable, KeyError, ValueError):
            agent_pid = None
    findings = run_preflight(
        state_dir,
        _subsystems(plugin),
        config=config,
        fallback=management_fallback,
        agent_pid=agent_pid,
    )
    blockers = [f for f in findings if f.severity == "blocker"]
    if output != "table":
        emit({"ok": not blockers, "findings": [f.to_json() for f in findings]}, output)
    else:
        for f in findings:
            typer.echo(f"{f.severity.upper():<8} {f.check}: {f.message}")
        typer.echo(f"\n{len(blockers)} blocker(s)" if blockers else "\nready: no blockers")
    raise typer.Exit(1 if blockers else 0)


app.command()(doctor)  # trueup.cli.evidence: the runbook's checks, --until-stable


@agent_app.command("enroll")
def agent_enroll(
    bundle: Annotated[
        Path, typer.Option(help="enrollment bundle from `trueup server device enroll`")
    ],
    token_file: Annotated[Path, typer.Option(help="where to store the device credential (0600)")],
    control_plane: Annotated[
        str | None, typer.Option(help="override the URL in the bundle")
    ] = None,
) -> None:
    """Exchange a one-time enrollment bundle for this device's credential."""
    from trueup.agent.cpclient import ControlPlaneClient, ControlPlaneError

    client = ControlPlaneClient(control_plane, token_file)
    try:
        client.exchange_enrollment(bundle)
    except ControlPlaneError as exc:
        _fail(f"enrollment with {bundle} failed: {exc}")
    finally:
        client.close()
    typer.echo(f"enrolled: credential stored in {token_file} (control plane {client.url})")


@agent_app.command("token")
def agent_token(
    name: Annotated[str, typer.Option(help="who the token is for")] = "operator",
    state_dir: StateDirOpt = DEFAULT_DIR,
) -> None:
    """Create a bearer token for the management port (printed once; stored hashed)."""
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
