"""Apply 1,000 addresses and 200 routes from empty, then a no-op re-plan, against `ip -batch`.

Both sides start from the same empty namespace in the same run. trueup is
measured in-process (the engine: observe, plan, journal, netlink, commit) and
end to end (the `trueup apply` command, interpreter start included).
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from pathlib import Path

import yaml

from scripts.benchlib import PYTHON, env, median, namespace, sh

ADDRESSES = 1000
ROUTES = 200


def _document() -> dict:
    v6 = [f"2001:db8:1::{i:x}/64" for i in range(1, ADDRESSES)]
    return {
        "apiVersion": "trueup/v1",
        "kind": "DeviceState",
        "metadata": {"device": "bench"},
        "spec": {
            "management": {"interface": "mgmt0", "addresses": ["198.51.100.2/24"]},
            "interfaces": [{"name": "lan0", "mtu": 1500, "addresses": ["203.0.113.1/24", *v6]}],
            "tables": {"bench": 100},
            "routes": [
                {
                    "to": f"192.0.2.{i}/32" if i < 256 else f"198.51.100.{i - 255}/32",
                    "via": "203.0.113.254",
                    "table": "bench",
                }
                for i in range(1, ROUTES + 1)
            ],
        },
    }


def _batch(document: dict) -> str:
    spec = document["spec"]
    lines = [
        "link set mgmt0 up",
        "addr add 198.51.100.2/24 dev mgmt0",
        "link set lan0 mtu 1500",
        "link set lan0 up",
    ]
    lines += [f"addr add {a} dev lan0" for a in spec["interfaces"][0]["addresses"]]
    lines += [f"route add {r['to']} via {r['via']} table 100 proto static" for r in spec["routes"]]
    return "\n".join(lines) + "\n"


_ENGINE = """
import json, sys, time
from trueup.journal.state import StateDir
from trueup.model.document import load_document
from trueup.reconcile.transaction import Engine
doc = load_document(sys.argv[1])
engine = Engine(StateDir(sys.argv[2]))
engine.state.ensure()
t = time.perf_counter(); result = engine.apply_document(doc); apply_s = time.perf_counter() - t
plans = []
for _ in range(5):
    t = time.perf_counter(); plan = engine.plan(doc); plans.append(time.perf_counter() - t)
    assert not any(p.changes for p in plan), [s.describe() for p in plan for s in p.steps][:5]
print(json.dumps({"apply": apply_s, "plan": sorted(plans)[2], "ok": result.ok,
                  "steps": sum(len(p.steps) for p in result.plans)}))
"""


def _timed(argv: list[str], **kwargs: object) -> tuple[float, subprocess.CompletedProcess[str]]:
    t = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload]
    return time.perf_counter() - t, proc


def run(quick: bool) -> str:
    rounds = 3 if quick else 7
    document = _document()
    batch_s: list[float] = []
    engine_apply: list[float] = []
    engine_plan: list[float] = []
    cli_apply: list[float] = []
    cli_plan: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        doc_path = Path(tmp) / "bench.yaml"
        doc_path.write_text(yaml.safe_dump(document))
        batch_path = Path(tmp) / "bench.batch"
        batch_path.write_text(_batch(document))
        for n in range(rounds):
            with namespace(f"ipb{n}", ("mgmt0", "lan0")) as ns:
                seconds, proc = _timed(["ip", "-n", ns, "-batch", str(batch_path)])
                assert proc.returncode == 0, proc.stderr
                batch_s.append(seconds)
            with namespace(f"eng{n}", ("mgmt0", "lan0")) as ns:
                out = sh(
                    "ip",
                    "netns",
                    "exec",
                    ns,
                    PYTHON,
                    "-c",
                    _ENGINE,
                    str(doc_path),
                    f"{tmp}/state-e{n}",
                )
                figures = json.loads(out.stdout)
                assert figures["ok"], figures
                engine_apply.append(figures["apply"])
                engine_plan.append(figures["plan"])
            with namespace(f"cli{n}", ("mgmt0", "lan0")) as ns:
                cli = [PYTHON, "-m", "trueup.cli"]
                seconds, proc = _timed(
                    [
                        "ip",
                        "netns",
                        "exec",
                        ns,
                        *cli,
                        "apply",
                        str(doc_path),
                        "--state-dir",
                        f"{tmp}/state-c{n}",
                    ],
                    env=env(),
                )
                assert proc.returncode == 0, proc.stderr
                cli_apply.append(seconds)
                seconds, proc = _timed(
                    [
                        "ip",
                        "netns",
                        "exec",
                        ns,
                        *cli,
                        "plan",
                        str(doc_path),
                        "--state-dir",
                        f"{tmp}/state-c{n}",
                    ],
                    env=env(),
                )
                assert proc.returncode == 0, proc.stdout[-500:]
                cli_plan.append(seconds)
        # Peak RSS of one `trueup apply` process, measured on its own.
        with namespace("rss", ("mgmt0", "lan0")) as ns:
            script = (
                "import resource,subprocess,sys;"
                "subprocess.run(sys.argv[1:],capture_output=True);"
                "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
            )
            rss_cli = int(
                sh(
                    "ip",
                    "netns",
                    "exec",
                    ns,
                    PYTHON,
                    "-c",
                    script,
                    PYTHON,
                    "-m",
                    "trueup.cli",
                    "apply",
                    str(doc_path),
                    "--state-dir",
                    f"{tmp}/state-rss",
                ).stdout.strip()
            )
        with namespace("rss-ip", ("mgmt0", "lan0")) as ns:
            rss_ip = int(
                sh(PYTHON, "-c", script, "ip", "-n", ns, "-batch", str(batch_path)).stdout.strip()
            )
    ip_m, eng_m, plan_m = median(batch_s), median(engine_apply), median(engine_plan)
    cli_m, cli_plan_m = median(cli_apply), median(cli_plan)
    ops = ADDRESSES + ROUTES + 3
    lines = [
        "## Apply: 1,000 addresses and 200 routes from empty",
        "",
        f"`make bench` — {rounds} rounds, median; each round a fresh namespace (veth, IPv6 DAD "
        f"off) for each side; {ops} kernel objects.",
        "",
        "| measurement | seconds | ratio to `ip -batch` | goal |",
        "|---|---:|---:|---|",
        f"| `ip -batch` (raw tool, same state) | {ip_m:.3f} | 1.00 | baseline |",
        f"| trueup engine apply (observe, plan, journal fsync, netlink, commit) | {eng_m:.3f} | "
        f"{eng_m / ip_m:.2f} | ≤ 2.00 {'✅' if eng_m / ip_m <= 2 else '❌'} |",
        f"| `trueup apply` end to end (interpreter start included) | {cli_m:.3f} | "
        f"{cli_m / ip_m:.2f} | — |",
        f"| no-op re-plan at that size (engine) | {plan_m:.3f} | — | < 0.100 "
        f"{'✅' if plan_m < 0.1 else '❌'} |",
        f"| `trueup plan` end to end (exit 0, no changes) | {cli_plan_m:.3f} | — | — |",
        "",
        f"Peak RSS: `trueup apply` {rss_cli / 1024:.1f} MiB, `ip -batch` {rss_ip / 1024:.1f} MiB "
        f"(ratio {rss_cli / max(rss_ip, 1):.1f}).",
        "",
    ]
    return "\n".join(lines)
