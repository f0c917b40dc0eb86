"""The device page's agent line: what the agent reported about itself
(`trueup.server.fleet.agent_support`: its version, the document apiVersions and
`spec` sections it supports) and a warning for each part of the desired revision
it does not support."""

from __future__ import annotations

from trueup.server.api.records import ServiceRecord
from trueup.server.dashboard.html import esc

__all__ = ["agent_summary"]


def agent_summary(agent: ServiceRecord) -> str:
    """The agent's version, what it supports, and what of the desired revision it lacks."""
    version = f'<span id="agent-version">{esc(agent.get("version") or "not reported")}</span>'
    api_versions, sections = agent.get("api_versions"), agent.get("sections")
    if api_versions is None and sections is None:
        supports = "supported document versions and sections not reported"
    else:
        supports = (
            f"supports {esc(', '.join(api_versions or []) or '-')}; sections "
            f"{esc(', '.join(sections or []) or '-')}"
        )
    warnings = "".join(
        f'<li class="error" role="alert">{esc(u.get("path"))}: {esc(u.get("detail"))}</li>'
        for u in agent.get("unsupported") or []
    )
    return f'{version} <span class="muted" id="agent-supports">({supports})</span>' + (
        f'<ul id="agent-unsupported">{warnings}</ul>' if warnings else ""
    )
