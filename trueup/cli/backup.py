"""`trueup backup upload FILE` — send a backup archive of this device to its control plane.

The archive is opaque here (its format is `trueup backup create`'s); the
control plane keeps the newest archives per device (docs/control-plane.md,
Backups). `upload_archive` is the function behind the command, for other
commands that upload what they made (e.g. a `--upload` flag of `backup create`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

__all__ = ["backup_app", "upload_archive"]

backup_app = typer.Typer(
    help="Backups of this router, kept by the control plane.", no_args_is_help=True
)


def upload_archive(
    path: Path, control_plane: str | None, token_file: Path, metadata: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Upload `path` with this device's credential; the control plane's summary of the backup.
    Raises trueup.agent.cpclient.ControlPlaneError."""
    from trueup.agent.cpclient import ControlPlaneClient

    client = ControlPlaneClient(control_plane, token_file)
    try:
        return client.upload_backup(path, metadata)
    finally:
        client.close()


@backup_app.command("upload")
def upload(
    file: Annotated[Path, typer.Argument(help="the backup archive")],
    control_plane: Annotated[
        str, typer.Option(envvar="TRUEUP_CONTROL_PLANE", help="control-plane URL")
    ],
    token_file: Annotated[
        Path, typer.Option(envvar="TRUEUP_TOKEN_FILE", help="device credential file")
    ],
    metadata: Annotated[
        str | None,
        typer.Option(
            help="JSON: format_version, created_at, agent_version, applied_revision, with_leases"
        ),
    ] = None,
    output: Annotated[str, typer.Option("-o", "--output", help="text | json")] = "text",
) -> None:
    """Upload a backup archive to the control plane (streamed; sha256 checked there)."""
    from trueup.agent.cpclient import ControlPlaneError

    meta: dict[str, Any] | None = None
    if metadata is not None:
        try:
            parsed = json.loads(metadata)
        except ValueError as exc:
            typer.echo(f"error: --metadata is not JSON: {exc}", err=True)
            raise typer.Exit(1) from None
        if not isinstance(parsed, dict):
            typer.echo("error: --metadata must be a JSON object", err=True)
            raise typer.Exit(1)
        meta = parsed
    try:
        stored = upload_archive(file, control_plane, token_file, meta)
    except ControlPlaneError as exc:
        typer.echo(f"error: backup upload failed: {exc}", err=True)
        raise typer.Exit(1) from None
    if output == "json":
        typer.echo(json.dumps(stored, indent=2, sort_keys=True))
        return
    pruned = stored.get("pruned") or []
    typer.echo(
        f"uploaded backup {stored['id']} of {stored['device']}: {stored['size']} bytes, "
        f"sha256 {stored['sha256']}"
        + (f"; retention removed {', '.join(map(str, pruned))}" if pruned else "")
    )
