"""The device timeline as inline SVG, drawn on the server from stored facts.

Lanes: drift (reports carrying STATE_DRIFT_DETECTED, as bands), failures
(reconciliation failed / partial update / apply not completed), heals (a
report with drift followed by one without), applies (the applied version
changes between two reports) and revisions (a desired revision was stored).
The drift records agents report (the drift history) are drawn too, whether or
not a report fell inside them: a band from when the drift was seen to when it
ended, and a heal mark naming who healed it (drift that lasted 0.1 s, between
two reports, is still on the timeline).
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

from trueup.server.api.records import ServiceRecord
from trueup.server.dashboard.data import epoch, iso

__all__ = ["TimelineEvent", "timeline_events", "timeline_svg"]

_DRIFT = "STATE_DRIFT_DETECTED"
_FAILED = {"STATE_RECONCILIATION_FAILED", "STATE_PARTIAL_UPDATE", "STATE_APPLY_NOT_COMPLETED"}
_LANES = ["drift", "failed", "heal", "apply", "revision"]
_WIDTH, _LEFT, _LANE = 900, 80, 22


@dataclass(frozen=True)
class TimelineEvent:
    """A mark on one lane: a band from `at` to `until`, or a point at `at`."""

    lane: str  # one of _LANES
    at: float
    label: str
    until: float | None = None
    kind: str = ""  # drift-seen | healed for the drift records agents report; else ""


def _drift_marks(drift: list[ServiceRecord], now: float) -> list[TimelineEvent]:
    events: list[TimelineEvent] = []
    for record in drift:
        since = epoch(record.get("since"))
        healed = epoch(record.get("healed_at")) if record.get("healed_at") else None
        what = f"{record.get('subsystem')}: {', '.join((record.get('paths') or [])[:3])}"
        who = "; ".join(record.get("changed_by") or [])
        events.append(
            TimelineEvent(
                lane="drift",
                at=since,
                until=healed if healed is not None else now,
                label=f"drift seen: {what}" + (f" ({who})" if who else ""),
                kind="drift-seen",
            )
        )
        if healed is not None:
            healer = record.get("healed_by") or {}
            by = (
                f"healed by {healer.get('by')} {healer.get('action')} {healer.get('txn') or ''}"
                if healer
                else "in sync again (not trueup's heal)"
            )
            events.append(TimelineEvent("heal", healed, f"{by}: {what}", kind="healed"))
    return events


def timeline_events(
    reports: list[ServiceRecord],
    revisions: list[ServiceRecord],
    drift: list[ServiceRecord] | None = None,
    now: float | None = None,
) -> list[TimelineEvent]:
    """The events, in time order."""
    events = _drift_marks(drift or [], now or 0.0)
    ordered = sorted(reports, key=lambda r: epoch(r.get("received_at")))
    previous: ServiceRecord | None = None
    for i, report in enumerate(ordered):
        at = epoch(report.get("received_at"))
        until = epoch(ordered[i + 1]["received_at"]) if i + 1 < len(ordered) else at
        codes = set(report.get("reason_codes") or [])
        if _DRIFT in codes:
            events.append(TimelineEvent("drift", at, "drift", until=until))
        if codes & _FAILED:
            label = ", ".join(sorted(codes & _FAILED))
            events.append(TimelineEvent("failed", at, label, until=until))
        if previous is not None:
            before = set(previous.get("reason_codes") or [])
            if _DRIFT in before and _DRIFT not in codes:
                events.append(TimelineEvent("heal", at, "drift gone"))
            if report.get("applied_version") != previous.get("applied_version"):
                label = f"applied v{report.get('applied_version')}"
                events.append(TimelineEvent("apply", at, label))
        previous = report
    for revision in revisions:
        label = f"revision {revision['version']} by {revision['author']}"
        events.append(TimelineEvent("revision", epoch(revision["created_at"]), label))
    return sorted(events, key=lambda e: e.at)


def timeline_svg(events: list[TimelineEvent], now: float) -> str:
    height = _LANE * len(_LANES) + 30
    if not events:
        return '<p class="muted">nothing to plot yet: no reports or revisions</p>'
    start = min(e.at for e in events)
    end = max(now, max(e.at if e.until is None else e.until for e in events))
    span = max(end - start, 1.0)

    def x(t: float) -> float:
        return float(_LEFT + (t - start) / span * (_WIDTH - _LEFT - 10))

    parts = [
        f'<svg class="timeline" role="img" viewBox="0 0 {_WIDTH} {height}" '
        f'width="{_WIDTH}" height="{height}" xmlns="http://www.w3.org/2000/svg">'
        "<title>drift, heals and applies over time</title>"
    ]
    for i, lane in enumerate(_LANES):
        y = 10 + i * _LANE
        parts.append(f'<text x="4" y="{y + 14}" class="lane">{lane}</text>')
        parts.append(
            f'<line x1="{_LEFT}" y1="{y + 10}" x2="{_WIDTH - 10}" y2="{y + 10}" class="axis"/>'
        )
    for e in events:
        y = 10 + _LANES.index(e.lane) * _LANE
        tip = escape(f"{iso(e.at)} {e.label}")
        kind = f' data-kind="{escape(e.kind)}"' if e.kind else ""
        if e.until is not None:
            width = max(x(e.until) - x(e.at), 3.0)
            parts.append(
                f'<rect class="ev {e.lane}"{kind} x="{x(e.at):.1f}" y="{y + 3}" '
                f'width="{width:.1f}" height="14"><title>{tip}</title></rect>'
            )
        else:
            parts.append(
                f'<circle class="ev {e.lane}"{kind} cx="{x(e.at):.1f}" cy="{y + 10}" r="5">'
                f"<title>{tip}</title></circle>"
            )
    bottom = height - 4
    parts.append(f'<text x="{_LEFT}" y="{bottom}" class="tick">{iso(start)}</text>')
    parts.append(
        f'<text x="{_WIDTH - 10}" y="{bottom}" class="tick" text-anchor="end">{iso(end)}</text>'
    )
    parts.append("</svg>")
    return "".join(parts)
