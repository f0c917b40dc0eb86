"""`trueup server notify …`: notification targets, rules, the delivery log and dead letters.

The same operations as `/api/v1/notifications/…` (docs/notifications.md), run on
the server's database directly like the other `trueup server` commands, audited
with the actor `cli:<login>`; each command's body runs in `admin` (serveradmin.py),
which opens the control plane and turns the service's refusals into one line and exit 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from trueup.cli.serveradmin import DbOption, KeyOption, OutputOption, admin, fail

__all__ = ["notify_app"]

notify_app = typer.Typer(
    help="Notifications: webhook targets, routing rules, deliveries, dead letters.",
    no_args_is_help=True,
)
TenantOption = typer.Option(..., "--tenant")


@notify_app.command("targets")
def targets(
    tenant: str = TenantOption,
    output: str = OutputOption,
    db: str = DbOption,
    key_file: Path | None = KeyOption,
) -> None:
    """The tenant's webhook targets (never their secrets)."""
    with admin(db, key_file) as run:
        tenant_id = run.tenant(tenant)
        found = run.plane.notify_targets(tenant_id)
        allowlist = run.plane.notify_allowlist(tenant_id)["entries"]
        lines = [f"{'NAME':<24} {'HEADER':<16} URL"]
        for t in found:
            lines.append(f"{t['name']:<24} {t['auth_header'] or '-':<16} {t['url']}")
            if t["problem"]:
                lines.append(f"{'':<24} not delivered: {t['problem']}")
        lines.append(f"allowlist: {', '.join(allowlist) or '(empty)'}")
        run.show({"targets": found, "allowlist": allowlist}, output, lines)


@notify_app.command("add-target")
def add_target(
    name: str = typer.Argument(...),
    url: str = typer.Argument(..., help="http:// or https:// webhook URL"),
    secret_file: Path | None = typer.Option(
        None, "--secret-file", help="file holding the signing secret (default: generated)"
    ),
    auth_header: str | None = typer.Option(
        None, "--auth-header", help="a header sent with every delivery (e.g. Authorization)"
    ),
    auth_header_file: Path | None = typer.Option(
        None, "--auth-header-file", help="file holding that header's value (stored sealed)"
    ),
    tenant: str = TenantOption,
    db: str = DbOption,
    key_file: Path | None = KeyOption,
) -> None:
    """Add a webhook target; a generated secret is printed this once."""
    if (auth_header is None) != (auth_header_file is None):
        raise fail("--auth-header and --auth-header-file go together")
    secret = secret_file.read_text().strip() if secret_file else None
    header = (
        (auth_header, auth_header_file.read_text().strip())
        if auth_header is not None and auth_header_file is not None
        else None
    )
    with admin(db, key_file) as run:
        tenant_id = run.tenant(tenant)
        made = run.plane.create_notify_target(
            tenant_id, name, url, secret, run.actor, auth_header=header
        )
        run.say(f"target {name} -> {url}")
        if "secret" in made:
            run.say(f"signing secret (shown once): {made['secret']}")


@notify_app.command("allowlist")
def allowlist(
    entries: list[str] = typer.Argument(
        None, help="networks (CIDRs) and host names; with --set, the new list"
    ),
    set_: bool = typer.Option(False, "--set", help="replace the list (none given: clear it)"),
    tenant: str = TenantOption,
    output: str = OutputOption,
    db: str = DbOption,
    key_file: Path | None = KeyOption,
) -> None:
    """The tenant's internal receivers that targets may reach; `--set` replaces them."""
    with admin(db, key_file) as run:
        tenant_id = run.tenant(tenant)
        if entries and not set_:
            raise fail("to change the allowlist, add --set (it replaces the whole list)")
        if set_:
            shown = run.plane.set_notify_allowlist(tenant_id, list(entries or []), run.actor)
        else:
            shown = run.plane.notify_allowlist(tenant_id)
        run.show(shown, output, [f"allowlist: {', '.join(shown['entries']) or '(empty)'}"])


@notify_app.command("rules")
def rules(
    tenant: str = TenantOption,
    output: str = OutputOption,
    db: str = DbOption,
    key_file: Path | None = KeyOption,
) -> None:
    """The tenant's routing rules."""
    with admin(db, key_file) as run:
        found = [dict(r) for r in run.plane.notify_rules(run.tenant(tenant))]
        run.show({"rules": found}, output, _rule_lines(found))


def _rule_lines(found: list[dict[str, Any]]) -> list[str]:
    lines = [f"{'NAME':<20} {'TARGET':<20} {'ESCALATE':<9} MATCH"]
    for r in found:
        m = r["match"]
        parts = [
            f"devices={','.join(m['devices'])}" if m["devices"] else "",
            f"codes={','.join(m['reason_codes'])}" if m["reason_codes"] else "",
            f"kinds={','.join(m['kinds'])}" if m["kinds"] else "",
            f"severity>={m['min_severity']}",
        ]
        escalate = f"{r['escalate_after']:g}s" if r["escalate_after"] else "-"
        lines.append(
            f"{r['name']:<20} {r['target']:<20} {escalate:<9} {' '.join(p for p in parts if p)}"
        )
    return lines


@notify_app.command("add-rule")
def add_rule(
    name: str = typer.Argument(...),
    target: str = typer.Option(..., "--target"),
    device: list[str] = typer.Option([], "--device", help="device-name glob (repeatable)"),
    reason: list[str] = typer.Option([], "--reason", help="reason code (repeatable)"),
    kind: list[str] = typer.Option([], "--kind", help="event kind (repeatable)"),
    min_severity: str = typer.Option("info", "--min-severity", help="info | warning | critical"),
    escalate_after: float | None = typer.Option(
        None, "--escalate-after", help="seconds a device may stay failed before escalating"
    ),
    tenant: str = TenantOption,
    db: str = DbOption,
    key_file: Path | None = KeyOption,
) -> None:
    """Route the events the match selects to a target (and escalate, with --escalate-after)."""
    match = {"devices": device, "reason_codes": reason, "kinds": kind, "min_severity": min_severity}
    with admin(db, key_file) as run:
        tenant_id = run.tenant(tenant)
        run.plane.create_notify_rule(tenant_id, name, target, match, escalate_after, run.actor)
        run.say(f"rule {name} -> {target}")


@notify_app.command("remove")
def remove(
    what: str = typer.Argument(..., help="rule | target"),
    name: str = typer.Argument(...),
    tenant: str = TenantOption,
    db: str = DbOption,
    key_file: Path | None = KeyOption,
) -> None:
    """Delete a rule, or a target no rule uses (its delivery log is kept)."""
    if what not in ("rule", "target"):
        raise fail(f"{what}: expected rule or target")
    with admin(db, key_file) as run:
        tenant_id = run.tenant(tenant)
        plane = run.plane
        delete = plane.delete_notify_rule if what == "rule" else plane.delete_notify_target
        delete(tenant_id, name, run.actor)
        run.say(f"{what} {name} deleted")


@notify_app.command("deliveries")
def deliveries(
    tenant: str = TenantOption,
    state: str | None = typer.Option(
        None, "--state", help="pending | delivered | dead | discarded"
    ),
    limit: int = typer.Option(50, "--limit", min=1, max=1000),
    output: str = OutputOption,
    db: str = DbOption,
    key_file: Path | None = KeyOption,
) -> None:
    """The delivery log, newest first (`--state dead`: the dead letters)."""
    with admin(db, key_file) as run:
        tenant_id = run.tenant(tenant)
        found = run.plane.notify_delivery_log(tenant_id, state=state, limit=limit)
        lines = [
            f"{'ID':>6} {'STATE':<10} {'KIND':<20} {'DEVICE':<20} {'TARGET':<16} TRIES LAST ERROR"
        ]
        for d in found:
            lines.append(
                f"{d['id']:>6} {d['state']:<10} {d['kind']:<20} {d['device']:<20} "
                f"{d['target']:<16} {d['attempts']:>5} {d['last_error'] or '-'}"
            )
        run.show({"deliveries": found}, output, lines)


@notify_app.command("redeliver")
def redeliver(
    delivery: int = typer.Argument(..., help="delivery id"),
    tenant: str = TenantOption,
    db: str = DbOption,
    key_file: Path | None = KeyOption,
) -> None:
    """Send a dead (or discarded) delivery again; the running server picks it up."""
    with admin(db, key_file) as run:
        run.plane.redeliver_notification(run.tenant(tenant), delivery, run.actor)
        run.say(f"delivery {delivery} queued again")


@notify_app.command("discard")
def discard(
    delivery: int = typer.Argument(..., help="delivery id"),
    tenant: str = TenantOption,
    db: str = DbOption,
    key_file: Path | None = KeyOption,
) -> None:
    """Stop trying a dead or pending delivery (it stays in the log)."""
    with admin(db, key_file) as run:
        run.plane.discard_notification(run.tenant(tenant), delivery, run.actor)
        run.say(f"delivery {delivery} discarded")
