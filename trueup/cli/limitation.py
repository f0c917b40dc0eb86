"""`trueup limitation add|list|withdraw` — known limitations from the console.

Known limitations (`trueup.journal.limitations`) are permanent, reviewed
records of accepted differences. The commands go through the agent's API when
it answers (`/v1/limitations`) and write the state directory themselves
otherwise; either way the change is audited.
"""

from __future__ import annotations

from typing import Annotated

import typer

from trueup.cli.device import device_for
from trueup.cli.evidence import DEFAULT_DIR, OutputOpt
from trueup.cli.statedir import StateDirOpt

__all__ = ["limitation_app"]

limitation_app = typer.Typer(no_args_is_help=True)  # its help: trueup.cli.commands.GROUPS


# -- limitations -------------------------------------------------------------------
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
    record = device_for(state_dir).add_limitation(
        subsystem, path, reason=reason, reviewed_by=reviewed_by, ticket=ticket
    )
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

    records = [r.to_json() for r in list_limitations(state_dir, include_withdrawn=all_)]
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
    record = device_for(state_dir).withdraw_limitation(limitation_id, reason)
    typer.echo(f"{record['id']}: withdrawn at {record['withdrawn_at']}")
