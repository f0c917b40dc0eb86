"""A wave's sent members judged against their gates (rolloutplan.evaluate) from their
devices' newest facts, inside the controller's tick (rolloutcontrol.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from sqlalchemy import Connection, RowMapping, update

from trueup.server.service.rolloutplan import Spec, evaluate
from trueup.server.service.rolloutrows import DeviceFacts, StepStats
from trueup.server.tables import rollout_members

__all__ = ["judge_members"]


def judge_members(
    conn: Connection,
    judged: list[RowMapping],
    states: dict[int, str],
    facts: dict[int, DeviceFacts],
    spec: Spec,
    now: float,
    stats: StepStats,
) -> dict[str, list[Any]]:
    """Each judged member's gates; a member whose verdict changed is stored with it (and
    in `states`). The devices that passed and failed now, for the audit entry."""
    verdicts: dict[str, list[Any]] = {"passed": [], "failed": []}
    for m in judged:
        fact = facts[int(m["device_id"])]
        gates = evaluate(
            digest=m["digest"],
            sent_version=int(m["sent_version"]),
            sent_at=float(m["sent_at"]),
            now=now,
            report=fact.report,
            report_at=fact.report_at,
            confirmation=fact.confirmation,
            baseline=json.loads(m["baseline_codes"] or "[]"),
            server_acked=fact.acked,
            # A device's first revision is applied without a window (nothing to return
            # to): no confirmation comes for it.
            confirm_within=spec.confirm_within if m["from_version"] else None,
            gate_timeout=spec.gate_timeout,
        )
        if m["state"] == "passed" and gates.verdict == "waiting":
            # A passed device no longer passing during the soak has regressed: it fails.
            gates = replace(
                gates, verdict="failed", reason=f"regressed during the soak: {gates.reason}"
            )
        if gates.verdict == "waiting" or gates.verdict == m["state"]:
            continue
        if m["state"] == "passed" and gates.verdict == "passed":
            continue
        states[int(m["id"])] = gates.verdict
        conn.execute(
            update(rollout_members)
            .where(rollout_members.c.id == m["id"])
            .values(state=gates.verdict, finished_at=now, reason=gates.reason or None)
        )
        if gates.verdict == "passed":
            stats.passed += 1
            verdicts["passed"].append(m["name"])
        else:
            stats.failed += 1
            verdicts["failed"].append({"device": m["name"], "reason": gates.reason})
    return verdicts
