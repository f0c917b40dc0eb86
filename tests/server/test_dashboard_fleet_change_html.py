"""The fleet-change pages' markup without a server: what a rollout's live stream sends (the
same for a rollout that does not change, escaped), and how large plans and rollouts are
listed."""

from __future__ import annotations

import json
from typing import Any

from trueup.model.layering import Provenance
from trueup.server.dashboard.fleethtml import SHOWN_TARGETS, PlanView, plan_page
from trueup.server.dashboard.rollouthtml import SHOWN_MEMBERS, rollout_live
from trueup.server.service.fleettypes import Plan, Target


def test_the_live_parts_of_an_idle_rollout_do_not_change_and_escape_what_they_show() -> None:
    view: dict[str, Any] = {
        "id": 7,
        "state": "paused",
        "current_wave": 0,
        "spec": {"max_unavailable": "25%", "soak_seconds": 0, "failure_budget": 0},
        "reason": "<script>alert(1)</script>",
        "finished_at": None,
        "waves": [{"index": 0, "devices": ["edge-00"], "members": 1, "counts": {"sent": 1}}],
        "members": [
            {
                "device": "edge-00",
                "wave": 0,
                "state": "sent",
                "from_version": 1,
                "sent_version": 2,
                "reason": "",
                "gates": {"verdict": "waiting", "checks": {"applied": None}},
            }
        ],
    }
    view["waves"][0]["state"] = "paused"
    first = json.dumps(rollout_live(view, csrf="c", operator=True), sort_keys=True)
    again = json.dumps(rollout_live(view, csrf="c", operator=True), sort_keys=True)
    assert first == again  # the stream sends nothing new for an idle rollout
    parts = rollout_live(view, csrf="c", operator=True)
    assert (
        "<script>" not in parts["rollout-summary"] and "&lt;script&gt;" in parts["rollout-summary"]
    )
    assert "/ui/rollouts/7/actions/resume" in parts["rollout-controls"]
    assert "/ui/rollouts/7/actions/pause" not in parts["rollout-controls"]


def test_large_plans_and_rollouts_list_what_needs_a_look_first_and_say_how_many_more() -> None:
    members = [
        {
            "device": f"sim-{i:04d}",
            "wave": 0,
            "state": "failed" if i == 599 else "passed",
            "from_version": 1,
            "sent_version": 2,
            "reason": "the apply failed" if i == 599 else "",
        }
        for i in range(SHOWN_MEMBERS + 100)
    ]
    view = {
        "id": 3,
        "state": "paused",
        "current_wave": 0,
        "spec": {},
        "waves": [{"index": 0, "percent": 100, "members": len(members), "counts": {}}],
        "members": members,
    }
    view["waves"][0]["state"] = "paused"
    rows = rollout_live(view, csrf="c", operator=False)["rollout-members"]
    assert rows.index('data-device="sim-0599"') < rows.index('data-device="sim-0000"')
    assert rows.count("<tr data-device=") == SHOWN_MEMBERS
    assert "and 100 more devices" in rows and "trueup fleet rollout status 3 -o json" in rows
    no = Provenance(profiles=(), variables_digest="", own_digest=None)
    targets = tuple(
        Target(i, f"sim-{i:04d}", 1, {}, "sha256:" + "0" * 64, no, ()) for i in range(502)
    )
    page = plan_page(
        PlanView(Plan(targets=targets, refused=(), unchanged=0), "Plan"),
        csrf="c",
        operator=False,
    )
    assert page.count("<tr data-device=") == SHOWN_TARGETS and "and 2 more devices" in page
