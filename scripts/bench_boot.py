"""Late links: time from a LAN link appearing to the first DHCP lease served on it.

Each run, in a fresh namespace: the agent starts with a DHCP document whose
`lan0` does not exist yet (DHCP and the link are `pending`, "waiting on
link lan0"); the veth is then created, its peer moved into a client
namespace, and a real `udhcpc` asks for a lease until one comes (1 s per
try). Measured from the link's creation:

* Kea configured on the link (`config-get` lists `lan0`): what trueup adds;
* the first lease obtained by the client.

The baseline, in the same run: the same client exchange against a Kea that
already serves the link (the DHCP exchange alone). Goal: the link is
converged within 1 s of appearing.

`python -m scripts.bench boot`, or `python -m scripts.bench_boot` for this section alone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from scripts.benchlib import median, percentile

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _document() -> dict[str, Any]:
    from tests.routers import base_document

    document = base_document(
        dhcp={
            "interfaces": ["lan0"],
            "subnets": [
                {"id": 1, "subnet": "203.0.113.0/24", "pools": ["203.0.113.100-203.0.113.150"]}
            ],
        }
    )
    document["spec"]["interfaces"] = [{"name": "lan0", "addresses": ["203.0.113.1/24"]}]
    document["spec"]["routes"] = []
    document["spec"]["tables"] = {}
    return document


def _lease(clientns: str) -> bool:
    done = subprocess.run(
        ["ip", "netns", "exec", clientns, "udhcpc", "-i", "lan0p", "-n", "-q", "-f",
         "-t", "1", "-T", "1", "-s", "/bin/true"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    return "obtained" in done.stdout + done.stderr


def _kea_on_lan0(state_dir: Path) -> bool:
    from trueup.system.kea import kea_paths
    from trueup.system.kealeases import kea_command

    socket = kea_paths(state_dir / "run" / "kea-dhcp4", 4).socket
    try:
        body = kea_command(socket, "config-get")["arguments"]["Dhcp4"]
    except Exception:
        return False
    return "lan0" in body.get("interfaces-config", {}).get("interfaces", [])


def _wait(predicate: Any, what: str, timeout: float = 90.0) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return time.monotonic()
        time.sleep(0.01)
    raise RuntimeError(f"timed out waiting for {what}")


def one_run(workdir: Path) -> tuple[float, float, float]:
    """(link → Kea on it, link → first lease, baseline exchange) in seconds."""
    from tests.routers import Router, sh
    from trueup.system.pidrecord import verified_pid

    router = Router(workdir, links=("mgmt0",))
    clientns = f"{router.name}-d"
    kea_pid: int | None = None
    try:
        sh("ip", "netns", "add", clientns)
        config = router.write("dhcp.yaml", _document())
        router.start_agent("--config", str(config))

        def pending() -> bool:
            dhcp = router.api("/v1/status").get("subsystems", {}).get("dhcp", {})
            return dhcp.get("health") == "pending"

        _wait(pending, "DHCP pending")
        router.ip("link", "add", "lan0", "type", "veth", "peer", "name", "lan0p")
        appeared = time.monotonic()
        router.ip("link", "set", "lan0p", "netns", clientns)
        sh("ip", "-n", clientns, "link", "set", "lan0p", "up")
        kea_at = _wait(lambda: _kea_on_lan0(router.state_dir), "Kea on lan0")
        lease_at = _wait(lambda: _lease(clientns), "a lease")
        started = time.monotonic()
        _wait(lambda: _lease(clientns), "a lease from a ready Kea")
        baseline = time.monotonic() - started
        record = router.state_dir / "run" / "kea-dhcp4" / "kea-dhcp4.pid"
        kea_pid = verified_pid(json.loads(record.read_text()))
        return kea_at - appeared, lease_at - appeared, baseline
    finally:
        router.stop_agents(signal.SIGKILL)
        if kea_pid is not None:
            os.kill(kea_pid, signal.SIGKILL)
        sh("ip", "netns", "del", clientns, check=False)
        router.close()


def run(quick: bool) -> str:
    runs = 3 if quick else 7
    load_before = os.getloadavg()
    kea, lease, baseline = [], [], []
    with TemporaryDirectory(prefix="trueup-bench-boot-") as tmp:
        for index in range(runs):
            workdir = Path(tmp) / str(index)
            workdir.mkdir()
            k, le, b = one_run(workdir)
            kea.append(k)
            lease.append(le)
            baseline.append(b)
    load_after = os.getloadavg()
    ok = "✅" if median(kea) < 1.0 else "❌"
    return "\n".join(
        [
            "## Late links: a LAN link appearing after the agent started",
            "",
            f"`python -m scripts.bench boot` — {runs} runs, each in a fresh namespace: the agent "
            'starts with DHCP on a `lan0` that does not exist yet (pending, "waiting on link '
            'lan0"), then the veth is created and a real `udhcpc` (1 s per try) asks for a '
            f"lease. Load average (1 min) {load_before[0]:.1f} before, {load_after[0]:.1f} after, "
            f"on {os.cpu_count()} cores.",
            "",
            "| from the link's creation to | p50 s | max s | goal |",
            "|---|---:|---:|---|",
            f"| Kea configured on `lan0` (RTM_NEWLINK → pass → links, addresses, Kea `config-set`) "
            f"| {median(kea):.3f} | {max(kea):.3f} | < 1 s {ok} |",
            f"| the first lease obtained by the client | {median(lease):.3f} | {max(lease):.3f} | |",
            f"| baseline: one exchange against a Kea already serving the link "
            f"| {median(baseline):.3f} | {percentile(baseline, 100):.3f} | |",
            "",
        ]
    )


if __name__ == "__main__":
    print(run(os.environ.get("BENCH_QUICK", "") not in ("", "0")))
