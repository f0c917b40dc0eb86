"""`trueup secret set NAME | list` — the agent's secret store from the console.

For routers without a control plane: a document refers to keys by name
(`private_key: {secret_ref: wg0-key}`), and the value is stored here, in
`STATE_DIR/secrets/NAME` (0600, directory 0700; `trueup.system.secretstore`).
The value comes from `--from-file` or standard input, never from argv (where
`ps` and shell history would show it). `list` prints names only. Setting a
secret is audited by name and digest (`secret_set`), never by value; a
running agent uses the new value at its next look (the WireGuard key fact
compares the live key with the stored one).
"""

from __future__ import annotations

import os
import pwd
import sys
from pathlib import Path
from typing import Annotated

import typer

from trueup.cli.statedir import NewStateDirOpt, StateDirOpt, require_new

__all__ = ["secret_app"]

secret_app = typer.Typer(no_args_is_help=True)  # its help: trueup.cli.commands.GROUPS

DEFAULT_DIR = Path("/var/lib/trueup")


def _operator() -> str:
    try:
        return f"cli:{pwd.getpwuid(os.getuid()).pw_name}"
    except KeyError:
        return f"cli:uid-{os.getuid()}"


def _read_value(from_file: Path | None) -> str:
    """The value, read bounded (a huge file or stream is refused, not slurped)."""
    from trueup.system.secretstore import MAX_BYTES, SecretError

    if from_file is not None:
        with open(from_file, "rb") as handle:
            data = handle.read(MAX_BYTES + 2)
    elif sys.stdin.isatty():
        import getpass

        # Typed at a terminal: not echoed to the screen.
        data = getpass.getpass("secret value: ").encode()
    else:
        data = sys.stdin.buffer.read(MAX_BYTES + 2)
    if len(data) > MAX_BYTES + 1:
        raise SecretError(f"the value is over {MAX_BYTES} bytes")
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise SecretError("the value is not UTF-8 text") from None


@secret_app.command("set")
def secret_set(
    name: str,
    from_file: Annotated[
        Path | None, typer.Option("--from-file", help="read the value from this file")
    ] = None,
    state_dir: NewStateDirOpt = DEFAULT_DIR,
) -> None:
    """Store secret NAME from --from-file or standard input (never from the command line)."""
    from trueup.cli.output import echo
    from trueup.journal.state import StateDir, StateDirError
    from trueup.system.secretstore import SecretError, secret_digest, write_secret

    # A key stored before the first apply (a WireGuard key the document names) is the
    # first step on a new router: a missing or empty directory becomes a state directory.
    require_new(state_dir)
    try:
        value = _read_value(from_file)
        StateDir(state_dir).ensure(created_by="trueup secret set", actor=_operator())
        path = write_secret(state_dir, name, value)
    except (SecretError, StateDirError, OSError) as exc:
        echo(f"trueup secret set: {exc}", err=True)
        raise typer.Exit(1) from exc
    # Every write is audited, the first one too: the directory and its log exist by now.
    StateDir(state_dir).audit.append(
        "secret_set", actor=_operator(), name=name, digest=secret_digest(value)
    )
    echo(f"secret {name}: stored in {path}")


@secret_app.command("list")
def secret_list(state_dir: StateDirOpt = DEFAULT_DIR) -> None:
    """The names of the stored secrets (never their values)."""
    from trueup.cli.output import echo
    from trueup.system.secretstore import list_secrets

    for name in list_secrets(state_dir):
        echo(name)
