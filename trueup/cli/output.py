"""Rendering for CLI output: json, yaml and human tables."""

from __future__ import annotations

import json
from typing import Any

import typer
import yaml

__all__ = ["emit", "render_findings", "render_status"]


def emit(value: Any, output: str) -> None:
    if output == "json":
        typer.echo(json.dumps(value, indent=2, sort_keys=False))
    elif output == "yaml":
        typer.echo(yaml.safe_dump(value, sort_keys=False).rstrip())
    else:
        raise typer.BadParameter(f"unknown output format {output!r}")


def render_findings(findings: list[dict[str, Any]]) -> list[str]:
    lines = []
    for f in findings:
        head = f["code"] + (f" [{f['subsystem']}]" if f.get("subsystem") else "")
        lines.append(f"  {head} since {f.get('since') or '-'}")
        if f.get("detail"):
            lines.append(f"      {f['detail']}")
        for path in f.get("paths", [])[:10]:
            lines.append(f"      path: {path}")
        if f.get("action"):
            lines.append(f"      action: {f['action']}")
    return lines


def render_status(status: dict[str, Any]) -> str:
    versions = status["versions"]
    mgmt = status["management"]
    lines = [
        f"device:      {status.get('device') or '-'}",
        f"applied:     version {versions['applied']} ({versions.get('outcome') or 'nothing applied'})"
        + (
            f"   control plane: {versions['control_plane']}"
            if versions.get("control_plane")
            else ""
        ),
        f"management:  {'READY' if mgmt['ready'] else 'NOT READY'} "
        f"{mgmt.get('interface') or ''} {' '.join(mgmt.get('addresses') or [])}"
        + (
            f"  missing: {', '.join(mgmt['missing_addresses'])}"
            if mgmt.get("missing_addresses")
            else ""
        ),
    ]
    agent = status.get("agent")
    if agent:
        phases = " → ".join(f"{p['name']}:{p['state']}" for p in agent.get("startup", []))
        lines.append(f"startup:     {phases}")
    lines.append("")
    lines.append(f"{'SUBSYSTEM':<12} {'TIER':<11} {'HEALTH':<9} {'POLICY':<7} REASON")
    for name, sub in status["subsystems"].items():
        policy = sub.get("policy") or "-"
        extra = []
        if sub.get("breaker") and sub["breaker"] != "closed":
            extra.append(f"breaker {sub['breaker']}")
        if sub.get("acknowledged_until"):
            extra.append(f"acked until {sub['acknowledged_until']}")
        if sub.get("contested"):
            extra.append(f"contested {', '.join(sub['contested'])}")
        reason = sub.get("reason") or ""
        if extra:
            reason = (reason + " (" + "; ".join(extra) + ")").strip()
        lines.append(f"{name:<12} {sub['tier']:<11} {sub['health']:<9} {policy:<7} {reason}")
    journal = status.get("journal", {})
    if journal.get("open"):
        txn = journal["open"]
        lines.append(f"\nopen transaction: {txn['txn']} version {txn.get('version')}")
    pending = status.get("pending_confirmation")
    if pending:
        lines.append(
            f"\npending confirmation: version {pending['version']} "
            f"rolls back at {pending['deadline']} unless `trueup confirm`"
        )
    findings = status.get("reason_codes", [])
    lines.append("")
    lines.append("reason codes:" if findings else "reason codes: none")
    lines.extend(render_findings(findings))
    return "\n".join(lines)
