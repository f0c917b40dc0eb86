"""The server's Prometheus metrics, and the ASGI middleware that measures every request.

No metric carries a tenant label: `/metrics` is for whoever runs the server.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["MeasureMiddleware", "Metrics"]


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "trueup_server_http_requests",
            "HTTP requests by route template, method and status",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "trueup_server_http_request_seconds",
            "HTTP request latency by route template",
            ["route"],
            registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 30),
        )
        self.reports = Counter(
            "trueup_server_reports_ingested", "Agent reports committed", registry=self.registry
        )
        self.batch = Histogram(
            "trueup_server_ingest_batch_size",
            "Reports per ingest transaction",
            registry=self.registry,
            buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000),
        )
        self.revisions = Counter(
            "trueup_server_revisions_created", "Desired revisions created", registry=self.registry
        )
        self.conflicts = Counter(
            "trueup_server_conflicts",
            "Writes refused with STATE_CONCURRENT_MODIFICATION",
            registry=self.registry,
        )

    def ingested(self, count: int) -> None:
        self.reports.inc(count)
        self.batch.observe(count)


class MeasureMiddleware:
    """Counts requests and latency per route template (plain ASGI: cheap on the hot path)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_with_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_with_status)
        finally:
            template = getattr(scope.get("route"), "path", "(unmatched)")
            self.metrics.requests.labels(template, scope["method"], str(status)).inc()
            self.metrics.latency.labels(template).observe(time.perf_counter() - started)
