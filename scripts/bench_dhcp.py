"""DHCP benchmarks: a 200-subnet Kea configuration applied, and 100,000 leases inspected.

1. **Apply.** In a fresh namespace (veth `lan0`), with the agent's Kea
   running: each round changes the document's valid lifetime and applies it
   through the engine (observe, plan, journal, `config-test`, `config-set`,
   `config-write`, verify, commit). The baseline, in the same namespace and
   run: `kea-dhcp4 -t` of the same compiled configuration plus one raw
   `config-set` of it over the control socket. Goal: at most 1.5 times.
2. **Lease inspection.** A memfile of 100,000 leases (plus 10,000 rows that
   renew earlier ones, and 1,000 releases), Kea stopped: a fresh interpreter
   streams `leases_from_memfile` and reports wall time and peak RSS. Goals:
   < 1 s and < 100 MB.

`python -m scripts.bench dhcp`, or `python -m scripts.bench_dhcp` for this section alone.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
SUBNETS = 200
LEASES = 100_000

_APPLY = r"""
import json, sys, time, subprocess
from pathlib import Path
from trueup.journal.state import StateDir
from trueup.model.document import parse_document
from trueup.reconcile.engine import Engine
from trueup.subsystems.dhcp.keaconfig import compile_config
from trueup.subsystems.dhcp.section import DhcpSection
from trueup.system.kea import kea_paths
from trueup.system.kealeases import kea_command

document, state_dir, rounds = json.loads(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
engine = Engine(StateDir(state_dir))
engine.state.ensure()
result = engine.apply_document(parse_document(document))
assert result.ok, result
paths = kea_paths(state_dir / "run" / "kea-dhcp4", 4)
trueup, baseline = [], []
for i in range(rounds):
    document["spec"]["dhcp"]["lifetimes"]["valid"] = 3600 + 2 * i + 1
    doc = parse_document(document)
    t = time.perf_counter(); result = engine.apply_document(doc); trueup.append(time.perf_counter() - t)
    assert result.ok, result
    document["spec"]["dhcp"]["lifetimes"]["valid"] = 3600 + 2 * i + 2
    section = DhcpSection.model_validate(document["spec"]["dhcp"])
    config = compile_config(section, 4, paths, ["lan0"])
    Path(sys.argv[4]).write_text(json.dumps(config))
    t = time.perf_counter()
    check = subprocess.run(["kea-dhcp4", "-t", sys.argv[4]], capture_output=True, text=True)
    answer = kea_command(paths.socket, "config-set", config)
    baseline.append(time.perf_counter() - t)
    assert check.returncode == 0, check.stdout + check.stderr
    assert answer["result"] == 0, answer
print(json.dumps({"trueup": trueup, "baseline": baseline}))
"""

_LEASES = r"""
import json, resource, sys, time
t = time.perf_counter()
from trueup.system.kealeases import leases_from_memfile
count = sum(1 for _ in leases_from_memfile(4, sys.argv[1]))
elapsed = time.perf_counter() - t
print(json.dumps({"seconds": elapsed, "count": count,
                  "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def _sh(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=True)


def _document() -> dict[str, Any]:
    subnets = []
    for i in range(SUBNETS):
        a, b = divmod(i, 256)
        subnets.append(
            {
                "id": i + 1,
                "subnet": f"10.{a}.{b}.0/24".replace("10.", "10.", 1),
                "pools": [f"10.{a}.{b}.100-10.{a}.{b}.200"],
                "options": {"routers": f"10.{a}.{b}.1"},
            }
        )
    # The lan0 subnet, from the documentation range, is the one clients would use.
    subnets[0] = {"id": 1, "subnet": "203.0.113.0/24", "pools": ["203.0.113.100-203.0.113.200"]}
    return {
        "apiVersion": "trueup/v1",
        "kind": "DeviceState",
        "metadata": {"device": "bench"},
        "spec": {
            "management": {"interface": "mgmt0", "addresses": ["198.51.100.2/24"]},
            "interfaces": [{"name": "lan0", "addresses": ["203.0.113.1/24"]}],
            "dhcp": {"interfaces": ["lan0"], "lifetimes": {"valid": 3600}, "subnets": subnets},
        },
    }


def _kill_kea(state_dir: Path) -> None:
    from trueup.system.pidrecord import verified_pid

    for record in state_dir.glob("run/*/*.pid"):
        try:
            pid = verified_pid(json.loads(record.read_text()))
        except (OSError, ValueError):
            continue
        if pid is not None:
            os.kill(pid, signal.SIGKILL)


def bench_apply(rounds: int) -> dict[str, Any]:
    ns = f"tu-bench-dhcp-{os.getpid()}"
    work = Path(tempfile.mkdtemp(prefix="tu-dhcp-"))
    state_dir = work / "s"
    try:
        _sh("ip", "netns", "add", ns)
        for argv in (
            ("link", "set", "lo", "up"),
            ("link", "add", "mgmt0", "type", "veth", "peer", "name", "mgmt0p"),
            ("link", "add", "lan0", "type", "veth", "peer", "name", "lan0p"),
            ("link", "set", "lan0p", "up"),
            ("link", "set", "mgmt0p", "up"),
        ):
            _sh("ip", "-n", ns, *argv)
        out = subprocess.run(
            ["ip", "netns", "exec", ns, PYTHON, "-c", _APPLY, json.dumps(_document()),
             str(state_dir), str(rounds), str(work / "raw.json")],
            capture_output=True, text=True, check=False, cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )  # fmt: skip
        if out.returncode != 0:
            raise RuntimeError(out.stderr[-2000:])
        return dict(json.loads(out.stdout.splitlines()[-1]))
    finally:
        _kill_kea(state_dir)
        subprocess.run(["ip", "netns", "del", ns], check=False)
        shutil.rmtree(work, ignore_errors=True)


def _write_memfile(path: Path) -> None:
    header = (
        "address,hwaddr,client_id,valid_lifetime,expire,subnet_id,fqdn_fwd,fqdn_rev,"
        "hostname,state,user_context\n"
    )
    now = int(time.time())
    with open(path, "w") as out:
        out.write(header)
        for i in range(LEASES):
            a, b = divmod(i, 65536)
            c, d = divmod(b, 256)
            mac = f"02:00:{a:02x}:{c:02x}:{d:02x}:01"
            out.write(f"10.{a}.{c}.{d},{mac},,3600,{now + 3600},1,0,0,host-{i},0,\n")
        for i in range(0, 10_000):  # renewals: a later row for the same address
            c, d = divmod(i, 256)
            out.write(
                f"10.0.{c}.{d},02:00:00:{c:02x}:{d:02x}:01,,3600,{now + 7200},1,0,0,r-{i},0,\n"
            )
        for i in range(10_000, 11_000):  # releases
            c, d = divmod(i, 256)
            out.write(f"10.0.{c}.{d},02:00:00:{c:02x}:{d:02x}:01,,0,{now},1,0,0,,0,\n")


def bench_leases(rounds: int) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="tu-leases-"))
    try:
        memfile = work / "kea-leases4.csv"
        _write_memfile(memfile)
        figures = []
        for _ in range(rounds):
            out = subprocess.run(
                [PYTHON, "-c", _LEASES, str(memfile)], capture_output=True, text=True,
                check=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
            )  # fmt: skip
            figures.append(json.loads(out.stdout))
        return {
            "seconds": statistics.median(f["seconds"] for f in figures),
            "max_seconds": max(f["seconds"] for f in figures),
            "rss_mib": max(f["rss_mib"] for f in figures),
            "count": figures[0]["count"],
            "size_mib": memfile.stat().st_size / 2**20,
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(quick: bool) -> str:
    rounds = 3 if quick else 9
    load_before = os.getloadavg()
    apply = bench_apply(rounds)
    leases = bench_leases(3 if quick else 5)
    load_after = os.getloadavg()
    trueup = statistics.median(apply["trueup"])
    baseline = statistics.median(apply["baseline"])
    ratio = trueup / baseline
    ok = "✅" if ratio <= 1.5 else "❌"
    lease_ok = "✅" if leases["seconds"] < 1.0 and leases["rss_mib"] < 100 else "❌"
    return "\n".join(
        [
            f"## DHCP: a {SUBNETS}-subnet Kea configuration, and {LEASES:,} leases",
            "",
            f"`python -m scripts.bench dhcp` — {rounds} rounds, median; a fresh namespace "
            "(veth `lan0`) with the agent's Kea running; each round changes the valid lifetime. "
            f"Load average (1 min) {load_before[0]:.1f} before, {load_after[0]:.1f} after, on "
            f"{os.cpu_count()} cores.",
            "",
            "| measurement | seconds | ratio to baseline | goal |",
            "|---|---:|---:|---|",
            f"| `kea-dhcp4 -t` + raw `config-set` (same configuration, same run) | "
            f"{baseline:.3f} | 1.00 | baseline |",
            "| trueup engine apply (observe, plan, journal fsync, config-test, config-set, "
            f"config-write, verify, commit) | {trueup:.3f} | {ratio:.2f} | ≤ 1.50 {ok} |",
            "",
            f"Lease inspection, Kea stopped: a memfile of {leases['count']:,} live leases "
            f"({LEASES:,} rows + 10,000 renewals + 1,000 releases, "
            f"{leases['size_mib']:.1f} MiB), streamed by `leases_from_memfile` in a fresh "
            f"interpreter (import included): median {leases['seconds']:.3f} s, max "
            f"{leases['max_seconds']:.3f} s, peak RSS {leases['rss_mib']:.1f} MiB "
            f"(goals < 1 s, < 100 MB {lease_ok}).",
            "",
        ]
    )


if __name__ == "__main__":
    print(run(os.environ.get("BENCH_QUICK", "") not in ("", "0")))
