"""The device page's known limitations: reviewed, permanent accepted differences the agent
reported (`trueup limitation add`, docs/evidence-and-doctor.md) and the paths they cover."""

from __future__ import annotations

from trueup.server.api.records import ServiceRecord
from trueup.server.dashboard.html import esc

__all__ = ["limitations_section"]


def limitations_section(report: ServiceRecord | None) -> str:
    """Known limitations the agent reported: reviewed, permanent accepted differences
    (`trueup limitation add`), and the paths they cover now."""
    summary = (report or {}).get("diff_summary") or {}
    limitations = [item for item in summary.get("limitations") or [] if isinstance(item, dict)]
    accepted = [str(p) for p in summary.get("accepted") or []]
    if not limitations and not accepted:
        return ""
    rows = "".join(
        f"<tr><td>{esc(item.get('id'))}</td><td>{esc(item.get('subsystem'))}</td>"
        f"<td><code>{esc(item.get('path'))}</code></td><td>{esc(item.get('reason'))}</td>"
        f"<td>{esc(item.get('reviewed_by'))}</td><td>{esc(item.get('ticket') or '-')}</td></tr>"
        for item in limitations
    )
    covered = "".join(f"<li><code>{esc(p)}</code></li>" for p in accepted[:50])
    return (
        '<h2>Known limitations</h2><table class="limitations"><thead><tr><th>id</th>'
        "<th>subsystem</th><th>path</th><th>reason</th><th>reviewed by</th><th>ticket</th>"
        f"</tr></thead><tbody>{rows}</tbody></table>"
        + (
            f'<p class="muted">accepted differences (not drift):</p><ul>{covered}</ul>'
            if covered
            else ""
        )
    )
