"""`--state-dir` for the full CLI: refuse what is not a state directory before anything runs.

Every command taking `--state-dir` (or `TRUEUP_STATE_DIR`) declares it with
`StateDirOpt`, whose callback runs before the command: a directory without
an identity (`trueup.journal.identity.problem`) is exit 1 with one line naming
the path, what it holds and which commands create one; nothing is read
further, written or started. `--device NAME` (or `TRUEUP_DEVICE`) before the
command also refuses a state directory that belongs to another device.

The two commands that create a state directory — `agent run` and `apply
--init` — declare theirs with `NewStateDirOpt` and check it themselves
(`require_new`); `preflight` does too, since it checks a directory an agent is
about to create.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from trueup.cli.commands import NEW_STATE_DIR, STATE_DIR
from trueup.cli.exitcodes import option
from trueup.journal.identity import (
    DEVICE_ENV,
    creation_problem,
    device_mismatch,
    legacy,
    problem,
    read_marker,
)

__all__ = [
    "NewStateDirOpt",
    "StateDirOpt",
    "applied_device",
    "check_device",
    "require_new",
    "require_state_dir",
]


def _exit(message: str) -> NoReturn:
    typer.echo(message, err=True)
    raise typer.Exit(1)


def applied_device(state_dir: Path) -> str | None:
    """The applied document's `metadata.device`; None when nothing is applied (or unreadable)."""
    if not (state_dir / "applied.json").exists():
        return None
    from trueup.backup.analysis import current_device
    from trueup.journal.state import StateDir

    try:
        return current_device(StateDir(state_dir))[0]
    except (OSError, ValueError):
        return None


def check_device(
    state_dir: Path, device: str | None, named_by: str = "the document is for"
) -> None:
    """Exit 1 when the state directory belongs to another device than `device`."""
    if not device or not state_dir.is_dir():
        return
    refused = device_mismatch(state_dir, device, known=applied_device(state_dir), named_by=named_by)
    if refused is not None:
        _exit(refused)


def require_state_dir(state_dir: Path) -> None:
    """Exit 1 naming the path unless it is a state directory (of `--device`, when named)."""
    refused = problem(state_dir)
    if refused is not None:
        _exit(refused)
    check_device(state_dir, os.environ.get(DEVICE_ENV), "--device (TRUEUP_DEVICE) names")
    if (state_dir / "state.json").exists() and legacy(read_marker(state_dir)):
        typer.echo(
            f"trueup: note: {state_dir} was made by a trueup from before state-directory "
            "identities; the next `trueup agent run` records whose it is",
            err=True,
        )


def require_new(state_dir: Path) -> None:
    """For `agent run` / `apply --init`: exit 1 when `state_dir` must not become one."""
    refused = creation_problem(state_dir)
    if refused is not None:
        _exit(refused)
    check_device(state_dir, os.environ.get(DEVICE_ENV), "--device (TRUEUP_DEVICE) names")


def _checked(value: Path) -> Path:
    require_state_dir(value)
    return value


StateDirOpt = Annotated[Path, option(STATE_DIR, show_default=True, callback=_checked)]
NewStateDirOpt = Annotated[Path, option(NEW_STATE_DIR, show_default=True)]
