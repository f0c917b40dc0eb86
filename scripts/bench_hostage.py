"""Status while services fail: `/v1/status` p50/p99 with HAProxy's and Knot's ports squatted vs normal.

One router namespace (`tests.routers.Router`) runs the agent with a document
holding DNS (Knot on 203.0.113.1:53) and a proxy (HAProxy on
198.51.100.2:8080). The baseline asks `/v1/status` over the unix socket
while both serve; then the agent is stopped, both daemons killed, other
processes take ports 8080 and 53, and the agent started again: the reconcile
loop keeps failing to start them (heals, back-off) while the same requests
are timed. Goal: the ratio stays near 1 (status never waits on a daemon).

`python -m scripts.bench hostage`, or
`python -c 'import scripts.bench_hostage as m; print(m.run(True))'` for this section alone.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from scripts.benchlib import percentile

_TAKER = """
import socket, sys, time
t = socket.socket(); t.bind(("0.0.0.0", int(sys.argv[1]))); t.listen(1)
if sys.argv[1] == "53":
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("0.0.0.0", 53))
time.sleep(3600)
"""


def _latencies(router: object, count: int) -> list[float]:
    import httpx

    sock = str(router.state_dir / "agent.sock")  # type: ignore[attr-defined]
    out: list[float] = []
    with httpx.Client(
        transport=httpx.HTTPTransport(uds=sock), base_url="http://agent", timeout=30
    ) as client:
        for _ in range(count):
            began = time.perf_counter()
            client.get("/v1/status").raise_for_status()
            out.append(time.perf_counter() - began)
            time.sleep(0.05)
    return out


def run(quick: bool) -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.integration.test_dns import DnsRouter
    from tests.integration.test_hostage import health, hostage_document
    from tests.routers import Router

    count = 40 if quick else 200
    with tempfile.TemporaryDirectory() as tmp:
        router = Router(Path(tmp), client=True)
        rig = DnsRouter(router)
        try:
            config = router.write("doc.yaml", hostage_document())
            router.start_agent("--config", str(config))
            router.wait_for(lambda: health(router, "dns") == "ok", what="dns ok")
            normal = _latencies(router, count)
            router.stop_agents()
            rig.kill_daemons()
            router.spawn(sys.executable, "-c", _TAKER, "8080")
            router.spawn(sys.executable, "-c", _TAKER, "53")
            router.wait_for(
                lambda: router.run("ss", "-Hlun", "sport = :53").stdout.strip() != "",
                what="53 taken",
            )
            router.start_agent("--config", str(config))
            router.wait_for(lambda: health(router, "proxy") == "failed", what="proxy failed")
            squatted = _latencies(router, count)
            heals = sum(
                1
                for line in (router.state_dir / "audit.jsonl").read_text().splitlines()
                if json.loads(line)["details"].get("outcome") == "failed"
            )
        finally:
            router.stop_agents(signal.SIGKILL)
            rig.kill_daemons()
            router.close()
    p50n, p99n = percentile(normal, 50), percentile(normal, 99)
    p50s, p99s = percentile(squatted, 50), percentile(squatted, 99)
    return "\n".join(
        [
            "## Status while services fail: HAProxy's and Knot's ports taken",
            "",
            f"`/v1/status` over the unix socket, {count} requests each (one every 50 ms), "
            f"{os.cpu_count()} cores. While squatted the loop kept failing to start HAProxy "
            f"and Knot ({heals} failed heals audited during the run).",
            "",
            "| | p50 | p99 |",
            "|---|---|---|",
            f"| normal | {p50n * 1000:.0f} ms | {p99n * 1000:.0f} ms |",
            f"| ports squatted | {p50s * 1000:.0f} ms | {p99s * 1000:.0f} ms |",
            f"| ratio | {p50s / p50n:.2f} | {p99s / p99n:.2f} |",
            "",
        ]
    )
