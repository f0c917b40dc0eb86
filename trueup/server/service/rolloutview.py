"""A rollout as the API shows it: its summary, its waves (members per state, each wave's
state) and each member with its state, versions, reason and, while sent, its gates as the
device's newest report shows them (rolloutplan.evaluate)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from trueup.server.service.fleetview import iso_utc
from trueup.server.service.rolloutplan import evaluate
from trueup.server.service.rolloutrows import NO_FACTS, DeviceFacts

__all__ = ["rollout_view", "summary"]

Facts = Mapping[int, DeviceFacts]


def summary(row: Any) -> dict[str, Any]:
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


def rollout_view(row: Any, members: Sequence[Any], facts: Facts, now: float) -> dict[str, Any]:
    view = summary(row)
    spec = view["spec"]
    waves: list[dict[str, Any]] = [
        {"index": i, **w, "members": 0, "counts": {}} for i, w in enumerate(spec["waves"])
    ]
    out = []
    for m in members:
        wave = waves[int(m["wave"])]
        wave["members"] += 1
        wave["counts"][m["state"]] = wave["counts"].get(m["state"], 0) + 1
        entry: dict[str, Any] = {
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
            entry["gates"] = evaluate(
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
    for wave in waves:
        i = wave["index"]
        wave["state"] = (
            "done"
            if i < row["current_wave"]
            else "pending"
            if i > row["current_wave"]
            else "waiting-approval"
            if row["state"] == "waiting-approval"
            else "soaking"
            if row["wave_done_at"] is not None and row["state"] == "running"
            else row["state"]
        )
    view["waves"] = waves
    view["members"] = out
    return view
