"""`trueup server fleet …`: the fleet view read from the server's database directly (as
`trueup fleet` reads it through the API): each device's state as the control plane derives
it, as a table, one device's details, JSON or YAML."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from trueup.cli.fleet import agent_lines, check_filters, check_selector, labels_text
from trueup.cli.serveradmin import DbOption, KeyOption, OutputOption, StaleOption, admin

__all__ = ["fleet_app", "render_fleet_device", "render_fleet_table"]

fleet_app = typer.Typer(
    help="The fleet view: each device's state as the control plane derives it.",
    no_args_is_help=True,
)

_DIGEST_MARK = {True: "✓", False: "✗", None: "?"}


def _version(value: int | None) -> str:
    return "-" if value is None else str(value)


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    if seconds < 120:
        return f"{seconds:.0f}s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m ago"
    return f"{seconds / 3600:.0f}h ago"


def render_fleet_table(entries: list[dict[str, Any]]) -> str:
    """One line per device; DIGEST is ✓ (applied document = desired), ✗ or ? (unknown)."""
    header = (
        "DEVICE",
        "STATUS",
        "DESIRED",
        "APPLIED",
        "DIGEST",
        "ORIGIN",
        "REPORTED",
        "REASONS",
        "LABELS",
    )
    rows = [header]
    for e in entries:
        rows.append(
            (
                e["device"],
                e["status"],
                _version(e["desired_version"]),
                _version(e["applied_version"]),
                _DIGEST_MARK[e.get("digest_match")],
                e.get("applied_origin") or "-",
                e.get("last_report_at") or "never",
                ",".join(e["reason_codes"]) or "-",
                labels_text(e.get("labels")),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def render_fleet_device(entry: dict[str, Any]) -> str:
    match = entry.get("digest_match")
    if match is None:
        digest = "? unknown (the agent or the revision reports no digest; versions compared)"
    elif match:
        digest = "✓ the applied document is the desired one"
    elif entry["applied_version"] == entry["desired_version"]:
        digest = "✗ differs: same version number, different document"
    else:
        digest = "✗ differs"
    lines = [
        f"device:        {entry['device']}",
        f"status:        {entry['status']}"
        + (
            f"   (conditions: {', '.join(entry['conditions'])})"
            if len(entry["conditions"]) > 1
            else ""
        ),
        f"desired:       version {_version(entry['desired_version'])}"
        f"   {entry.get('desired_digest') or '-'}",
        f"applied:       version {_version(entry['applied_version'])}"
        f"   {entry.get('applied_digest') or '-'}"
        f"   origin {entry.get('applied_origin') or '-'}",
        f"digest:        {digest}",
    ]
    override = entry.get("override")
    if override:
        lines.append(
            f"override:      local version {override.get('version', '-')}"
            f" by {override.get('actor') or '-'} at {override.get('at') or '-'}"
        )
        if override.get("reason"):
            lines.append(f"               reason: {override['reason']}")
        lines.append("               the next desired revision from the control plane replaces it")
    interval = entry.get("heartbeat_interval")
    lines.append(
        f"last report:   {entry.get('last_report_at') or 'never'}"
        + (f" ({_age(entry.get('heartbeat_age'))})" if entry.get("last_report_at") else "")
        + (f" (every {interval:g}s, {entry['missed_heartbeats']} missed)" if interval else "")
    )
    if entry.get("in_sync_since"):
        lines.append(f"in sync since: {entry['in_sync_since']}")
    lines.append(f"labels:        {labels_text(entry.get('labels'))}")
    lines.extend(agent_lines(entry.get("agent")))
    lines.append(f"reason codes:  {', '.join(entry['reason_codes']) or '-'}")
    for ack in entry.get("acknowledgements", []):
        lines.append(
            f"acknowledged:  {ack['subsystem']} until {ack.get('expires_at') or '-'}: "
            f"{ack['reason']}"
        )
    return "\n".join(lines)


@fleet_app.command("list")
def fleet_list(
    tenant: str = typer.Option(..., "--tenant"),
    status: str | None = typer.Option(
        None, "--status", help="only devices with this condition (e.g. local_override)"
    ),
    reason: str | None = typer.Option(None, "--reason", help="only devices with this reason code"),
    selector: str | None = typer.Option(
        None, "-l", "--selector", help="only devices whose labels this selector matches"
    ),
    output: str = OutputOption,
    stale_intervals: int = StaleOption,
    db: str = DbOption,
    key_file: Path | None = KeyOption,
) -> None:
    """Every device: status, desired/applied version, digest match (✓/✗/?), origin."""
    check_filters("trueup server fleet list", status=status, reason=reason)
    check_selector("trueup server fleet list", selector)
    with admin(db, key_file, stale_intervals=stale_intervals) as run:
        entries = [
            dict(e)
            for e in run.plane.fleet(
                run.tenant(tenant), status=status, reason=reason, selector=selector
            )
        ]
        run.show(
            {"devices": entries, "count": len(entries)},
            output,
            lambda: render_fleet_table(entries),
        )


@fleet_app.command("show")
def fleet_show(
    device: str = typer.Argument(..., help="device name"),
    tenant: str = typer.Option(..., "--tenant"),
    output: str = OutputOption,
    stale_intervals: int = StaleOption,
    db: str = DbOption,
    key_file: Path | None = KeyOption,
) -> None:
    """One device: both revisions' identities, the digest comparison and any local override."""
    with admin(db, key_file, stale_intervals=stale_intervals) as run:
        entry = dict(run.plane.device_view(run.tenant(tenant), device))
        run.show(entry, output, lambda: render_fleet_device(entry))
