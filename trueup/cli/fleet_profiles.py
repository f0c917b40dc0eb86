"""`trueup fleet profile create|edit|show|list|versions|delete` — profiles on the control plane.

A profile is a partial device document with typed variables and a selector
(docs/fleet.md). Every write sends the version it replaces (If-Match): `create`
0 (refused when the name exists), `edit` the version it showed (or read from
FILE; without FILE the profile opens in $VISUAL or $EDITOR), `delete --version
N`. Someone else's newer version is refused with the version it is at now:
show it and edit again. Every version stays readable (`show --version N`,
`versions`). Storing a profile changes no device until a plan is published
(`trueup fleet plan`, `trueup fleet publish`).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from trueup.cli.fleet import CaFileOpt, OutputOpt, ServerOpt, TokenFileOpt
from trueup.cli.fleetapi import (
    Connection,
    call,
    checked,
    conn,
    fail,
    profile_url,
    read_document,
    table,
)
from trueup.cli.output import emit

if TYPE_CHECKING:
    from trueup.cli.fleetbodies import StoredProfile

__all__ = ["CommentOpt", "profile_app"]

profile_app = typer.Typer(
    help="Profiles: partial device documents with typed variables, versioned (If-Match).",
    no_args_is_help=True,
)

CommentOpt = Annotated[str, typer.Option("--comment", help="why (kept with the version)")]


@profile_app.command("create")
def profile_create(
    ctx: typer.Context,
    file: Annotated[Path, typer.Argument(help="the profile (YAML or JSON)")],
    comment: CommentOpt = "",
    server: ServerOpt = None,
    token_file: TokenFileOpt = None,
    ca_file: CaFileOpt = None,
    output: OutputOpt = "table",
) -> None:
    """Store a new profile (refused when one of its name exists). Changes no device."""
    c = conn(ctx, server=server, token_file=token_file, ca_file=ca_file)
    document = read_document(file)
    metadata = document.get("metadata") if isinstance(document, dict) else None
    name = metadata.get("name") if isinstance(metadata, dict) else None
    if not isinstance(name, str) or not name:
        fail(f"{file}: metadata.name: a profile names itself (a DNS label)")
    status, body, _ = call(
        c,
        "PUT",
        profile_url(name),
        body=document,
        headers={"If-Match": "0", "X-Trueup-Comment": comment},
    )
    if status == 409:
        fail(f"profile {name} exists (version {body.get('current_version')}): use edit")
    _stored(checked(status, body, f"profile {name}"), output)


def _stored(body: StoredProfile, output: str) -> None:
    if output != "table":
        emit(body, output)
        return
    typer.echo(
        f"profile {body['name']} version {body['version']} stored; no device changes until a "
        "plan is published (trueup fleet plan, trueup fleet publish)"
    )


@profile_app.command("edit")
def profile_edit(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="profile name")],
    file: Annotated[
        Path | None, typer.Argument(help="the new profile (default: edit it in $EDITOR)")
    ] = None,
    comment: CommentOpt = "",
    server: ServerOpt = None,
    token_file: TokenFileOpt = None,
    ca_file: CaFileOpt = None,
    output: OutputOpt = "table",
) -> None:
    """Store the next version of a profile, replacing the version shown (If-Match)."""
    import yaml

    c = conn(ctx, server=server, token_file=token_file, ca_file=ca_file)
    status, body, _ = call(c, "GET", profile_url(name))
    shown = checked(status, body, f"profile {name}")
    version = int(shown["version"])
    if file is not None:
        document = read_document(file)
        _put_next(c, name, version, document, comment, output)
        return
    editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
    tmp = Path(tempfile.mkdtemp(prefix="trueup-profile-"))
    path = tmp / f"{name}.yaml"
    text = yaml.safe_dump(shown["document"], sort_keys=False)
    path.write_text(text)
    if subprocess.call([*shlex.split(editor), str(path)]) != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        fail(f"{editor} failed; nothing was changed")
    if path.read_text() == text:
        shutil.rmtree(tmp, ignore_errors=True)
        typer.echo(f"profile {name}: no change (still version {version})")
        return
    try:
        _put_next(c, name, version, read_document(path), comment, output)
    except typer.Exit:  # refused: the edit is kept, not lost with the temporary file
        typer.echo(
            f"trueup fleet: your edit is kept in {path}: fix it, then "
            f"`trueup fleet profile edit {name} {path}`",
            err=True,
        )
        raise
    shutil.rmtree(tmp, ignore_errors=True)


def _put_next(
    c: Connection, name: str, version: int, document: Any, comment: str, output: str
) -> None:
    status, body, _ = call(
        c,
        "PUT",
        profile_url(name),
        body=document,
        headers={"If-Match": str(version), "X-Trueup-Comment": comment},
    )
    _stored(checked(status, body, f"profile {name}"), output)


@profile_app.command("show")
def profile_show(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="profile name")],
    version: Annotated[int | None, typer.Option("--version", help="an earlier version")] = None,
    server: ServerOpt = None,
    token_file: TokenFileOpt = None,
    ca_file: CaFileOpt = None,
    output: OutputOpt = "table",
) -> None:
    """A profile's newest version (or version N): who stored it, when, and its document."""
    import yaml

    c = conn(ctx, server=server, token_file=token_file, ca_file=ca_file)
    status, body, _ = call(c, "GET", profile_url(name), params={"version": version})
    shown = checked(status, body, f"profile {name}")
    if output != "table":
        emit(shown, output)
        return
    state = "  (deleted)" if shown.get("deleted") else ""
    typer.echo(
        f"# profile {shown['name']} version {shown['version']}{state}, by {shown['created_by']}"
        f" at {_when(shown['created_at'])}"
        + (f": {shown['comment']}" if shown.get("comment") else "")
    )
    typer.echo(yaml.safe_dump(shown["document"], sort_keys=False).rstrip())


def _when(at: Any) -> str:
    """Epoch seconds as UTC ISO 8601 (what the server sends as a number)."""
    from datetime import UTC, datetime

    try:
        return datetime.fromtimestamp(float(at), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (TypeError, ValueError, OverflowError, OSError):
        return str(at)


@profile_app.command("list")
def profile_list(
    ctx: typer.Context,
    server: ServerOpt = None,
    token_file: TokenFileOpt = None,
    ca_file: CaFileOpt = None,
    output: OutputOpt = "table",
) -> None:
    """Every profile: its newest version, priority and selector."""
    c = conn(ctx, server=server, token_file=token_file, ca_file=ca_file)
    status, body, _ = call(c, "GET", "/api/v1/profiles")
    found = checked(status, body, "profiles")
    if output != "table":
        emit(found, output)
        return
    rows = [("NAME", "VERSION", "PRIORITY", "SELECTOR", "BY")]
    for p in found["profiles"]:
        rows.append(
            (
                p["name"],
                str(p["version"]),
                str(p.get("priority")),
                p.get("selector") or '"" (every device)',
                p["created_by"],
            )
        )
    typer.echo(table(rows))
    typer.echo(f"{len(found['profiles'])} profile(s)")


@profile_app.command("versions")
def profile_versions(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="profile name")],
    server: ServerOpt = None,
    token_file: TokenFileOpt = None,
    ca_file: CaFileOpt = None,
    output: OutputOpt = "table",
) -> None:
    """Every version of a profile, oldest first (its deletion included)."""
    c = conn(ctx, server=server, token_file=token_file, ca_file=ca_file)
    status, body, _ = call(c, "GET", profile_url(name) + "/versions")
    found = checked(status, body, f"profile {name}")
    if output != "table":
        emit(found, output)
        return
    rows = [("VERSION", "BY", "DIGEST", "COMMENT")]
    for v in found["versions"]:
        rows.append(
            (
                str(v["version"]) + (" (deleted)" if v["deleted"] else ""),
                v["created_by"],
                v["digest"],
                v.get("comment") or "-",
            )
        )
    typer.echo(table(rows))


@profile_app.command("delete")
def profile_delete(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="profile name")],
    version: Annotated[int, typer.Option("--version", help="the version you delete (If-Match)")],
    comment: CommentOpt = "",
    server: ServerOpt = None,
    token_file: TokenFileOpt = None,
    ca_file: CaFileOpt = None,
    output: OutputOpt = "table",
) -> None:
    """Delete a profile (its versions stay readable). Devices change when a plan is published."""
    c = conn(ctx, server=server, token_file=token_file, ca_file=ca_file)
    status, body, _ = call(
        c,
        "DELETE",
        profile_url(name),
        headers={"If-Match": str(version), "X-Trueup-Comment": comment},
    )
    deleted = checked(status, body, f"profile {name}")
    if output != "table":
        emit(deleted, output)
        return
    typer.echo(f"profile {name} deleted (version {deleted['version']}); trueup fleet plan shows")
