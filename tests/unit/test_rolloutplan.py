"""A rollout's spec, its waves and each sent device's gates (rolloutplan.py, pure)."""

from __future__ import annotations

from typing import Any

import pytest

from trueup.model.document import document_digest, parse_document
from trueup.server.service.rolloutplan import (
    Spec,
    Wave,
    assign_waves,
    evaluate,
    parse_spec,
    unavailable_limit,
)

DIGEST = document_digest(
    parse_document(
        {
            "apiVersion": "trueup/v1",
            "kind": "DeviceState",
            "metadata": {"device": "edge-x"},
            "spec": {"management": {"interface": "mgmt0", "addresses": ["198.51.100.2/24"]}},
        }
    )
)


def test_waves_take_named_canaries_then_cumulative_percentages_of_the_rest() -> None:
    spec = parse_spec({"waves": [{"devices": ["d07"]}, {"percent": 50}, {"percent": 100}]})
    names = [f"d{i:02d}" for i in range(11)]
    waves, problems = assign_waves(spec, names)
    assert problems == []
    assert waves[0] == ["d07"]
    assert len(waves[1]) == 5 and len(waves[2]) == 5
    assert sorted(waves[0] + waves[1] + waves[2]) == names  # each device exactly once
    again, _ = assign_waves(spec, list(reversed(names)))
    assert again == waves  # deterministic, whatever the order given


def test_a_spec_that_leaves_devices_out_or_names_strangers_is_refused_by_path() -> None:
    spec = parse_spec({"waves": [{"devices": ["d1", "ghost"]}, {"percent": 50}]})
    _, problems = assign_waves(spec, ["d1", "d2", "d3", "d4"])
    assert "waves[0].devices: 'ghost' is not a target of the plan" in problems
    assert any(p.startswith("waves: 1 target(s) are in no wave") for p in problems), problems
    with pytest.raises(ValueError) as raised:
        parse_spec(
            {
                "waves": [{"percent": 0}, {"devices": []}, {"percent": 50, "selector": "a"}],
                "max_unavailable": "0%",
                "failure_budget": -1,
            }
        )
    problems = raised.value.args[0]
    assert "waves[0].percent: 0 is not an integer from 1 to 100" in problems
    assert "waves[1].devices: expected a non-empty list of device names" in problems
    assert "waves[2]: give exactly one of devices, selector, percent" in problems
    assert "max_unavailable: '0%' is not N or N% (1-100%)" in problems
    assert "failure_budget: -1 is not an integer from 0 to 1000000" in problems
    _, problems = assign_waves(parse_spec({"waves": [{"selector": "site=ams"}]}), ["d1"])
    assert problems[0].startswith("waves[0].selector: selectors need device labels")


def test_a_selector_wave_that_selects_no_target_is_refused_not_left_empty() -> None:
    # A mistyped canary selector must not turn the next wave into the whole fleet at once.
    spec = parse_spec({"waves": [{"selector": "site=canray"}, {"percent": 100}]})
    labels = {"d1": "canary", "d2": "ams", "d3": "ams"}

    def matching(text: str) -> list[str]:
        wanted = text.split("=", 1)[1]
        return [name for name, site in labels.items() if site == wanted]

    _, problems = assign_waves(spec, ["d1", "d2", "d3"], matching)
    assert problems == [
        "waves[0].selector: 'site=canray' selects no target of the plan that an earlier "
        "wave did not take"
    ], problems
    good = parse_spec({"waves": [{"selector": "site=canary"}, {"percent": 100}]})
    waves, problems = assign_waves(good, ["d1", "d2", "d3"], matching)
    assert problems == [] and waves == [["d1"], ["d2", "d3"]]


def test_max_unavailable_as_a_number_or_a_share_of_the_wave() -> None:
    assert unavailable_limit(Spec(waves=(Wave(percent=100),), max_unavailable=3), 100) == 3
    assert unavailable_limit(Spec(waves=(Wave(percent=100),), max_unavailable="25%"), 10) == 3
    assert unavailable_limit(Spec(waves=(Wave(percent=100),), max_unavailable="25%"), 1) == 1


def _gates(report: dict[str, Any] | None, **kw: Any) -> Any:
    args: dict[str, Any] = {
        "digest": DIGEST,
        "sent_version": 2,
        "sent_at": 100.0,
        "now": 110.0,
        "report": report,
        "report_at": 105.0,
        "baseline": ["STATE_DRIFT_DETECTED"],
        "server_acked": [],
        "confirm_within": None,
        "gate_timeout": 60.0,
    }
    args.update(kw)
    return evaluate(**args)


GOOD = {"applied_digest": DIGEST, "management_ready": True, "reason_codes": []}


def test_gates_pass_only_with_the_digest_applied_management_ready_and_no_new_code() -> None:
    assert _gates(GOOD).verdict == "passed"
    assert _gates(GOOD, report_at=99.0).verdict == "waiting"  # the report predates the send
    assert _gates(GOOD, report_at=99.0, now=200.0).verdict == "failed"  # gate timeout
    assert _gates({**GOOD, "applied_digest": "sha256:" + "0" * 64}).verdict == "waiting"
    waiting = _gates({**GOOD, "management_ready": False})
    assert waiting.verdict == "waiting" and waiting.checks["management"] is False
    # A reason code that was there before the send is not new; one that is, waits...
    assert _gates({**GOOD, "reason_codes": ["STATE_DRIFT_DETECTED"]}).verdict == "passed"
    drift = {
        **GOOD,
        "reason_codes": ["STATE_VERSION_SKEW"],
        "findings": [{"code": "STATE_VERSION_SKEW", "subsystem": "dns"}],
    }
    assert "new reason codes: STATE_VERSION_SKEW" in _gates(drift, baseline=[]).reason
    # ... unless its subsystem is acknowledged, on the control plane or by the router.
    assert _gates(drift, baseline=[], server_acked=["dns"]).verdict == "passed"
    router_ack = {**drift, "acknowledgements": [{"subsystem": "dns", "state": "active"}]}
    assert _gates(router_ack, baseline=[]).verdict == "passed"
    failed = _gates({**GOOD, "reason_codes": ["STATE_PARTIAL_UPDATE"]}, baseline=[])
    assert failed.verdict == "failed" and "STATE_PARTIAL_UPDATE" in failed.reason


def test_a_confirmation_window_needs_the_agents_confirmation_and_a_rollback_fails() -> None:
    pending = {**GOOD, "confirmation": {"version": 2, "state": "pending", "deadline": "x"}}
    assert _gates(pending, confirm_within=30).verdict == "waiting"
    confirmed = {**GOOD, "confirmation": {"version": 2, "state": "confirmed"}}
    assert _gates(confirmed, confirm_within=30).verdict == "passed"
    other = {**GOOD, "confirmation": {"version": 1, "state": "confirmed"}}
    assert _gates(other, confirm_within=30).verdict == "waiting"
    back = {
        **GOOD,
        "confirmation": {"version": 2, "state": "rolled-back", "reason": "management lost"},
    }
    # The control plane's stored record (the audit log's rollback first) is the one read.
    audited = {"version": 2, "state": "rolled-back", "reason": "the audit log says so"}
    assert _gates(confirmed, confirm_within=30, confirmation=audited).verdict == "failed"
    gates = _gates(back, confirm_within=30)
    assert gates.verdict == "failed" and "rolled version 2 back by itself: management lost" in (
        gates.reason
    )
