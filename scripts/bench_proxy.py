"""Proxy benchmark: HAProxy reloaded under load — requests lost, and p99 latency with and without.

Three namespaces: the router (the engine and its HAProxy: frontend
198.51.100.2:8080 → backend 203.0.113.10:8080), a client (198.51.100.1; a
Python loop, each request on a new connection) and a backend (a small
threaded HTTP server). In one run the client first sends requests with no
reload (the baseline), then keeps sending while the engine applies 100
documents in a row (20 in quick mode), each changing the server's weight,
so each one is `haproxy -c`, a rename and a seamless reload (SIGUSR2, the
listeners handed to the new worker). Goal: no request lost; the p99 latency
with reloads is reported beside the one without.

`python -m scripts.bench proxy`, or
`python -c 'import scripts.bench_proxy as m; print(m.run(True))'` for this section alone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from scripts.benchlib import PYTHON, env, namespace, percentile, sh

_CLIENT = r"""
import http.client, json, os, sys, time
stop, out, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
lat, failed, errors = [], 0, []
while not os.path.exists(stop) and (limit == 0 or len(lat) + failed < limit):
    t = time.perf_counter()
    try:
        conn = http.client.HTTPConnection("198.51.100.2", 8080, timeout=10)
        conn.request("GET", "/healthz")
        response = conn.getresponse(); response.read(); conn.close()
        if response.status != 200:
            raise RuntimeError(f"status {response.status}")
        lat.append(time.perf_counter() - t)
    except Exception as exc:
        failed += 1
        errors.append(repr(exc))
json.dump({"latencies": lat, "failed": failed, "errors": errors[:5]}, open(out, "w"))
"""

_DRIVER = r"""
import json, sys, time
from pathlib import Path
from trueup.journal.state import StateDir
from trueup.model.document import parse_document
from trueup.reconcile.engine import Engine

document, state_dir, rounds = json.loads(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
engine = Engine(StateDir(state_dir))
engine.state.ensure()
seconds = []
for i in range(rounds + 1):
    document["spec"]["proxies"][0]["backend"]["servers"][0]["weight"] = 1 + i % 200
    t = time.perf_counter()
    result = engine.apply_document(parse_document(document))
    seconds.append(time.perf_counter() - t)
    assert result.ok, result
print(json.dumps({"apply_seconds": seconds[1:]}))
"""


def _document() -> dict[str, Any]:
    return {
        "apiVersion": "trueup/v1",
        "kind": "DeviceState",
        "metadata": {"device": "bench"},
        "spec": {
            "management": {"interface": "mgmt0", "addresses": ["198.51.100.2/24"]},
            "interfaces": [{"name": "lan0", "addresses": ["203.0.113.1/24"]}],
            "proxies": [
                {
                    "name": "web",
                    "bind": "198.51.100.2:8080",
                    "backend": {
                        "servers": [{"name": "app1", "address": "203.0.113.10:8080"}],
                        "health_check": {"path": "/healthz", "interval": "1s"},
                    },
                }
            ],
        },
    }


def _in(ns: str, *argv: str) -> list[str]:
    return ["ip", "netns", "exec", ns, *argv]


def _kill_haproxy(state_dir: Path) -> None:
    from trueup.system.pidrecord import verified_pid

    try:
        record = json.loads((state_dir / "run" / "haproxy" / "haproxy.pid").read_text())
    except (OSError, ValueError):
        return
    pid = verified_pid(record)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while verified_pid(record) is not None and time.monotonic() < deadline:
            time.sleep(0.05)


def _client(ns: str, work: Path, tag: str, limit: int) -> tuple[subprocess.Popen[str], Path, Path]:
    stop, out = work / f"stop-{tag}", work / f"client-{tag}.json"
    proc = subprocess.Popen(
        _in(ns, PYTHON, "-c", _CLIENT, str(stop), str(out), str(limit)), text=True, env=env()
    )
    return proc, stop, out


def _measure(quick: bool) -> dict[str, Any]:
    rounds = 20 if quick else 100
    with namespace("proxy", links=("mgmt0", "lan0")) as router:
        client_ns, backend_ns = f"{router}-c", f"{router}-b"
        helpers: list[subprocess.Popen[str]] = []
        with tempfile.TemporaryDirectory(prefix="trueup-bench-proxy-") as tmp:
            work, state_dir = Path(tmp), Path(tmp) / "state"
            try:
                for ns, peer, address in (
                    (client_ns, "mgmt0p", "198.51.100.1/24"),
                    (backend_ns, "lan0p", "203.0.113.10/24"),
                ):
                    sh("ip", "netns", "add", ns)
                    sh("ip", "-n", router, "link", "set", peer, "netns", ns)
                    sh("ip", "-n", ns, "link", "set", "lo", "up")
                    sh("ip", "-n", ns, "addr", "add", address, "dev", peer)
                    sh("ip", "-n", ns, "link", "set", peer, "up")
                www = work / "www"
                www.mkdir()
                (www / "healthz").write_text("ok\n")
                helpers.append(
                    subprocess.Popen(
                        _in(backend_ns, PYTHON, "-m", "http.server", "8080",
                            "--bind", "203.0.113.10", "--directory", str(www)),
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
                    )
                )  # fmt: skip
                document = json.dumps(_document())
                first = sh(*_in(router, PYTHON, "-c", _DRIVER, document, str(state_dir), "0"))
                assert first.returncode == 0, first.stderr
                baseline_count = 300 if quick else 1500
                proc, _stop, out = _client(client_ns, work, "baseline", baseline_count)
                proc.wait(timeout=300)
                baseline = json.loads(out.read_text())
                proc, stop, out = _client(client_ns, work, "reloads", 0)
                helpers.append(proc)
                time.sleep(0.5)  # the loop is sending before the first reload
                driven = sh(
                    *_in(router, PYTHON, "-c", _DRIVER, document, str(state_dir), str(rounds)),
                    check=False,
                )
                stop.touch()
                proc.wait(timeout=60)
                if driven.returncode != 0:
                    log = state_dir / "run" / "haproxy" / "haproxy.log"
                    tail = log.read_text()[-3000:] if log.exists() else ""
                    raise RuntimeError(driven.stderr[-1500:] + "\nhaproxy.log:\n" + tail)
                loaded = json.loads(out.read_text())
                applies = json.loads(driven.stdout)["apply_seconds"]
            finally:
                _kill_haproxy(state_dir)
                for helper in helpers:
                    if helper.poll() is None:
                        helper.kill()
                        helper.wait()
                for ns in (client_ns, backend_ns):
                    sh("ip", "netns", "del", ns, check=False)
    return {
        "rounds": rounds,
        "baseline": baseline,
        "loaded": loaded,
        "applies": applies,
    }


def _ms(value: float) -> str:
    return f"{value * 1000:.2f} ms"


def run(quick: bool) -> str:
    data = _measure(quick)
    base, loaded = data["baseline"], data["loaded"]
    lost = loaded["failed"]
    sent = len(loaded["latencies"]) + lost
    lines = [
        "## Proxy: HAProxy reloads under load",
        "",
        f"{data['rounds']} applies in a row, each a configuration change: `haproxy -c`, rename, "
        "seamless reload (SIGUSR2 to the master; listeners passed to the new worker). A client "
        "in another namespace sends requests, each on a new connection, through the frontend to "
        "a small HTTP server in a third namespace; the baseline is the same client in the same "
        "run with no reload.",
        "",
        "| | requests | lost | p50 | p99 |",
        "|---|---|---|---|---|",
        f"| without reloads | {len(base['latencies']) + base['failed']} | {base['failed']} | "
        f"{_ms(percentile(base['latencies'], 50))} | {_ms(percentile(base['latencies'], 99))} |",
        f"| during {data['rounds']} reloads | {sent} | {lost} | "
        f"{_ms(percentile(loaded['latencies'], 50))} | "
        f"{_ms(percentile(loaded['latencies'], 99))} |",
        "",
        f"Apply with reload (engine, `haproxy -c`, reload, verify): median "
        f"{_ms(percentile(data['applies'], 50))}, p99 {_ms(percentile(data['applies'], 99))}. "
        f"Goal: 0 requests lost — {'met' if lost == 0 else 'NOT met: ' + str(loaded['errors'])}.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(run(quick=os.environ.get("BENCH_QUICK", "") not in ("", "0") or "--quick" in sys.argv))
