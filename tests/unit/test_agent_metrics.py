"""The agent's /metrics text, parsed back with prometheus_client's own parser."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from trueup.agent.metrics import AgentMetrics
from trueup.model.health import SubsystemHealth
from trueup.model.reasons import ReasonCode
from trueup.reconcile.view import LoopActivity, LoopView

STATUS: dict[str, Any] = {
    "versions": {"applied": 7},
    "management": {"ready": True},
    "subsystems": {
        "links": {"health": "ok"},
        "routes": {"health": "failed"},
    },
    "reason_codes": [
        {"code": "STATE_DRIFT_DETECTED"},
        {"code": "STATE_DRIFT_DETECTED"},
        {"code": "STATE_RECONCILIATION_FAILED"},
    ],
}


def _entry(breaker: str = "closed", contested: int = 0, ack: str | None = None) -> dict[str, Any]:
    return {
        "breaker": breaker,
        "contested": [f"p{i}" for i in range(contested)],
        "acknowledged_until": ack,
    }


VIEW = LoopView(
    policies={"links": _entry(ack="2027-01-15T09:00:00.000Z"), "routes": _entry("open", 2)},
    pending_confirmation={"version": 8, "deadline": "…", "rollback_to": 7},
    activity=LoopActivity(
        counters={"passes": 12, "events": 40, "heals_ok": 3, "heals_failed": 5, "overflows": 0}
    ),
)


def _parse(text: str) -> dict[str, Any]:
    return {family.name: family for family in text_string_to_metric_families(text)}


def _samples(family: Any) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value for s in family.samples}


def test_status_and_loop_metrics_keep_their_names_labels_and_help() -> None:
    families = _parse(AgentMetrics(lambda: STATUS, lambda: VIEW).render())
    assert list(families) == [
        "trueup_applied_version",
        "trueup_management_ready",
        "trueup_subsystem_health",
        "trueup_reason_codes",
        "trueup_reconcile_passes",
        "trueup_netlink_events",
        "trueup_heals",
        "trueup_breaker_open",
        "trueup_contested_paths",
        "trueup_acknowledged",
        "trueup_pending_confirmation",
    ]
    assert families["trueup_applied_version"].samples[0].value == 7
    assert families["trueup_applied_version"].documentation == "Applied desired-state version."
    assert families["trueup_management_ready"].samples[0].value == 1
    health = _samples(families["trueup_subsystem_health"])
    assert health[(("state", "failed"), ("subsystem", "routes"))] == 1
    assert health[(("state", "ok"), ("subsystem", "routes"))] == 0
    assert len(health) == 2 * len(SubsystemHealth)  # every state, for every subsystem
    codes = _samples(families["trueup_reason_codes"])
    assert len(codes) == len(ReasonCode)
    assert codes[(("code", "STATE_DRIFT_DETECTED"),)] == 2
    assert codes[(("code", "STATE_VERSION_SKEW"),)] == 0

    passes = families["trueup_reconcile_passes"]
    assert passes.type == "counter" and passes.documentation == "Reconcile passes run."
    assert passes.samples[0].name == "trueup_reconcile_passes_total"
    assert passes.samples[0].value == 12
    assert families["trueup_netlink_events"].samples[0].value == 40
    heals = _samples(families["trueup_heals"])
    assert heals == {(("outcome", "healed"),): 3, (("outcome", "failed"),): 5}
    assert _samples(families["trueup_breaker_open"]) == {
        (("subsystem", "links"),): 0,
        (("subsystem", "routes"),): 1,
    }
    assert _samples(families["trueup_contested_paths"])[(("subsystem", "routes"),)] == 2
    assert _samples(families["trueup_acknowledged"])[(("subsystem", "links"),)] == 1
    pending = families["trueup_pending_confirmation"]
    assert pending.type == "gauge" and pending.samples[0].value == 1


def test_before_the_loop_runs_only_the_status_metrics_show() -> None:
    text = AgentMetrics(lambda: STATUS, lambda: None).render()
    assert "# TYPE trueup_subsystem_health gauge" in text
    assert "trueup_reconcile_passes_total" not in text


def test_each_agent_has_its_own_registry_read_at_scrape_time() -> None:
    status = {**STATUS, "versions": {"applied": 1}}
    first = AgentMetrics(lambda: status, lambda: None)
    second = AgentMetrics(lambda: STATUS, lambda: VIEW)
    assert "trueup_applied_version 1.0" in first.render()
    status["versions"] = {"applied": 2}
    assert "trueup_applied_version 2.0" in first.render()
    assert "trueup_applied_version 7.0" in second.render()
