"""Lines of the status table for subsystems that report more than facts: the gateways'
uplinks and routing's sessions and adjacencies (`Subsystem.report`, status `system`).

Standard library only, like trueup/cli/statustable.py, which prints them.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing's import time is measurable on the fast path
if TYPE_CHECKING:
    from collections.abc import Mapping

    from trueup.cli.bodies import SubsystemStatus

__all__ = ["gateway_lines", "routing_lines"]


def gateway_lines(sub: SubsystemStatus | None) -> list[str]:
    """The gateways' uplinks: state, since when, loss and latency over the window, active."""
    system = (sub or {}).get("system") or {}
    gateways = system.get("gateways")
    if not isinstance(gateways, list) or not gateways:
        return []
    active = system.get("active")
    names = ", ".join(str(a) for a in active) if isinstance(active, list) and active else "-"
    header = f"\ngateways ({system.get('policy')}): active {names}"
    states = {g.get("state") for g in gateways if isinstance(g, dict)}
    if system.get("monitoring") is False:
        header += " (not monitored: no agent probes these uplinks)"
    elif states == {"pending"}:
        header += " (no verdict yet: the route stays there until the probes say)"
    lines = [header]
    for g in gateways:
        if not isinstance(g, dict):
            continue
        latency = g.get("latency_ms")
        lines.append(
            f"  {g.get('name')!s:<12} {g.get('interface')!s:<10} {g.get('gateway')!s:<16} "
            f"{g.get('state')!s:<8} since {g.get('since') or '-'}  loss {g.get('loss_percent')}%  "
            f"latency {f'{latency} ms' if latency is not None else '-'}"
            + ("  ACTIVE" if g.get("active") else "")
        )
    if system.get("all_down"):
        lines.append("  every gateway of a family is down: its last default route is kept")
    return lines


def routing_lines(report: Mapping[str, object]) -> list[str]:
    """Routing's sessions and adjacencies as FRR reports them: one line each (down ones too)."""
    lines = ["", "routing:  daemons " + ", ".join(map(str, _list(report.get("daemons"))))]
    bgp = report.get("bgp")
    for address, sessions in (bgp if isinstance(bgp, dict) else {}).items():
        parts = []
        for peer in _list(sessions):
            if isinstance(peer, dict):
                part = f"{peer.get('family')} {peer.get('state')}"
                if peer.get("prefixes_received") is not None:
                    part += f" ({peer['prefixes_received']} in/{peer.get('prefixes_sent')} out)"
                parts.append(part)
        first = next((p for p in _list(sessions) if isinstance(p, dict)), {})
        named = f" {first.get('description')}" if first.get("description") else ""
        lines.append(f"  bgp   {address} AS {first.get('remote_as')}{named}: " + ", ".join(parts))
    for protocol in ("ospf", "ospf6"):
        for n in _list(report.get(protocol)):
            if isinstance(n, dict):
                lines.append(
                    f"  {protocol:<5} {n.get('neighbor_id')} {n.get('state')} on {n.get('interface')}"
                )
    lines += [f"  problem: {p}" for p in _list(report.get("problems"))]
    return lines


def _list(value: object) -> list[object]:
    return list(value) if isinstance(value, list) else []
