"""`trueup dhcp leases | fence show|hold|lift` — DHCP from the console.

`leases` is the read-only lease inspection: through Kea's control socket
when Kea runs, else from its memfile (`trueup.system.kealeases`). It never
starts, stops or reconfigures Kea and works with the agent stopped.

`fence hold` writes the `dhcp` fence (durably, before anything else) and then
tells a running Kea to stop allocating (`dhcp-disable`, and its configuration
set again with the fence class that drops every packet); `fence lift` removes
it, removes the class and re-enables allocation. Both go through the DHCP
subsystem's fence hook (`follow_fence`, found through the registry), which
the restore uses too; it also makes the file each Kea starts from follow the
record. Both are audited (`fence_held`, `fence_lifted`).
The agent re-asserts the fence at every Kea (re)start, whatever the CLI did.
"""

from __future__ import annotations

import os
import pwd
from pathlib import Path
from typing import Annotated, Any

import typer

from trueup.cli.statedir import StateDirOpt

__all__ = ["dhcp_app"]

dhcp_app = typer.Typer(help="DHCP (Kea): leases and the allocator fence.", no_args_is_help=True)
fence_app = typer.Typer(
    help="The durable allocator fence: while held, Kea hands out no lease.", no_args_is_help=True
)
dhcp_app.add_typer(fence_app, name="fence")

OutputOpt = Annotated[str, typer.Option("-o", "--output", help="table | json | yaml")]
DEFAULT_DIR = Path("/var/lib/trueup")


def _run_dir(state_dir: Path, family: int) -> Path:
    return state_dir / "run" / f"kea-dhcp{family}"


def _has_kea(state_dir: Path, family: int) -> bool:
    """Whether trueup ever ran Kea for `family` here: its configuration or a lease file."""
    run = _run_dir(state_dir, family)
    return (run / f"kea-dhcp{family}.conf").exists() or any(run.glob(f"kea-leases{family}.csv*"))


def _expires(epoch: Any) -> str:
    from datetime import UTC, datetime

    try:
        return datetime.fromtimestamp(int(epoch), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (TypeError, ValueError, OverflowError, OSError):
        return str(epoch)


@dhcp_app.command("leases")
def leases(state_dir: StateDirOpt = DEFAULT_DIR, output: OutputOpt = "table") -> None:
    """Kea's leases, read-only: from its control socket, or its lease file when it is stopped."""
    from trueup.cli.output import echo, emit
    from trueup.system.kea import kea_paths
    from trueup.system.kealeases import read_leases

    rows: list[dict[str, Any]] = []
    sources: dict[str, str] = {}
    families = [family for family in (4, 6) if _has_kea(state_dir, family)]
    if not families:
        echo(
            f"trueup dhcp leases: no DHCP in {state_dir}: trueup never ran Kea here "
            f"(no {_run_dir(state_dir, 4)}/kea-dhcp4.conf, no lease file). Is spec.dhcp "
            "applied, and is --state-dir (or TRUEUP_STATE_DIR) the agent's?",
            err=True,
        )
        raise typer.Exit(1)
    for family in families:
        run = _run_dir(state_dir, family)
        paths = kea_paths(run, family)
        try:
            source, found = read_leases(family, socket_path=paths.socket, lease_file=paths.leases)
            rows.extend(dict(lease.to_json()) for lease in found)
        except (OSError, ValueError) as exc:
            echo(f"trueup dhcp leases: DHCPv{family}: {exc}", err=True)
            raise typer.Exit(1) from exc
        sources[f"dhcp{family}"] = source
    from trueup.model.order import natural_key

    # Addresses by value: 203.0.113.20 before 203.0.113.100.
    rows.sort(key=lambda row: (row["family"], natural_key(row["address"])))
    if output in ("json", "yaml"):
        emit({"sources": sources, "leases": rows}, output)
        return
    if output != "table":
        raise typer.BadParameter(f"unknown output format {output!r}")
    echo(f"{'ADDRESS':<40} {'HWADDR/DUID':<24} {'HOSTNAME':<20} {'EXPIRES (UTC)':<20}  STATE")
    for row in rows:
        ident = row["hwaddr"] or row["client_id"]
        echo(
            f"{row['address']:<40} {ident:<24} {row['hostname']:<20} "
            f"{_expires(row['expire']):<20}  {row['state']}"
        )
    echo(
        f"{len(rows)} lease(s) from "
        + (", ".join(f"{k}: {v}" for k, v in sources.items()) or "no Kea")
    )


def _operator() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def _assert_allocator(state_dir: Path) -> list[str]:
    """Make each running Kea follow the fence now (the DHCP subsystem's fence hook, the
    restore's too); what happened, per family."""
    from trueup.subsystems.registry import fence_follower

    done = []
    for followed in fence_follower("dhcp").follow_fence(state_dir, wait=5.0):
        if followed.state:
            done.append(f"{followed.daemon}: allocation {followed.state}")
        else:
            done.append(
                f"{followed.daemon}: not told yet ({followed.problem}); the agent asserts it"
            )
    if not done:
        done.append(
            f"no Kea runs from {state_dir}: the agent asserts the fence whenever it starts Kea"
        )
    return done


@fence_app.command("show")
def fence_show(state_dir: StateDirOpt = DEFAULT_DIR, output: OutputOpt = "table") -> None:
    """Whether the dhcp fence is held, by whom, why and since when."""
    from trueup.cli.output import echo, emit
    from trueup.system.fence import read_fence

    fence = read_fence(state_dir, "dhcp")
    if output in ("json", "yaml"):
        emit({"fence": fence.to_json() if fence else None}, output)
    elif fence is None:
        echo("dhcp: no fence held")
    else:
        echo(f"dhcp: fenced by {fence.owner} since {fence.since}: {fence.reason}")


@fence_app.command("hold")
def fence_hold(
    reason: Annotated[str, typer.Option(help="why (audited, shown in status)")],
    owner: Annotated[str | None, typer.Option(help="who holds it (default: you)")] = None,
    state_dir: StateDirOpt = DEFAULT_DIR,
) -> None:
    """Hold the dhcp fence: Kea hands out no lease until it is lifted."""
    from trueup.cli.output import echo
    from trueup.journal.state import StateDir
    from trueup.system.fence import hold_fence

    fence = hold_fence(state_dir, "dhcp", owner or _operator(), reason)
    StateDir(state_dir).audit.append(
        "fence_held", actor=_operator(), subsystem="dhcp", owner=fence.owner, reason=reason
    )
    echo(f"dhcp: fence held by {fence.owner}: {reason}")
    for line in _assert_allocator(state_dir):
        echo(line)


@fence_app.command("lift")
def fence_lift(
    reason: Annotated[str, typer.Option(help="why (audited)")] = "work completed",
    state_dir: StateDirOpt = DEFAULT_DIR,
) -> None:
    """Lift the dhcp fence: Kea allocates again."""
    from trueup.cli.output import echo
    from trueup.journal.state import StateDir
    from trueup.system.fence import fence_path, lift_fence

    lifted = lift_fence(state_dir, "dhcp")
    if lifted is None:
        # Nothing changed; a running Kea is still made to follow the (absent) record.
        echo(
            f"trueup dhcp fence lift: no dhcp fence is held in {state_dir} "
            f"({fence_path(state_dir, 'dhcp')} does not exist); nothing was lifted. "
            "Is --state-dir (or TRUEUP_STATE_DIR) the agent's?",
            err=True,
        )
        for line in _assert_allocator(state_dir):
            if line.startswith("kea-"):
                echo(line)
        raise typer.Exit(1)
    StateDir(state_dir).audit.append(
        "fence_lifted", actor=_operator(), subsystem="dhcp", owner=lifted.owner, reason=reason
    )
    echo(f"dhcp: fence lifted (was held by {lifted.owner}: {lifted.reason})")
    for line in _assert_allocator(state_dir):
        echo(line)
