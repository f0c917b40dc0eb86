"""The gateway monitor's idle cost: the agent's CPU while it probes two uplinks every 200 ms.

The two-uplink router of the integration tests (`tests.integration.test_gateways.WanRig`:
a real agent, two upstream namespaces answering for the probe target, both uplinks up)
with `interval_ms: 200`. The figure is the agent's user + system CPU time
(/proc/PID/stat) over a quiet period, as a share of one core; then the same agent
after a document without gateways (the monitor's threads gone). Baseline in the same
run: two `busybox ping -i 0.2 -I wanX` processes in the router's namespace, the raw
tool doing the same probing.

`python -m scripts.bench gateways_idle` for this section alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def _cpu(pid: int) -> float:
    """User + system CPU seconds of `pid` and its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _share(pids: list[int], seconds: float) -> float:
    """The percent of one core `pids` used together over `seconds`."""
    before = sum(_cpu(p) for p in pids)
    time.sleep(seconds)
    return 100.0 * (sum(_cpu(p) for p in pids) - before) / seconds


def run(quick: bool) -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.integration.test_gateways import HOST, WanRig

    period = 10.0 if quick else 30.0
    with tempfile.TemporaryDirectory(prefix="tu-gw-idle-") as tmp:
        tool = ["busybox", "ping", "-q", "-i", "0.2"]
        rig = WanRig(Path(tmp))
        try:
            rig.start(interval_ms=200)
            router = rig.router
            pid = router.agents[-1].pid
            time.sleep(2.0)  # past the start's own work
            probing = _share([pid], period)
            body = rig.document()
            del body["spec"]["gateways"]
            applied = router.trueup("apply", str(router.write("none.yaml", body)))
            if applied.returncode != 0:
                raise RuntimeError(applied.stdout + applied.stderr)
            router.wait_for(lambda: not rig.gateways().get("monitoring"), what="no monitor")
            time.sleep(2.0)
            without = _share([pid], period)
            pings = [
                subprocess.Popen(
                    ["ip", "netns", "exec", router.name, *tool, "-I", link, HOST],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                for link in ("wan0", "wan1")
            ]
            try:
                time.sleep(1.0)
                if any(p.poll() is not None for p in pings):
                    raise RuntimeError("busybox ping ended early")
                raw = _share([p.pid for p in pings], period)
            finally:
                for proc in pings:
                    proc.send_signal(signal.SIGKILL)
                    proc.wait()
        finally:
            rig.close()
    added = probing - without
    ratio = added / raw if raw > 0 else float("nan")
    return "\n".join(
        [
            "## Gateways: the monitor's idle cost",
            "",
            "The two-uplink router of the integration tests with a real agent, both uplinks up, "
            f"probes every 200 ms (ICMP, one target each); CPU over {period:.0f} s of quiet "
            "(/proc/PID/stat, user + system, as a share of one core). Baseline in the same "
            "run: two `busybox ping -i 0.2 -I wanX` doing the same probing.",
            "",
            "| | CPU (one core) |",
            "|---|---|",
            f"| the agent probing two uplinks | {probing:.2f} % |",
            f"| the same agent without gateways | {without:.2f} % |",
            f"| the monitor's share (the difference) | {added:.2f} % |",
            f"| two `busybox ping -i 0.2` | {raw:.2f} % |",
            "",
            f"Ratio monitor / busybox ping: {ratio:.1f}. Each round opens a bound ICMP socket, "
            "sends, waits on a selector and closes it, in Python, and runs the uplink's state "
            "machine; no round touches netlink unless the decision changes.",
            "",
        ]
    )


if __name__ == "__main__":
    print(run("--quick" in sys.argv))
