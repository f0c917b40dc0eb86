"""Drift to the control plane: `ip addr del` on the router → the control plane's device API
shows it healed, measured from the operator's namespace; and the reports a drift storm costs.

One router namespace (`tests.routers.Router`) runs a real agent (policy auto)
enrolled with a real control plane (SQLite) in the client namespace, with the
default 30 s heartbeat (and the flap guard raised out of the way: the rounds
are one writer fighting trueup). Each round deletes the LAN address; a poller in the
client namespace asks `GET /api/v1/devices/edge-01` every 20 ms until the
healed record of that drift is there (the poller is connected before the
delete: its start is not counted). The report of the drift goes out at once,
the one of its heal a pacing second later. The baseline in the same run is the
heartbeat: before reports followed events, a drift healed between heartbeats
reached the control plane at the next one (15 s on average, 30 s at worst), or
never when it had healed by then. Then a storm: the address deleted every
0.2 s for 4 s; the reports the control plane received in that time, against
the drifts (goal: coalesced to about one a second, never one per event).

`python -c 'import scripts.bench_reports as m; print(m.run(True))'` for this section alone.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from scripts.benchlib import median

PORT = 8797
URL = f"http://198.51.100.1:{PORT}"
HEARTBEAT = 30.0

_POLLER = """
import json, sys, time, httpx
url, token = sys.argv[1], sys.argv[2]
from datetime import datetime
def epoch(s):
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()
with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=5) as c:
    c.get(url).raise_for_status()
    print("ready", flush=True)
    since = float(sys.stdin.readline())
    deadline = time.time() + 60
    while time.time() < deadline:
        for r in c.get(url).json().get("drift_history") or []:
            if (r["subsystem"] == "addresses" and r["state"] == "healed"
                    and epoch(r["since"]) >= since):
                print(json.dumps({"seen": time.time(), "record": r})); sys.exit(0)
        time.sleep(0.02)
sys.exit(1)
"""


def run(quick: bool) -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.integration.test_dashboard_e2e import _server_cli, _token
    from tests.routers import TRUEUP, Router, base_document

    rounds = 5 if quick else 20
    latencies: list[float] = []
    heals: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        router = Router(Path(tmp), client=True)
        try:
            db = f"sqlite:///{router.workdir}/cp.db"
            _server_cli(router, db, "tenant", "create", "acme")
            operator = _token(router, db, "acme", "ops", "operator")
            bundle = router.workdir / "bundle.json"
            _server_cli(
                router, db, "device", "enroll", "--tenant", "acme", "--device", "edge-01",
                "--url", URL, "--out", str(bundle),
            )  # fmt: skip
            router.spawn_in_client(
                *TRUEUP, "server", "run", "--db", db, "--listen", f"198.51.100.1:{PORT}",
                log=router.workdir / "server.log",
            )  # fmt: skip
            router.wait_for(lambda: router.from_client(f"{URL}/healthz")[0] == 200, what="cp up")
            router.ip("link", "set", "mgmt0", "up")
            router.ip("addr", "add", "198.51.100.2/24", "dev", "mgmt0")
            fallback = router.write("fallback.yaml", base_document(interfaces=[], routes=[]))
            token_file = router.workdir / "device.token"
            enrolled = router.trueup(
                "agent", "enroll", "--bundle", str(bundle), "--token-file", str(token_file),
                state=False,
            )  # fmt: skip
            assert enrolled.returncode == 0, enrolled.stderr
            router.start_agent(
                "--management-fallback", str(fallback), "--control-plane", URL,
                "--token-file", str(token_file),
                # The rounds are one writer fighting trueup: measured here is the report,
                # not the flap guard that would stop healing after the third flip.
                env={"TRUEUP_FLAP_THRESHOLD": "100000"},
            )  # fmt: skip
            status, body = router.from_client(
                f"{URL}/api/v1/devices/edge-01/desired", operator, method="PUT",
                body=base_document(), headers={"If-Match": "0"},
            )  # fmt: skip
            assert status == 201, body
            router.wait_for(lambda: "203.0.113.1/24" in router.addresses("lan0"), what="rev 1")
            device_url = f"{URL}/api/v1/devices/edge-01"
            for _ in range(rounds):
                time.sleep(1.5)  # the pacer's second has passed: each round starts afresh
                # The poller is up and connected first: its start is not in the figure.
                poller = subprocess.Popen(
                    ["ip", "netns", "exec", router.client, sys.executable, "-c", _POLLER,
                     device_url, operator],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                )  # fmt: skip
                assert poller.stdout is not None and poller.stdin is not None
                assert poller.stdout.readline().strip() == "ready"
                began = time.time()
                poller.stdin.write(f"{began - 0.5}\n")
                poller.stdin.flush()
                router.ip("addr", "del", "203.0.113.1/24", "dev", "lan0")
                out, _ = poller.communicate(timeout=90)
                assert poller.returncode == 0, (out, _history(router, device_url, operator))
                answer = json.loads(out)
                latencies.append(answer["seen"] - began)
                record = answer["record"]
                heals.append(_epoch(record["healed_at"]) - _epoch(record["since"]))
            # The storm: reports received while the address is deleted every 0.2 s for 4 s.
            before = _report_count(router, device_url, operator)
            storm_began = time.time()
            deleted = 0
            while time.time() - storm_began < 4.0:
                if "203.0.113.1/24" in router.addresses("lan0"):
                    router.ip("addr", "del", "203.0.113.1/24", "dev", "lan0")
                    deleted += 1
                time.sleep(0.2)
            storm_seconds = time.time() - storm_began
            time.sleep(2.0)  # the last coalesced report
            reports = _report_count(router, device_url, operator) - before
        finally:
            router.close()
    p50, worst = median(latencies), max(latencies)
    return "\n".join(
        [
            "## Drift to the control plane: a healed `ip addr del` in the device API",
            "",
            f"A real agent (policy auto, heartbeat {HEARTBEAT:g} s) under a real control plane "
            "(SQLite); measured from the operator's namespace, polling the device API every "
            f"20 ms; {rounds} rounds{' (quick)' if quick else ''}. Baseline: the heartbeat, "
            "which was the only report between revisions.",
            "",
            "| | figure | against the heartbeat |",
            "|---|---|---|",
            f"| `ip addr del` → healed record in the device API, median | {p50 * 1000:.0f} ms | "
            f"{p50 / (HEARTBEAT / 2):.3f}x the mean wait for a heartbeat ({HEARTBEAT / 2:g} s) |",
            f"| the same, slowest round | {worst * 1000:.0f} ms | "
            f"{worst / HEARTBEAT:.3f}x the heartbeat ({HEARTBEAT:g} s) |",
            f"| the agent's own detection → heal, median | {median(heals) * 1000:.0f} ms | |",
            f"| storm: drifts healed in {storm_seconds:.1f} s | {deleted} | |",
            f"| storm: reports the control plane received | {reports} | "
            f"{reports / max(deleted, 1):.2f} per drift, "
            f"{reports / storm_seconds:.2f} per second |",
            "",
        ]
    )


def _epoch(value: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _history(router: Any, url: str, token: str) -> Any:
    return router.from_client(url, token)[1].get("drift_history"), open(
        router.workdir / "server.log"
    ).read()[-2000:]


def _report_count(router: Any, url: str, token: str) -> int:
    status, body = router.from_client(f"{url}/reports?limit=1000", token)
    assert status == 200, body
    return len(body["reports"])


if __name__ == "__main__":
    print(run(True))
