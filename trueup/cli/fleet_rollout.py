"""`trueup fleet rollout start|status|pause|resume|abort|approve` — staged rollouts, over the
control plane's API (`/api/v1/rollouts`), with the connection options of `trueup fleet`.

`start FILE…` rolls the documents out (each file one device's full desired-state
document, JSON or YAML; the device is its `metadata.device`), `start --plan [-l
SELECTOR]` the stored profiles and variables (what `trueup fleet plan` shows), in waves:
`--canary DEVICE` (repeatable) is the first wave, then each `--wave PERCENT`
(cumulative percentages of the rest; default one wave of 100 %). `status` lists
the rollouts, or shows one: its waves, and each device's state, gates and reason.

Output: a table, or `-o json|yaml` (the API's JSON as is). Exit codes: 0 done; 1 the
server refused (every problem on its own line) or did not answer; a busy device
(another rollout holds it) is refused naming that rollout.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from trueup.cli.fleet import CaFileOpt, OutputOpt, ServerOpt, TokenFileOpt, _connection
from trueup.cli.fleetapi import Connection, several_documents, table
from trueup.cli.output import emit, readable

if TYPE_CHECKING:
    from trueup.cli import fleetbodies as fb
    from trueup.model.jsontypes import JSONObject

__all__ = ["render_rollout", "rollout_app"]

rollout_app = typer.Typer(
    help="Staged rollouts: waves, gates, approvals; pause, resume, abort.",
    no_args_is_help=True,
)

IdArg = Annotated[int, typer.Argument(help="the rollout's id (`trueup fleet rollout status`)")]


def _fail(message: str) -> NoReturn:
    typer.echo(f"trueup fleet rollout: {message}", err=True)
    raise typer.Exit(1)


def _call(c: Connection, method: str, path: str, body: Any = None) -> Any:
    """`method path` on the control plane; exits 1 with the reason when that fails."""
    from trueup.cli.fleetapi import call

    status, answer, _ = call(
        c, method, path, body=body, role="allowed (viewer to read, operator to change)", say=_fail
    )
    if status >= 400:
        if isinstance(answer, dict) and answer.get("problems"):
            for problem in answer["problems"]:
                typer.echo(f"trueup fleet rollout: {problem}", err=True)
            raise typer.Exit(1)
        detail = answer.get("detail") if isinstance(answer, dict) else None
        server = c["server"]
        _fail(str(detail or f"{server} answered {status}: {readable(answer, 300)}"))
    return answer


def _document(path: Path) -> JSONObject:
    """The desired-state document in `path`, decoded (the server validates it)."""
    from trueup.model.decode import DecodeError, decode_json, decode_yaml

    try:
        raw = path.read_bytes()
        data = (
            decode_json(raw, max_bytes=len(raw) + 1, max_depth=64)
            if path.suffix == ".json"
            else decode_yaml(raw, max_bytes=len(raw) + 1, max_depth=64)
        )
    except OSError as exc:
        _fail(f"{path}: {exc.strerror or exc}")
    except DecodeError as exc:
        _fail(several_documents(path, str(exc), "device's document") or f"{path}: {exc}")
    if not isinstance(data, dict):
        _fail(f"{path}: expected a desired-state document (a mapping)")
    device = (data.get("metadata") or {}).get("device") if isinstance(data, dict) else None
    if not isinstance(device, str) or not device:
        _fail(f"{path}: metadata.device: required (it names the device the document is for)")
    return data


@rollout_app.command("start")
def start(
    ctx: typer.Context,
    files: Annotated[
        list[Path] | None, typer.Argument(help="one desired-state document per device")
    ] = None,
    from_plan: Annotated[
        bool,
        typer.Option(
            "--plan", help="roll out the stored profiles and variables (`trueup fleet plan`)"
        ),
    ] = False,
    selector: Annotated[
        str, typer.Option("-l", "--selector", help="with --plan: only the devices it selects")
    ] = "",
    expect_digest: Annotated[
        str | None,
        typer.Option(
            "--expect-digest",
            help="with --plan: the digest `trueup fleet plan -o json` showed; refused when "
            "the plan is another one now",
        ),
    ] = None,
    canary: Annotated[
        list[str] | None, typer.Option("--canary", help="a device of the first wave (repeat)")
    ] = None,
    wave: Annotated[
        list[int] | None,
        typer.Option(
            "--wave",
            min=1,
            max=100,
            help="a wave: cumulative percent of the rest, 1-100 (repeat: 50, 100)",
        ),
    ] = None,
    max_unavailable: Annotated[
        str, typer.Option("--max-unavailable", help="devices changing at once per wave: N or N%")
    ] = "25%",
    soak: Annotated[
        float, typer.Option("--soak", min=0, max=7 * 86400, help="seconds a finished wave soaks")
    ] = 0.0,
    failure_budget: Annotated[
        int, typer.Option("--failure-budget", min=0, help="failed devices a wave may have")
    ] = 0,
    confirm_within: Annotated[
        int | None,
        typer.Option(
            "--confirm-within",
            min=1,
            max=86400,
            help="each device's confirmation window, 1-86400 s",
        ),
    ] = None,
    approval: Annotated[
        bool, typer.Option("--approval", help="every wave after the first waits for `approve`")
    ] = False,
    gate_timeout: Annotated[
        float,
        typer.Option(
            "--gate-timeout", min=1, max=7 * 86400, help="seconds a sent device may take to pass"
        ),
    ] = 900.0,
    comment: Annotated[str, typer.Option("--comment", help="why (kept with the revisions)")] = "",
    server: ServerOpt = None,
    token_file: TokenFileOpt = None,
    ca_file: CaFileOpt = None,
    output: OutputOpt = "table",
) -> None:
    """Roll documents out in waves gated by the agents' own health."""
    c = _connection(ctx, server=server, token_file=token_file, ca_file=ca_file)
    if from_plan == bool(files):
        _fail("give the documents to roll out, or --plan (the stored profiles), not both")
    targets = _targets(files or [])
    if not re.fullmatch(r"[1-9][0-9]*|(100|[1-9][0-9]?)%", max_unavailable):
        _fail(
            f"--max-unavailable {max_unavailable!r}: expected a number of devices (2) or a "
            "percentage of the wave from 1% to 100% (25%)"
        )
    limit: int | str = int(max_unavailable) if max_unavailable.isdigit() else max_unavailable
    body: fb.RolloutRequest = {
        "waves": _waves(canary, wave),
        "max_unavailable": limit,
        "soak_seconds": soak,
        "failure_budget": failure_budget,
        "confirm_within": confirm_within,
        "approval": approval,
        "gate_timeout": gate_timeout,
        "comment": comment,
    }
    if from_plan:
        if expect_digest is not None:
            body["expect_digest"] = expect_digest
        body["selector"] = selector
        _print_plan_rollout(_call(c, "POST", "/api/v1/plan/rollout", body), output)
        return
    answer = _call(c, "POST", "/api/v1/rollouts", {"targets": targets, **body})
    if output == "table":
        typer.echo(render_rollout(answer))
    else:
        emit(answer, output)


def _targets(files: list[Path]) -> list[fb.RolloutTarget]:
    """One target per document: its device and the document as read."""
    targets: list[fb.RolloutTarget] = []
    for path in files:
        data = _document(path)
        targets.append({"device": data["metadata"]["device"], "document": data})
    return targets


def _waves(canary: list[str] | None, percents: list[int] | None) -> list[fb.WaveSpec]:
    """The canary wave (its devices, when named), then each cumulative percentage."""
    waves: list[fb.WaveSpec] = [{"devices": list(canary)}] if canary else []
    waves.extend({"percent": p} for p in (percents or [100]))
    return waves


def _print_plan_rollout(answer: fb.PlanRollout, output: str) -> None:
    """`rollout start --plan`'s answer: what the plan changes, then the rollout (if any)."""
    if output != "table":
        emit(answer, output)
    elif answer["rollout"] is None:
        typer.echo("the plan changes no device: no rollout started")
    else:
        counts = answer["plan"]["counts"]
        refused = [r["device"] for r in answer["plan"]["refused"]]
        typer.echo(
            f"plan: {counts['changed']} changed, {counts['refused']} refused"
            + (f" ({', '.join(refused)}: never sent)" if refused else "")
            + f", {counts['unchanged']} unchanged"
        )
        typer.echo(render_rollout(answer["rollout"]))


@rollout_app.command("status")
def status(
    ctx: typer.Context,
    rollout_id: Annotated[int | None, typer.Argument(help="a rollout's id (none: list)")] = None,
    server: ServerOpt = None,
    token_file: TokenFileOpt = None,
    ca_file: CaFileOpt = None,
    output: OutputOpt = "table",
) -> None:
    """The rollouts (newest first), or one: its waves and each device's state and gates."""
    c = _connection(ctx, server=server, token_file=token_file, ca_file=ca_file)
    if rollout_id is None:
        answer = _call(c, "GET", "/api/v1/rollouts")
        if output != "table":
            emit(answer, output)
            return
        rows = [("ID", "STATE", "WAVE", "CREATED BY", "CREATED AT", "REASON")]
        for r in answer.get("rollouts", []):
            rows.append(
                (
                    str(r["id"]),
                    str(r["state"]),
                    str(r["current_wave"]),
                    str(r["created_by"]),
                    str(r["created_at"]),
                    str(r.get("reason") or "-"),
                )
            )
        typer.echo(table(rows))
        typer.echo(f"{answer.get('count', 0)} rollout(s)")
        return
    answer = _call(c, "GET", f"/api/v1/rollouts/{rollout_id}")
    if output == "table":
        typer.echo(render_rollout(answer))
    else:
        emit(answer, output)


def _action(name: str, rollout_id: int, reason: str, c: Connection, output: str) -> None:
    body = {"reason": reason} if reason else {}
    answer = _call(c, "POST", f"/api/v1/rollouts/{rollout_id}/{name}", body)
    if output == "table":
        typer.echo(render_rollout(answer))
    else:
        emit(answer, output)


ReasonOpt = Annotated[str, typer.Option("--reason", help="why (kept in the audit log)")]


@rollout_app.command("pause")
def pause(
    ctx: typer.Context,
    rollout_id: IdArg,
    reason: ReasonOpt = "",
    server: ServerOpt = None,
    token_file: TokenFileOpt = None,
    ca_file: CaFileOpt = None,
    output: OutputOpt = "table",
) -> None:
    """Stop sending; devices already sent keep their revision."""
    c = _connection(ctx, server=server, token_file=token_file, ca_file=ca_file)
    _action("pause", rollout_id, reason, c, output)


@rollout_app.command("resume")
def resume(
    ctx: typer.Context,
    rollout_id: IdArg,
    server: ServerOpt = None,
    token_file: TokenFileOpt = None,
    ca_file: CaFileOpt = None,
    output: OutputOpt = "table",
) -> None:
    """Go on with a paused rollout."""
    c = _connection(ctx, server=server, token_file=token_file, ca_file=ca_file)
    _action("resume", rollout_id, "", c, output)


@rollout_app.command("approve")
def approve(
    ctx: typer.Context,
    rollout_id: IdArg,
    server: ServerOpt = None,
    token_file: TokenFileOpt = None,
    ca_file: CaFileOpt = None,
    output: OutputOpt = "table",
) -> None:
    """Start the wave that waits for an approval."""
    c = _connection(ctx, server=server, token_file=token_file, ca_file=ca_file)
    _action("approve", rollout_id, "", c, output)


@rollout_app.command("abort")
def abort(
    ctx: typer.Context,
    rollout_id: IdArg,
    reason: ReasonOpt = "",
    server: ServerOpt = None,
    token_file: TokenFileOpt = None,
    ca_file: CaFileOpt = None,
    output: OutputOpt = "table",
) -> None:
    """Stop for good: every device sent the change is put back on its previous revision."""
    c = _connection(ctx, server=server, token_file=token_file, ca_file=ca_file)
    _action("abort", rollout_id, reason, c, output)


def render_rollout(view: fb.RolloutView) -> str:
    """A rollout: its state, each wave's counts, then one line per device."""
    spec = view.get("spec") or {}
    lines = [
        f"rollout:       {view['id']}   {view['state']}"
        + (f"   ({view['reason']})" if view.get("reason") else ""),
        f"started:       {view.get('created_at')} by {view.get('created_by')}"
        + (f": {view['comment']}" if view.get("comment") else ""),
        f"limits:        max unavailable {spec.get('max_unavailable')}, soak "
        f"{spec.get('soak_seconds')}s, failure budget {spec.get('failure_budget')}, "
        f"confirm within {spec.get('confirm_within') or '-'}, gate timeout "
        f"{spec.get('gate_timeout')}s",
    ]
    for wave in view.get("waves") or []:
        what = (
            ",".join(wave["devices"])
            if wave.get("devices")
            else wave.get("selector") or f"{wave.get('percent')}% of the rest"
        )
        counts = ", ".join(f"{n} {state}" for state, n in sorted(wave["counts"].items()))
        lines.append(
            f"wave {wave['index']}:        {wave['state']:<17} {what}"
            + (" (approval)" if wave.get("approval") else "")
            + f"   {counts or 'no devices'}"
        )
    rows = [("DEVICE", "WAVE", "STATE", "VERSIONS", "REASON")]
    for m in view.get("members") or []:
        gates = m.get("gates") or {}
        reason = m.get("reason") or gates.get("reason") or "-"
        versions = f"{m.get('from_version')}->{m.get('sent_version') or '-'}"
        if m.get("reverted_version"):
            versions += f"->{m['reverted_version']}"
        rows.append((str(m["device"]), str(m["wave"]), str(m["state"]), versions, str(reason)))
    lines.append(table(rows))
    return "\n".join(lines)
