"""`trueup limitation add|list|withdraw` — known limitations from the console.

Known limitations (`trueup.journal.limitations`) are permanent, reviewed
records of accepted differences. The commands go through the agent's API when
it answers (`/v1/limitations`) and write the state directory themselves
otherwise; either way the change is audited.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from trueup.agent.client import AgentClient
from trueup.cli.evidence import DEFAULT_DIR, OutputOpt
from trueup.cli.statedir import StateDirOpt

__all__ = ["limitation_app"]

limitation_app = typer.Typer(
    help="Known limitations: permanent, reviewed records of accepted differences.",
    no_args_is_help=True,
)


def _fail(message: str, code: int = 1) -> NoReturn:
    typer.echo(f"trueup: {message}", err=True)
    raise typer.Exit(code)


# -- limitations -------------------------------------------------------------------
def _actor() -> str:
    return f"cli:{os.getuid()}"


def _agent_or_none(state_dir: Path) -> AgentClient | None:
    return AgentClient.connect(state_dir)


def _body(response: Any) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        _fail(f"agent answered {response.status_code}: {response.text[:200]}")
    if response.status_code >= 400:
        _fail(str(body.get("detail") or body.get("message") or body))
    return dict(body)


@limitation_app.command("add")
def limitation_add(
    subsystem: str,
    path: Annotated[str, typer.Argument(help="difference path (exact, prefix or glob)")],
    reason: Annotated[str, typer.Option(help="why the difference is accepted")],
    reviewed_by: Annotated[str, typer.Option("--reviewed-by", help="who reviewed it")],
    ticket: Annotated[str | None, typer.Option(help="the change or problem ticket")] = None,
    state_dir: StateDirOpt = DEFAULT_DIR,
) -> None:
    """Record a permanent, reviewed accepted difference (audited; never expires)."""
    client = _agent_or_none(state_dir)
    body = {
        "subsystem": subsystem,
        "path": path,
        "reason": reason,
        "reviewed_by": reviewed_by,
        "ticket": ticket,
        "actor": _actor(),
    }
    if client is not None:
        record = _body(client.request("POST", "/v1/limitations", json=body))
    else:
        from trueup.journal.limitations import LimitationError, add_limitation
        from trueup.subsystems.registry import default_subsystems

        try:
            record = add_limitation(
                state_dir,
                subsystem,
                path,
                reason=reason,
                reviewed_by=reviewed_by,
                ticket=ticket,
                actor=_actor(),
                known_subsystems=[s.name for s in default_subsystems()],
            )
        except LimitationError as exc:
            _fail(str(exc))
    typer.echo(
        f"{record['id']}: {record['subsystem']} {record['path']} accepted (known limitation)"
    )


@limitation_app.command("list")
def limitation_list(
    state_dir: StateDirOpt = DEFAULT_DIR,
    all_: Annotated[bool, typer.Option("--all", help="include withdrawn ones")] = False,
    output: OutputOpt = "table",
) -> None:
    """List known limitations (in force; `--all` also the withdrawn)."""
    from trueup.journal.limitations import list_limitations

    records = list_limitations(state_dir, include_withdrawn=all_)
    if output != "table":
        from trueup.cli.output import emit

        emit({"limitations": records}, output)
        return
    if not records:
        typer.echo("no known limitations")
        return
    typer.echo(f"{'ID':<5} {'SUBSYSTEM':<12} {'PATH':<36} {'REVIEWED BY':<14} {'ADDED':<21} REASON")
    for r in records:
        state = (
            f" [withdrawn {r['withdrawn_at']}: {r['withdraw_reason']}]"
            if r.get("withdrawn_at")
            else ""
        )
        ticket = f" ({r['ticket']})" if r.get("ticket") else ""
        typer.echo(
            f"{r['id']:<5} {r['subsystem']:<12} {r['path']:<36} {r['reviewed_by']:<14} "
            f"{r['added_at']:<21} {r['reason']}{ticket}{state}"
        )


@limitation_app.command("withdraw")
def limitation_withdraw(
    limitation_id: Annotated[str, typer.Argument(metavar="ID")],
    reason: Annotated[str, typer.Option(help="why it no longer applies")],
    state_dir: StateDirOpt = DEFAULT_DIR,
) -> None:
    """Withdraw a known limitation: its differences count as drift again (audited)."""
    client = _agent_or_none(state_dir)
    if client is not None:
        record = _body(
            client.request(
                "POST",
                f"/v1/limitations/{limitation_id}/withdraw",
                json={"reason": reason, "actor": _actor()},
            )
        )
    else:
        from trueup.journal.limitations import LimitationError, withdraw_limitation

        try:
            record = withdraw_limitation(state_dir, limitation_id, reason=reason, actor=_actor())
        except LimitationError as exc:
            _fail(str(exc))
        except KeyError:
            _fail(f"unknown limitation {limitation_id!r} (see `trueup limitation list --all`)")
    typer.echo(f"{record['id']}: withdrawn at {record['withdrawn_at']}")
