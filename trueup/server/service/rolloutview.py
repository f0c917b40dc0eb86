"""A rollout as the API shows it: its summary, its waves (members per state, each wave's
state) and each member with its state, versions, reason and, while sent, its gates as the
device's newest report shows them (rolloutplan.evaluate)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from sqlalchemy import RowMapping

from trueup.server.service.fleetview import iso_utc
from trueup.server.service.rolloutplan import evaluate
from trueup.server.service.rolloutrecords import MemberView, RolloutSummary, RolloutView, WaveView
from trueup.server.service.rolloutrows import NO_FACTS, DeviceFacts

__all__ = ["rollout_view", "summary"]

Facts = Mapping[int, DeviceFacts]


def summary(row: RowMapping) -> RolloutSummary:
    return {
        "id": row["id"],
        "state": row["state"],
        "current_wave": row["current_wave"],
        "spec": json.loads(row["spec"]),
        "created_by": row["created_by"],
        "created_at": iso_utc(row["created_at"]),
        "updated_at": iso_utc(row["updated_at"]),
        "finished_at": iso_utc(row["finished_at"]),
        "comment": row["comment"],
        "reason": row["reason"],
    }


def rollout_view(
    row: RowMapping, members: Sequence[RowMapping], facts: Facts, now: float
) -> RolloutView:
    view = summary(row)
    spec = view["spec"]
    sizes = [0] * len(spec["waves"])
    counts: list[dict[str, int]] = [{} for _ in spec["waves"]]
    out: list[MemberView] = []
    for m in members:
        sizes[int(m["wave"])] += 1
        tally = counts[int(m["wave"])]
        tally[m["state"]] = tally.get(m["state"], 0) + 1
        entry: MemberView = {
            "device": m["name"],
            "wave": m["wave"],
            "state": m["state"],
            "digest": m["digest"],
            "from_version": m["from_version"],
            "sent_version": m["sent_version"],
            "reverted_version": m["reverted_version"],
            "sent_at": iso_utc(m["sent_at"]),
            "finished_at": iso_utc(m["finished_at"]),
            "reason": m["reason"],
        }
        if m["state"] == "sent" and m["sent_at"] is not None:
            fact = facts.get(int(m["device_id"]), NO_FACTS)
            entry["gates"] = evaluate(  # while sent: its gates as its newest report shows
                digest=m["digest"],
                sent_version=int(m["sent_version"]),
                sent_at=float(m["sent_at"]),
                now=now,
                report=fact.report,
                report_at=fact.report_at,
                confirmation=fact.confirmation,
                baseline=json.loads(m["baseline_codes"] or "[]"),
                server_acked=fact.acked,
                confirm_within=spec.get("confirm_within") if m["from_version"] else None,
                gate_timeout=float(spec.get("gate_timeout") or 900),
            ).as_json()
        out.append(entry)
    waves: list[WaveView] = [
        {
            "index": i,
            **w,
            "members": sizes[i],
            "counts": counts[i],
            "state": _wave_state(row, i),
        }
        for i, w in enumerate(spec["waves"])
    ]
    return {**view, "waves": waves, "members": out}


def _wave_state(row: RowMapping, i: int) -> str:
    """done, pending, waiting-approval, soaking, or the rollout's own state."""
    if i < row["current_wave"]:
        return "done"
    if i > row["current_wave"]:
        return "pending"
    if row["state"] == "waiting-approval":
        return "waiting-approval"
    if row["wave_done_at"] is not None and row["state"] == "running":
        return "soaking"
    return str(row["state"])
