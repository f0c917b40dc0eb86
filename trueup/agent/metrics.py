"""The agent's Prometheus metrics (`GET /metrics`), read from the current status at scrape time.

Who calls this: `Agent.metrics()` (the API's `/metrics` route renders it).
Nothing is counted twice: the collectors turn the status document and the
reconcile loop's view into metric families when Prometheus scrapes, through
`prometheus_client` as the control plane does. Each agent has its own
`CollectorRegistry` (never the process-wide one): tests run several agents
in one process.

| metric | labels | from |
|---|---|---|
| `trueup_applied_version` | | status `versions.applied` |
| `trueup_management_ready` | | status `management.ready` |
| `trueup_subsystem_health` | subsystem, state | status `subsystems.*.health` (1 for the current state) |
| `trueup_reason_codes` | code | status `reason_codes` (every code, 0 when absent) |
| `trueup_reconcile_passes_total` | | loop counters |
| `trueup_netlink_events_total` | | loop counters |
| `trueup_heals_total` | outcome | loop counters (`healed`, `failed`) |
| `trueup_breaker_open` | subsystem | loop view |
| `trueup_contested_paths` | subsystem | loop view |
| `trueup_acknowledged` | subsystem | loop view |
| `trueup_pending_confirmation` | | loop view |
| `trueup_gateway_up` | gateway, state | status `subsystems.gateways.system.gateways` (1 for the current state) |
| `trueup_gateway_active` | gateway | the same: 1 while the default route goes through it |
| `trueup_gateway_loss_percent`, `trueup_gateway_latency_ms` | gateway | the same, over its window |

The loop's families appear once the loop runs (startup phase 4).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from trueup.model.health import SubsystemHealth
from trueup.model.reasons import ReasonCode
from trueup.reconcile.view import LoopView

__all__ = ["AgentMetrics", "LoopCollector", "StatusCollector", "loop_metrics", "status_metrics"]


def status_metrics(status: Mapping[str, Any]) -> list[Metric]:
    """Versions, management readiness, subsystem health and findings from a status document."""
    applied = GaugeMetricFamily(
        "trueup_applied_version",
        "Applied desired-state version.",
        value=float(status["versions"]["applied"]),
    )
    ready = GaugeMetricFamily(
        "trueup_management_ready",
        "1 when the management tier is up.",
        value=float(bool(status["management"]["ready"])),
    )
    health = GaugeMetricFamily(
        "trueup_subsystem_health",
        "Subsystem health (1 for the current state).",
        labels=["subsystem", "state"],
    )
    for name, sub in status["subsystems"].items():
        for state in SubsystemHealth:
            health.add_metric([name, state.value], float(sub["health"] == state.value))
    findings = GaugeMetricFamily(
        "trueup_reason_codes", "Findings per reason code.", labels=["code"]
    )
    for code in ReasonCode:
        count = sum(1 for f in status["reason_codes"] if f["code"] == code.value)
        findings.add_metric([code.value], float(count))
    return [applied, ready, health, findings, *_gateway_metrics(status)]


def _gateway_metrics(status: Mapping[str, Any]) -> list[Metric]:
    """Each uplink of `spec.gateways`: its state, whether it is active, loss and latency."""
    system = (status["subsystems"].get("gateways") or {}).get("system") or {}
    gateways = [g for g in system.get("gateways") or [] if isinstance(g, dict)]
    if not gateways:
        return []
    up = GaugeMetricFamily(
        "trueup_gateway_up", "Gateway state (1 for the current state).", labels=["gateway", "state"]
    )
    active = GaugeMetricFamily(
        "trueup_gateway_active", "1 while the default route goes through it.", labels=["gateway"]
    )
    loss = GaugeMetricFamily(
        "trueup_gateway_loss_percent", "Probe loss over its window.", labels=["gateway"]
    )
    latency = GaugeMetricFamily(
        "trueup_gateway_latency_ms", "Mean probe latency over its window.", labels=["gateway"]
    )
    for g in gateways:
        name = str(g.get("name"))
        for state in ("pending", "up", "down"):
            up.add_metric([name, state], float(g.get("state") == state))
        active.add_metric([name], float(bool(g.get("active"))))
        loss.add_metric([name], float(g.get("loss_percent") or 0.0))
        if g.get("latency_ms") is not None:
            latency.add_metric([name], float(g["latency_ms"]))
    return [up, active, loss, latency]


def loop_metrics(view: LoopView) -> list[Metric]:
    """The reconcile loop's counters and per-subsystem healing state."""
    counters = view.activity.counters
    passes = CounterMetricFamily(
        "trueup_reconcile_passes_total", "Reconcile passes run.", value=counters.get("passes", 0)
    )
    events = CounterMetricFamily(
        "trueup_netlink_events_total",
        "Kernel notifications received.",
        value=counters.get("events", 0),
    )
    heals = CounterMetricFamily(
        "trueup_heals_total", "Heal attempts by outcome.", labels=["outcome"]
    )
    heals.add_metric(["healed"], counters.get("heals_ok", 0))
    heals.add_metric(["failed"], counters.get("heals_failed", 0))
    breaker = GaugeMetricFamily(
        "trueup_breaker_open",
        "1 while a subsystem's circuit breaker is open.",
        labels=["subsystem"],
    )
    contested = GaugeMetricFamily(
        "trueup_contested_paths", "Paths another writer keeps changing.", labels=["subsystem"]
    )
    acknowledged = GaugeMetricFamily(
        "trueup_acknowledged",
        "1 while healing is paused by an acknowledgement.",
        labels=["subsystem"],
    )
    for name, entry in view.policies.items():
        breaker.add_metric([name], float(entry["breaker"] != "closed"))
        contested.add_metric([name], float(len(entry["contested"])))
        acknowledged.add_metric([name], float(bool(entry["acknowledged_until"])))
    pending = GaugeMetricFamily(
        "trueup_pending_confirmation",
        "1 while an apply awaits `trueup confirm`.",
        value=float(view.pending_confirmation is not None),
    )
    return [passes, events, heals, breaker, contested, acknowledged, pending]


class StatusCollector(Collector):
    """Builds the status document at each scrape (it observes the system, as `/v1/status` does)."""

    def __init__(self, status: Callable[[], Mapping[str, Any]]) -> None:
        self._status = status

    def collect(self) -> Iterable[Metric]:
        return status_metrics(self._status())


class LoopCollector(Collector):
    """Reads the reconcile loop's view at each scrape; nothing while no loop runs."""

    def __init__(self, view: Callable[[], LoopView | None]) -> None:
        self._view = view

    def collect(self) -> Iterable[Metric]:
        view = self._view()
        return loop_metrics(view) if view is not None else []


class AgentMetrics:
    """One agent's registry: its status, then its reconcile loop."""

    def __init__(
        self, status: Callable[[], Mapping[str, Any]], loop_view: Callable[[], LoopView | None]
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(StatusCollector(status))
        self.registry.register(LoopCollector(loop_view))

    def render(self) -> str:
        """The Prometheus text exposition of everything, as of now."""
        return generate_latest(self.registry).decode()
