"""`trueup fleet [list|show DEVICE|label DEVICE …]` — the fleet as the control plane sees
it, over its API.

Why this module is over 400 lines: it is the one client of the fleet API for
the command line, its commands sharing one request helper, and the renderers
of the fleet table and of one device that `trueup server fleet` reuses.

Talks to a running control plane (`--server URL`, or `TRUEUP_SERVER`) with a
user token read from a file (`--token-file F`, or `TRUEUP_TOKEN_FILE`; never
on the command line, where `ps` would show it). What a token sees follows its
role and tenant, as on the API (`GET /api/v1/devices`, `GET
/api/v1/devices/{device}`, `PATCH /api/v1/devices/{device}/labels`). `--ca-file` pins the server's certificate when it
is not signed by a CA this host trusts.

`trueup server fleet …` is the same view read straight from the server's
database, for the server's own host.

Output: a table (times ISO 8601 UTC) or `-o json|yaml` (the API's JSON as is).
Labels: `trueup fleet label DEVICE site=ams role=edge oldkey-` sets `site` and
`role` and removes `oldkey` (others stay), and prints the device's labels;
`trueup fleet list -l 'site=ams,role in (edge,core),!lab'` lists the devices a
label selector matches (Kubernetes syntax), with a LABELS column.

Exit codes: 0 answered; 1 the server refused or did not answer (one line: why
and what to check), or a filter value is unknown (`--status drifting`: the
valid values are listed; a selector that does not parse names the position;
nothing is asked of the server).
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from trueup.cli.fleetapi import Connection
from trueup.cli.output import emit, readable
from trueup.model.layering import SelectorError, label_key_problem, parse_selector
from trueup.server.fleet import FILTER_CHOICES, filter_problems

if TYPE_CHECKING:
    from trueup.cli.fleetapi import QueryParams
    from trueup.cli.fleetbodies import FleetDevice

__all__ = [
    "agent_lines",
    "check_filters",
    "check_selector",
    "fleet_app",
    "hint_unknown_keys",
    "label_changes",
    "labels_text",
    "render_device",
    "render_table",
]

fleet_app = typer.Typer(  # its help: trueup.cli.commands.GROUPS
    no_args_is_help=False,
    invoke_without_command=True,
)

ServerOpt = Annotated[
    str | None,
    typer.Option("--server", envvar="TRUEUP_SERVER", help="control-plane URL"),
]
TokenFileOpt = Annotated[
    Path | None,
    typer.Option("--token-file", envvar="TRUEUP_TOKEN_FILE", help="file holding a user API token"),
]
CaFileOpt = Annotated[
    Path | None,
    typer.Option("--ca-file", envvar="TRUEUP_CA_FILE", help="PEM certificate to trust"),
]
StatusOpt = Annotated[
    str | None,
    typer.Option(
        "--status", help="only devices in this state: " + ", ".join(FILTER_CHOICES["status"])
    ),
]
SearchOpt = Annotated[
    str | None,
    typer.Option("--search", help="only devices whose name or reason codes contain this text"),
]
SelectorOpt = Annotated[
    str | None,
    typer.Option(
        "-l",
        "--selector",
        help="only devices whose labels this selector matches: "
        "'site=ams,role in (edge,core),!lab' (Kubernetes syntax)",
    ),
]
OutputOpt = Annotated[str, typer.Option("-o", "--output", help="json | yaml | table")]


def _fail(message: str) -> NoReturn:
    typer.echo(f"trueup fleet: {message}", err=True)
    raise typer.Exit(1)


def check_filters(prefix: str, **given: str | None) -> None:
    """Exit 1 naming each unknown filter value (`--status drifting`) and the valid values."""
    problems = filter_problems("--", **given)
    if problems:
        for problem in problems:
            typer.echo(f"{prefix}: {problem}", err=True)
        raise typer.Exit(1)


def check_selector(prefix: str, selector: str | None) -> None:
    """Exit 1 naming the position and what was expected when `selector` does not parse."""
    if selector is None:
        return
    try:
        parse_selector(selector)
    except SelectorError as exc:
        typer.echo(f"{prefix}: --selector: {exc}", err=True)
        raise typer.Exit(1) from None


def label_changes(args: list[str]) -> dict[str, str | None]:
    """`site=ams` (set), `site=` (set to empty), `oldkey-` (remove) as a JSON merge patch;
    exits 1 naming an argument that is none of these."""
    patch: dict[str, str | None] = {}
    for arg in args:
        key, equals, given = arg.partition("=")
        value: str | None = given
        if not equals and arg.endswith("-"):
            key, value = arg[:-1], None
        elif not equals:
            _fail(f"{arg!r}: expected KEY=VALUE to set a label or KEY- to remove it")
        problem = label_key_problem(key)
        if problem is not None:
            _fail(f"{arg!r}: label key {problem}")
        if key in patch and patch[key] != value:
            _fail(f"{arg!r}: label {key!r} is given twice")
        patch[key] = value
    return patch


def labels_text(labels: Any) -> str:
    """`role=edge,site=ams` (by key), `-` for none."""
    if not isinstance(labels, dict) or not labels:
        return "-"
    return ",".join(f"{key}={labels[key]}" for key in sorted(labels))


def _get(
    server: str | None,
    token_file: Path | None,
    ca_file: Path | None,
    path: str,
    **params: str | None,
) -> Any:
    """GET `path` on the control plane; exits 1 with one line when that fails."""
    return _request("GET", server, token_file, ca_file, path, params=params)


def _request(
    method: str,
    server: str | None,
    token_file: Path | None,
    ca_file: Path | None,
    path: str,
    *,
    params: QueryParams | None = None,
    body: Any = None,
    allowed: str = "read the fleet (viewer or above)",
) -> Any:
    """`method path` on the control plane; exits 1 with one line when that fails."""
    from trueup.cli.fleetapi import call

    connection: Connection = {"server": server, "token_file": token_file, "ca_file": ca_file}
    status, body, _ = call(
        connection,
        method,
        path,
        params=params,
        body=body,
        timeout=30.0,
        role=f"allowed to {allowed}",
        say=_fail,
    )
    if status == 404:
        detail = body.get("detail") if isinstance(body, dict) else None
        _fail(str(detail or f"{path}: not found"))
    if status == 422 and isinstance(body, dict) and body.get("problems"):
        _fail(f"{server} refused the request: " + "; ".join(str(p) for p in body["problems"]))
    if status >= 400:
        _fail(f"{server} answered {status}: {readable(body, 300)}")
    return body


def _list(
    server: str | None,
    token_file: Path | None,
    ca_file: Path | None,
    status: str | None,
    search: str | None,
    output: str,
    selector: str | None = None,
) -> None:
    check_filters("trueup fleet", status=status)
    check_selector("trueup fleet", selector)
    body = _get(server, token_file, ca_file, "/api/v1/devices", status=status, selector=selector)
    devices = list(body.get("devices", []))
    if search:
        needle = search.lower()
        devices = [
            d
            for d in devices
            if needle in d["device"].lower()
            or any(needle in code.lower() for code in d.get("reason_codes", []))
        ]
    if output == "table":
        typer.echo(render_table(devices))
    else:
        emit({"devices": devices, "count": len(devices)}, output)
    if selector and not body.get("devices"):
        hint_unknown_keys(server, token_file, ca_file, selector)


def hint_unknown_keys(
    server: str | None, token_file: Path | None, ca_file: Path | None, selector: str
) -> None:
    """When a selector matched nothing, name on stderr the keys it requires that no device
    carries (a typo like `stie=ams` matches nothing, which is not an error)."""
    body = _get(server, token_file, ca_file, "/api/v1/devices")
    in_use = sorted({key for d in body.get("devices", []) for key in d.get("labels") or {}})
    wanted = [
        r.key
        for r in parse_selector(selector).requirements
        if r.operator in ("exists", "=", "in") and r.key not in in_use
    ]
    if wanted:
        typer.echo(
            f"trueup fleet: no device has the label {', '.join(map(repr, wanted))} that "
            f"--selector {selector!r} requires (labels in use: {', '.join(in_use) or 'none'})",
            err=True,
        )


@fleet_app.callback()
def _fleet(
    ctx: typer.Context,
    server: ServerOpt = None,
    token_file: TokenFileOpt = None,
    ca_file: CaFileOpt = None,
    status: StatusOpt = None,
    search: SearchOpt = None,
    selector: SelectorOpt = None,
    output: OutputOpt = "table",
) -> None:
    """The fleet on the control plane (`trueup fleet` alone lists it)."""
    ctx.obj = {"server": server, "token_file": token_file, "ca_file": ca_file}
    if ctx.invoked_subcommand is None:
        _list(server, token_file, ca_file, status, search, output, selector)


def _connection(
    ctx: typer.Context, *, server: str | None, token_file: Path | None, ca_file: Path | None
) -> Connection:
    """The subcommand's own options, else those given before it (`trueup fleet --server … list`)."""
    given = ctx.obj or {}
    return {
        "server": server if server is not None else given.get("server"),
        "token_file": token_file if token_file is not None else given.get("token_file"),
        "ca_file": ca_file if ca_file is not None else given.get("ca_file"),
    }


@fleet_app.command("list")
def fleet_list(
    ctx: typer.Context,
    server: ServerOpt = None,
    token_file: TokenFileOpt = None,
    ca_file: CaFileOpt = None,
    status: StatusOpt = None,
    search: SearchOpt = None,
    selector: SelectorOpt = None,
    output: OutputOpt = "table",
) -> None:
    """Every device you may see: status, versions, reason codes, labels, last report, in sync
    since."""
    c = _connection(ctx, server=server, token_file=token_file, ca_file=ca_file)
    _list(c["server"], c["token_file"], c["ca_file"], status, search, output, selector)


@fleet_app.command("show")
def fleet_show(
    ctx: typer.Context,
    device: Annotated[str, typer.Argument(help="device name")],
    server: ServerOpt = None,
    token_file: TokenFileOpt = None,
    ca_file: CaFileOpt = None,
    output: OutputOpt = "table",
) -> None:
    """One device: versions and digests, status, reason codes, acknowledgements, last report."""
    from urllib.parse import quote

    c = _connection(ctx, server=server, token_file=token_file, ca_file=ca_file)
    entry = _get(
        c["server"], c["token_file"], c["ca_file"], f"/api/v1/devices/{quote(device, safe='')}"
    )
    if output == "table":
        typer.echo(render_device(entry))
    else:
        emit(entry, output)


@fleet_app.command("label")
def fleet_label(
    ctx: typer.Context,
    device: Annotated[str, typer.Argument(help="device name")],
    changes: Annotated[
        list[str] | None,
        typer.Argument(help="KEY=VALUE to set a label, KEY- to remove one; none: show them"),
    ] = None,
    server: ServerOpt = None,
    token_file: TokenFileOpt = None,
    ca_file: CaFileOpt = None,
    output: OutputOpt = "table",
) -> None:
    """Set or remove a device's labels (others stay; audited), then print its labels."""
    from urllib.parse import quote

    c = _connection(ctx, server=server, token_file=token_file, ca_file=ca_file)
    patch = label_changes(list(changes or []))
    path = f"/api/v1/devices/{quote(device, safe='')}/labels"
    if patch:
        body = _request(
            "PATCH",
            c["server"],
            c["token_file"],
            c["ca_file"],
            path,
            body=patch,
            allowed="change desired state (operator or above)",
        )
    else:
        body = _get(c["server"], c["token_file"], c["ca_file"], path)
    if output != "table":
        emit(body, output)
        return
    labels = body.get("labels") or {}
    for key in sorted(labels):
        typer.echo(f"{key}={labels[key]}")
    changed = body.get("changed")
    note = "" if changed is None else (" (changed)" if changed else " (unchanged)")
    typer.echo(f"{len(labels)} label(s) on {body.get('device', device)}{note}")


def _v(value: Any) -> str:
    return "-" if value is None else str(value)


def render_table(devices: list[FleetDevice]) -> str:
    """One line per device; times ISO 8601 UTC."""
    header = (
        "DEVICE",
        "STATUS",
        "DESIRED",
        "APPLIED",
        "LAST REPORT",
        "IN SYNC SINCE",
        "LAST DRIFT",
        "REASONS",
        "LABELS",
    )
    now = time.time()
    rows = [header]
    for d in devices:
        rows.append(
            (
                d["device"],
                d["status"],
                _v(d.get("desired_version")),
                _v(d.get("applied_version")),
                _v(d.get("last_report_at")),
                _v(d.get("in_sync_since")),
                drift_words(d.get("last_drift"), now),
                ",".join(d.get("reason_codes") or []) or "-",
                labels_text(d.get("labels")),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    lines.append(f"{len(devices)} device(s)")
    return "\n".join(lines)


def _ago(at: Any, now: float) -> str:
    """An ISO 8601 time in the past in words (`12 s ago`, `2 min ago`); '?' when unreadable."""
    try:
        seconds = max(0.0, now - datetime.fromisoformat(str(at).replace("Z", "+00:00")).timestamp())
    except ValueError:
        return "?"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{int(seconds // size)} {unit} ago"
    return f"{int(seconds)} s ago"


def drift_words(record: Any, now: float) -> str:
    """A fleet row's last drift: `healed 2 min ago (addresses)`, `drifting since … (dns)`, `-`."""
    if not isinstance(record, dict):
        return "-"
    what = record.get("subsystem") or "?"
    if record.get("healed_at"):
        return f"healed {_ago(record['healed_at'], now)} ({what})"
    return f"drifting since {_v(record.get('since'))} ({what})"


def drift_lines(entry: FleetDevice, now: float) -> list[str]:
    """The device's drift history (newest 5: who changed what, who healed it) and the
    router's own acknowledgements, as the control plane keeps them."""
    lines: list[str] = []
    history = [r for r in entry.get("drift_history") or [] if isinstance(r, dict)]
    for record in history[:5]:
        healer = record.get("healed_by") or {}
        how = (
            f"healed {_ago(record['healed_at'], now)} by {healer.get('writer') or 'trueup heal'}"
            if record.get("healed_at") and healer
            else f"in sync again {_ago(record['healed_at'], now)} without a trueup heal"
            if record.get("healed_at")
            else "going on"
        )
        lines.append(
            f"drift:         {record.get('subsystem')} since {_v(record.get('since'))}: {how}"
        )
        for path in (record.get("paths") or [])[:3]:
            lines.append(f"                 path:       {path}")
        for writer in record.get("changed_by") or ["no writer known"]:
            lines.append(f"                 changed by: {writer}")
    if len(history) > 5:
        lines.append(f"               ({len(history) - 5} older drift record(s): -o json)")
    for ack in entry.get("agent_acknowledgements") or []:
        if isinstance(ack, dict):
            lines.append(
                f"router ack:    {ack.get('subsystem')} {ack.get('state') or 'active'} until "
                f"{_v(ack.get('until'))} by {_v(ack.get('by'))}: {_v(ack.get('reason'))}"
            )
    return lines


def render_device(entry: FleetDevice) -> str:
    match = entry.get("digest_match")
    digest = {True: "same document", False: "DIFFERENT document", None: "unknown"}[match]
    conditions = entry.get("conditions") or []
    lines = [
        f"device:        {entry['device']}",
        f"status:        {entry['status']}"
        + (f"   (conditions: {', '.join(conditions)})" if len(conditions) > 1 else ""),
        f"desired:       version {_v(entry.get('desired_version'))}"
        f"   {entry.get('desired_digest') or '-'}",
        f"applied:       version {_v(entry.get('applied_version'))}"
        f"   {entry.get('applied_digest') or '-'}   origin {entry.get('applied_origin') or '-'}",
        f"digest:        {digest}",
    ]
    interval = entry.get("heartbeat_interval")
    lines.append(
        f"last report:   {_v(entry.get('last_report_at'))}"
        + (
            f"   (every {interval:g}s, {entry.get('missed_heartbeats', 0)} missed)"
            if interval
            else ""
        )
    )
    lines.append(f"in sync since: {_v(entry.get('in_sync_since'))}")
    override = entry.get("override")
    if override:
        lines.append(
            f"override:      local version {override.get('version', '-')} by "
            f"{override.get('actor') or '-'} at {override.get('at') or '-'}: "
            f"{override.get('reason') or '-'}"
        )
    confirmation = entry.get("confirmation")
    if isinstance(confirmation, dict):
        until = (
            f" until {confirmation.get('deadline_at')}"
            if confirmation.get("state") == "pending"
            else ""
        )
        lines.append(
            f"confirmation:  version {_v(confirmation.get('version'))} "
            f"{confirmation.get('state')}{until}: {confirmation.get('reason') or '-'}"
        )
    lines.append(f"labels:        {labels_text(entry.get('labels'))}")
    lines.extend(agent_lines(entry.get("agent")))
    lines.append(f"reason codes:  {', '.join(entry.get('reason_codes') or []) or '-'}")
    for ack in entry.get("acknowledgements") or []:
        lines.append(
            f"acknowledged:  {ack['subsystem']} until {ack.get('expires_at') or '-'}: "
            f"{ack.get('reason') or '-'}"
        )
    lines.extend(drift_lines(entry, time.time()))
    report = entry.get("last_report") or {}
    findings = report.get("findings") if isinstance(report, dict) else None
    if isinstance(findings, list) and findings:
        lines.append("last report's findings:")
        for f in findings[:10]:
            if isinstance(f, dict):
                where = f" [{f['subsystem']}]" if f.get("subsystem") else ""
                lines.append(f"  {f.get('code')}{where} since {f.get('since') or '-'}")
                if f.get("detail"):
                    lines.append(f"      {readable(f['detail'])}")
    lines.append("(`-o json` shows the last report in full)")
    return "\n".join(lines)


def agent_lines(agent: object) -> list[str]:
    """A fleet entry's `agent`: the agent's version and what it supports (as its last
    report says), and a warning for each part of the desired revision it does not support."""
    if not isinstance(agent, dict):
        return []
    supports = agent.get("api_versions"), agent.get("sections")
    lines = [
        f"agent:         {agent.get('version') or 'not reported'}",
        "supports:      "
        + (
            f"{', '.join(supports[0] or []) or '-'}; sections {', '.join(supports[1] or []) or '-'}"
            if supports != (None, None)
            else "not reported"
        ),
    ]
    for problem in agent.get("unsupported") or []:
        lines.append(f"WARNING:       {problem.get('path')}: {problem.get('detail')}")
    return lines
