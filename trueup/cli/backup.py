"""`trueup backup create|upload` and `trueup restore analyze` — archives from the console.

Both work with the agent running or stopped: `backup create` takes the
writer lock for its snapshot and reads Kea's leases read-only (socket, else
the stopped memfile); `restore analyze` reads the archive and the state
directory and changes nothing. Exit codes of `restore analyze`: 0 when at
least a config-only restore is eligible, 1 otherwise (or on an unreadable
archive), 2 on bad arguments. The JSON output (`-o json`) is documented in
docs/backup-restore.md. `backup upload` sends an archive to the control plane,
which keeps the newest per device (docs/control-plane.md, Backups);
`upload_archive` is the function behind it.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from trueup.cli.statedir import NewStateDirOpt, StateDirOpt, require_new

if TYPE_CHECKING:
    from trueup.backup.analysis import AnalysisJSON
    from trueup.journal.restore import RestoreRecord
    from trueup.model.jsontypes import JSONObject

__all__ = ["backup_app", "restore_app", "upload_archive"]

# Their help: trueup.cli.commands.GROUPS.
backup_app = typer.Typer(no_args_is_help=True)
restore_app = typer.Typer(no_args_is_help=True)

DEFAULT_DIR = Path("/var/lib/trueup")


@backup_app.command("create")
def create(
    out: Annotated[Path, typer.Option("--out", help="the archive to write (0600, atomically)")],
    with_leases: Annotated[
        bool, typer.Option("--with-leases", help="also Kea's leases (read-only)")
    ] = False,
    state_dir: StateDirOpt = DEFAULT_DIR,
) -> None:
    """Write a consistent snapshot: revisions, applied record, zones, audit excerpt[, leases]."""
    from trueup.backup.create import BackupError, create_backup
    from trueup.cli.output import echo

    try:
        manifest = create_backup(state_dir, out, with_leases=with_leases)
    except (BackupError, OSError) as exc:
        echo(f"trueup backup create: {exc}", err=True)
        raise typer.Exit(1) from None
    from trueup.backup.format import LEASES

    leases = manifest.components.get(LEASES)
    counts = ", ".join(f"DHCPv{k}: {v}" for k, v in (leases or {}).get("counts", {}).items())
    echo(
        f"{out}: device {manifest.device}, revision {manifest.revision['version']}, "
        f"{len(manifest.entries)} entries"
        + (f", leases ({counts or 'no Kea configured'})" if leases is not None else "")
    )


def _links() -> list[str]:
    """The names of this host's network interfaces (what an archive's are mapped onto)."""
    return [name for _index, name in socket.if_nameindex()]


@restore_app.command("analyze")
def analyze(
    file: Path,
    output: Annotated[str, typer.Option("-o", "--output", help="table | json")] = "table",
    maps: Annotated[
        list[str] | None,
        typer.Option("--map", help="OLD=NEW: the archive's interface OLD is NEW here (repeat)"),
    ] = None,
    state_dir: NewStateDirOpt = DEFAULT_DIR,
) -> None:
    """Check an archive and say which restore modes are eligible and what each would change."""
    from trueup.backup.analysis import analyze as run_analysis
    from trueup.backup.interfaces import parse_mappings
    from trueup.cli.output import echo, emit
    from trueup.journal.state import StateDir

    try:
        mappings = parse_mappings(maps or [])
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    if output not in ("table", "json"):
        raise typer.BadParameter(f"unknown output format {output!r}")
    # Read only: a replacement router's missing or empty directory is analysed as one
    # with nothing applied yet (a parent folder or someone else's files are refused).
    require_new(state_dir)
    result = run_analysis(file, StateDir(state_dir), _links(), mappings)
    body = result.to_json()
    if output == "json":
        emit(body, "json")
    else:
        for line in render(body):
            echo(line)
    raise typer.Exit(0 if body["eligible"]["config-only"] else 1)


def _yes(value: bool) -> str:
    return "yes" if value else "NO"


def render(body: AnalysisJSON) -> list[str]:
    """The analysis as an operator reads it: verdict per mode first, then why."""
    lines = [f"archive    {body['archive']}"]
    if body["device"] is not None:
        revision = body["revision"] or {}
        lines.append(
            f"made       {body['created_at']} on {body['device']} by trueup "
            f"{body['agent_version']} (format {body['format_version']})"
        )
        lines.append(
            f"revision   {revision.get('version')} ({str(revision.get('digest'))[:19]}…, "
            f"{revision.get('origin')})"
        )
    lines.append("")
    for mode in ("config-only", "full"):
        plan = body["plans"].get(mode)
        if body["eligible"][mode] and plan:
            changes = plan["changes"]
            what = ", ".join(f"{k} {v}" for k, v in changes["sections"].items()) or "nothing"
            leases = plan["leases"]
            lease_text = (
                leases if isinstance(leases, str) else f"restores {leases['restore']} lease(s)"
            )
            lines.append(
                f"{mode:<12} ELIGIBLE: applies revision {plan['revision'].get('version')}; "
                f"changes {what} ({changes['paths_changed']} path(s)); {lease_text}"
            )
        else:
            refusals = body["refusals"][mode]
            first = refusals[0] if refusals else {"entry": "?", "message": "?", "code": "?"}
            more = f" (+{len(refusals) - 1} more)" if len(refusals) > 1 else ""
            lines.append(
                f"{mode:<12} REFUSED: {first['entry']}: {first['message']} [{first['code']}]{more}"
            )
    lines += ["", f"{'COMPONENT':<20} {'PRESENT':<8} ELIGIBLE"]
    for name, info in body["components"].items():
        lines.append(f"{name:<20} {_yes(info['present']):<8} {_yes(info['eligible'])}")
    if body["problems"]:
        lines += ["", "problems:"]
        lines += [f"  {p['entry']}: {p['message']} [{p['code']}]" for p in body["problems"]]
    if body["warnings"]:
        lines += ["", "warnings:"]
        lines += [f"  {w}" for w in body["warnings"]]
    lines.append("")
    if body["eligible"]["config-only"]:
        mode = "full" if body["eligible"]["full"] else "config-only"
        lines.append(f"next: trueup restore apply {body['archive']} --mode {mode}")
    elif any(p["code"] in ("interface_missing", "interface_map_invalid") for p in body["problems"]):
        lines.append(
            "next: name this router's interface for each one above: --map OLD=NEW (repeat), "
            "and analyse again"
        )
    elif any(p["code"] == "device_mismatch" for p in body["problems"]):
        lines.append("next: this archive is another router's; use this router's own backup")
    else:
        lines.append("next: config cannot be restored from this archive; get another copy")
    return lines


def upload_archive(
    path: Path, control_plane: str | None, token_file: Path, metadata: JSONObject | None = None
) -> JSONObject:
    """Upload `path` with this device's credential; the control plane's summary of the backup
    (as `ControlPlaneClient.upload_backup` answers it). `metadata`: the operator's, checked by
    the control plane. Raises trueup.agent.cpclient.ControlPlaneError."""
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

    meta: JSONObject | None = None
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


def _print_restore(record: RestoreRecord, output: str) -> None:
    from trueup.cli.output import echo, emit

    if output == "json":
        emit(record, "json")
        return
    echo(
        f"restore {record.get('id')}: {record.get('state')} ({record.get('mode')} of "
        f"{record.get('archive')})"
    )
    if record.get("problem"):
        echo(f"problem: {record['problem']}")
    echo(f"next: {record.get('next')}")


def _exit_code(record: RestoreRecord) -> int:
    """0 completed, or waiting for the reboot it was asked to wait for; 1 otherwise (refused,
    rolled back, or waiting for links or a retry: the agent goes on by itself)."""
    if record.get("state") == "completed":
        return 0
    waiting = record.get("state") == "awaiting_restart" and record.get("reboot")
    return 0 if waiting and not record.get("waiting") and not record.get("problem") else 1


@restore_app.command("apply")
def apply(
    file: Path,
    mode: Annotated[
        str | None, typer.Option("--mode", help="config-only | full (required)")
    ] = None,
    maps: Annotated[
        list[str] | None,
        typer.Option("--map", help="OLD=NEW: the archive's interface OLD is NEW here (repeat)"),
    ] = None,
    reboot: Annotated[
        bool, typer.Option("--reboot", help="apply only after the router has rebooted")
    ] = False,
    output: Annotated[str, typer.Option("-o", "--output", help="table | json")] = "table",
    state_dir: NewStateDirOpt = DEFAULT_DIR,
) -> None:
    """Restore FILE (analysed again first) as a journaled state machine; resumes a pending one.

    Exit 0 when it completed or waits for the reboot `--reboot` asked for; 1 when it was
    refused (nothing changed), rolled back, or stopped with a problem (`trueup restore status`).
    """

    from trueup.backup.interfaces import parse_mappings

    if mode is None:
        raise typer.BadParameter(
            f"--mode is required: config-only (the configuration; the lease files are not "
            f"touched) or full (also the leases; needs an archive made with --with-leases). "
            f"`trueup restore analyze {file}` says which mode this archive allows"
        )
    if mode not in ("config-only", "full"):
        raise typer.BadParameter(f"--mode {mode!r}: expected config-only or full")
    # The first step on a replacement router: a missing or empty directory becomes its
    # state directory (a parent folder or someone else's files are still refused).
    require_new(state_dir)
    try:
        mappings = parse_mappings(maps or [])
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    from trueup.cli.device import device_for

    record = device_for(state_dir).restore(file, mode, mappings, reboot=reboot)
    _print_restore(record, output)
    raise typer.Exit(_exit_code(record))


@restore_app.command("status")
def status(
    output: Annotated[str, typer.Option("-o", "--output", help="table | json")] = "table",
    state_dir: StateDirOpt = DEFAULT_DIR,
) -> None:
    """The restore's state (pending or last finished) and what happens next."""
    from trueup.cli.output import echo, emit
    from trueup.journal.restore import read_record

    record = read_record(state_dir)
    if record is None:
        if output == "json":
            emit({"restore": None}, "json")
        else:
            echo("no restore recorded")
        return
    _print_restore(record, output)  # restore.json, as journal reads it
