"""Apply 1,000 addresses and 200 routes from empty, then a no-op re-plan, against `ip -batch`.

Both sides start from the same empty namespace in the same run. trueup is
measured in-process (the engine: observe, plan, journal, netlink, commit) and
end to end (the `trueup apply` command, interpreter start included).

Then 20,000 addresses replaced by 20,000 others (2,000 with `BENCH_QUICK=1`):
`trueup apply` end to end with an agent running on the state directory (the
CLI sends the document to the agent's API), against the same command with no
agent (the engine runs in the CLI process), each side in its own fresh
namespace. With the agent, its reconcile loop's pass counter and its CPU time
(/proc/PID/stat) are read before and after the apply.

`python -m scripts.bench_apply [--quick] [--replace-only]` prints the section
without touching docs/benchmarks.md. `BENCH_REPLACE=0` leaves the replacement out
of the section (at 20,000 addresses it takes tens of minutes on a small machine).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from scripts.benchlib import PYTHON, env, median, namespace, sh

ADDRESSES = 1000
ROUTES = 200
REPLACE = 20_000  # addresses replaced by as many others (agent vs CLI)
REPLACE_QUICK = 2_000
# The addresses subsystem's deadline (default 90 s) is raised in both documents: at 20,000 the
# kernel alone needs minutes on a small machine, and a deadline would cancel (roll back) the apply.
ADDRESSES_DEADLINE = 7200.0
CLI_TIMEOUT = 3600.0  # seconds for one `trueup apply` of the replacement (minutes at 20,000)


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
from trueup.reconcile.engine import Engine
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


def _from_empty(quick: bool) -> str:
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
                        "--init",
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
                    "--init",
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


# -- 20,000 addresses replaced by 20,000 others: agent vs CLI ------------------------------
def _replace_document(block: int, count: int) -> dict[str, Any]:
    return {
        "apiVersion": "trueup/v1",
        "kind": "DeviceState",
        "metadata": {"device": "bench"},
        "spec": {
            "management": {"interface": "mgmt0", "addresses": ["198.51.100.2/24"]},
            "interfaces": [
                {
                    "name": "lan0",
                    "addresses": [f"2001:db8:{block}::{i:x}/128" for i in range(1, count + 1)],
                }
            ],
            "convergence": {"deadlines": {"addresses": ADDRESSES_DEADLINE}},
        },
    }


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _api(sock: Path, path: str) -> tuple[int, Any]:
    import httpx

    try:
        with httpx.Client(
            transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://agent", timeout=30
        ) as client:
            response = client.get(path)
            return response.status_code, response.json()
    except (httpx.TransportError, ValueError):
        return 0, None


def _lan0_addresses(ns: str) -> tuple[int, int]:
    """(addresses from block 1, from block 2) on lan0."""
    shown = json.loads(sh("ip", "-n", ns, "-j", "-6", "addr", "show", "dev", "lan0").stdout)
    local = [a["local"] for entry in shown for a in entry.get("addr_info", [])]
    return (
        sum(a.startswith("2001:db8:1:") for a in local),
        sum(a.startswith("2001:db8:2:") for a in local),
    )


def _cli_apply(
    ns: str, doc: Path, state: Path
) -> tuple[float, float, subprocess.CompletedProcess[str]]:
    """One `trueup apply` end to end: (wall seconds, CPU seconds of the CLI process, process)."""
    cpu = _children_cpu()
    seconds, proc = _timed(
        ["ip", "netns", "exec", ns, PYTHON, "-m", "trueup.cli", "apply", str(doc),
         "--init", "--state-dir", str(state)],
        env=env(), timeout=CLI_TIMEOUT,
    )  # fmt: skip
    return seconds, _children_cpu() - cpu, proc


def _cli_apply_ok(ns: str, doc: Path, state: Path) -> tuple[float, float]:
    seconds, cpu, proc = _cli_apply(ns, doc, state)
    if proc.returncode != 0:
        raise RuntimeError(f"trueup apply {doc.name} failed: {proc.stderr[-2000:]}")
    return seconds, cpu


def _applied_version(state: Path) -> int:
    return int(json.loads((state / "applied.json").read_text()).get("version", 0))


def _check_replaced(ns: str, count: int) -> None:
    found = _lan0_addresses(ns)
    if found != (0, count):
        raise RuntimeError(f"after the replacement lan0 has {found} addresses of (A, B)")


def _replace_cli(tmp: Path, n: int, doc_a: Path, doc_b: Path, count: int) -> dict[str, float]:
    with namespace(f"rcli{n}", ("mgmt0", "lan0")) as ns:
        state = tmp / f"state-rcli{n}"
        first, _ = _cli_apply_ok(ns, doc_a, state)
        seconds, cpu = _cli_apply_ok(ns, doc_b, state)
        _check_replaced(ns, count)
    return {"first": first, "wall": seconds, "cpu": cpu}


def _replace_batches(count: int) -> tuple[str, str]:
    """`ip -batch` files for A from empty and for A → B in trueup's order (removals first)."""
    a = [f"2001:db8:1::{i:x}/128" for i in range(1, count + 1)]
    b = [f"2001:db8:2::{i:x}/128" for i in range(1, count + 1)]
    first = ["link set mgmt0 up", "addr add 198.51.100.2/24 dev mgmt0", "link set lan0 up"]
    first += [f"addr add {x} dev lan0" for x in a]
    change = [f"addr del {x} dev lan0" for x in sorted(a)]
    change += [f"addr add {x} dev lan0" for x in sorted(b)]
    return "\n".join(first) + "\n", "\n".join(change) + "\n"


def _replace_ip(tmp: Path, n: int, batch_a: Path, batch_b: Path, count: int) -> dict[str, float]:
    with namespace(f"ripb{n}", ("mgmt0", "lan0")) as ns:
        first, proc = _timed(["ip", "-n", ns, "-batch", str(batch_a)])
        assert proc.returncode == 0, proc.stderr
        cpu = _children_cpu()
        seconds, proc = _timed(["ip", "-n", ns, "-batch", str(batch_b)])
        assert proc.returncode == 0, proc.stderr
        cpu = _children_cpu() - cpu
        _check_replaced(ns, count)
    return {"first": first, "wall": seconds, "cpu": cpu}


def _replace_agent(tmp: Path, n: int, doc_a: Path, doc_b: Path, count: int) -> dict[str, Any]:
    with namespace(f"ragt{n}", ("mgmt0", "lan0")) as ns:
        state = tmp / f"state-ragt{n}"
        _cli_apply_ok(ns, doc_a, state)
        sock = state / "agent.sock"
        log_path = tmp / f"agent-ragt{n}.log"
        log = log_path.open("w")
        started = time.perf_counter()
        agent = subprocess.Popen(
            ["ip", "netns", "exec", ns, PYTHON, "-m", "trueup.cli", "agent", "run",
             "--state-dir", str(state)],
            stdout=log, stderr=subprocess.STDOUT, env={**env(), "PYTHONFAULTHANDLER": "1"},
        )  # fmt: skip
        try:

            def started_up() -> bool:
                if _api(sock, "/v1/health/management")[0] != 200:
                    return False
                phases = (_api(sock, "/v1/status")[1] or {}).get("agent", {}).get("startup", [])
                return bool(phases) and phases[-1]["state"] == "running"

            deadline = time.monotonic() + 600
            while not (sock.exists() and started_up()):
                if agent.poll() is not None:
                    raise RuntimeError(
                        f"agent exited ({agent.returncode}): {log_path.read_text()[-4000:]}"
                    )
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"agent not started in 300 s: {log_path.read_text()[-2000:]}"
                    )
                time.sleep(0.05)
            startup = time.perf_counter() - started
            time.sleep(1.0)  # let the first passes after startup finish
            before = _api(sock, "/v1/status")[1]["reconcile_loop"]
            version = _applied_version(state)
            cpu_before = _cpu_seconds(agent.pid)
            started = time.perf_counter()
            seconds, cli_cpu, proc = _cli_apply(ns, doc_b, state)
            cli_error = None
            cli_seconds = seconds
            if proc.returncode != 0:
                # The CLI's client gives up on the agent after its own timeout while the agent
                # goes on applying: time the apply to the agent's commit (applied.json).
                cli_error = (proc.stderr.strip().splitlines() or ["?"])[-1][:300]
                while _applied_version(state) == version:
                    if agent.poll() is not None or time.perf_counter() - started > 3 * CLI_TIMEOUT:
                        raise RuntimeError(f"trueup apply via the agent failed: {proc.stderr}")
                    time.sleep(0.2)
                seconds = time.perf_counter() - started
            cpu = _cpu_seconds(agent.pid) - cpu_before
            after = _api(sock, "/v1/status")[1]["reconcile_loop"]
            time.sleep(2.0)  # the pass that follows the transaction
            settled = _api(sock, "/v1/status")[1]["reconcile_loop"]
            cpu_settled = _cpu_seconds(agent.pid) - cpu_before
            _check_replaced(ns, count)
            if agent.poll() is not None:
                raise RuntimeError(
                    f"agent exited ({agent.returncode}): {log_path.read_text()[-4000:]}"
                )
        finally:
            agent.send_signal(signal.SIGTERM)
            try:
                agent.wait(timeout=30)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait()
            log.close()
    return {
        "wall": seconds,
        "cli_error": cli_error,
        "cli_seconds": cli_seconds,
        "cli_cpu": cli_cpu,
        "agent_cpu": cpu,
        "agent_cpu_settled": cpu_settled,
        "passes": after["passes"] - before["passes"],
        "passes_settled": settled["passes"] - before["passes"],
        "events": after["events"] - before["events"],
        "events_settled": settled["events"] - before["events"],
        "overflows": settled["overflows"] - before["overflows"],
        "startup": startup,
    }


def _replace(quick: bool) -> str:
    count = REPLACE_QUICK if quick else REPLACE
    rounds = 3 if quick else 1  # at 20,000 the kernel alone needs minutes per side
    ipb: list[dict[str, float]] = []
    cli: list[dict[str, float]] = []
    agent: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        doc_a, doc_b = tmp / "a.yaml", tmp / "b.yaml"
        doc_a.write_text(yaml.safe_dump(_replace_document(1, count)))
        doc_b.write_text(yaml.safe_dump(_replace_document(2, count)))
        batch_a, batch_b = tmp / "a.batch", tmp / "b.batch"
        first, change = _replace_batches(count)
        batch_a.write_text(first)
        batch_b.write_text(change)
        for n in range(rounds):
            agent.append(_replace_agent(tmp, n, doc_a, doc_b, count))
            print(f"bench_apply: replace {n} agent {agent[-1]}", file=sys.stderr, flush=True)
            cli.append(_replace_cli(tmp, n, doc_a, doc_b, count))
            print(f"bench_apply: replace {n} cli {cli[-1]}", file=sys.stderr, flush=True)
            ipb.append(_replace_ip(tmp, n, batch_a, batch_b, count))
            print(f"bench_apply: replace {n} ip -batch {ipb[-1]}", file=sys.stderr, flush=True)
    load_after = os.getloadavg()
    ip_m = median([r["wall"] for r in ipb])
    cli_m = median([r["wall"] for r in cli])
    agent_m = median([r["wall"] for r in agent])
    ratio = agent_m / cli_m
    per_round = ", ".join(f"{a['wall'] / c['wall']:.2f}" for a, c in zip(agent, cli, strict=True))
    passes = max(r["passes_settled"] for r in agent)
    agent_cpu = median([r["agent_cpu"] for r in agent])
    agent_cli_cpu = median([r["cli_cpu"] for r in agent])
    sized = f" (quick mode: {count:,} instead of 20,000)" if quick else ""
    lines = (
        [
            f"### Agent apply: {count:,} addresses replaced by {count:,} others",
            "",
            f"`make bench`{sized} — {rounds} round{'s, median' if rounds > 1 else ''}; a fresh "
            f"namespace and state directory for each side; lan0 (up, IPv6 DAD off) holds {count:,} "
            f"addresses `2001:db8:1::N/128` (document A, applied first) and is given {count:,} "
            f"others `2001:db8:2::N/128` (document B): {2 * count:,} kernel changes, removals "
            "first. Both documents raise the addresses subsystem's deadline (default 90 s, "
            f"which cancels the 20,000-address apply on this machine) to {ADDRESSES_DEADLINE:g} "
            "s. Wall time is `trueup apply B --state-dir DIR` end to end (interpreter start and "
            "document parsing included); afterwards lan0 holds exactly B's addresses on every side. "
            "With the agent (`trueup agent run --state-dir DIR`, started after A and waited for "
            "until its startup phases are done), the CLI sends B to the agent's API and the agent's "
            "engine applies it; without, the engine runs in the CLI process.",
            "",
            "| measurement | wall s | CPU s | ratio to CLI without agent | goal |",
            "|---|---:|---:|---:|---|",
            f"| `ip -batch` of the same change (kernel floor, same order) | {ip_m:.2f} | "
            f"{median([r['cpu'] for r in ipb]):.2f} | {ip_m / cli_m:.2f} | — |",
            f"| `trueup apply B` without an agent (engine in the CLI process) | {cli_m:.2f} | "
            f"{median([r['cpu'] for r in cli]):.2f} | 1.00 | baseline |",
            f"| `trueup apply B` with the agent running (CLI → agent API) | {agent_m:.2f} | "
            f"{agent_cpu:.2f} agent + {agent_cli_cpu:.2f} CLI | {ratio:.2f} | ≤ 1.20 "
            f"{'✅' if ratio <= 1.2 else '❌'} |",
            "",
            f"Per round, agent ÷ CLI wall time: {per_round}. CPU is utime+stime (/proc/PID/stat "
            "for the agent, getrusage for the CLI and `ip`); kernel work done in the netlink "
            f"send calls counts as the sender's system time. Agent CPU ÷ wall during the apply: "
            f"{agent_cpu / agent_m:.2f}.",
            "",
            "Reconcile loop passes during the apply (`reconcile_loop.passes` from `GET /v1/status`, "
            "before → right after the CLI returned / 2 s later), per round: "
            + ", ".join(f"{r['passes']} / {r['passes_settled']}" for r in agent)
            + f" — goal ≤ 50 {'✅' if passes <= 50 else '❌'}. Netlink events the agent received "
            "in that time: "
            + ", ".join(f"{r['events_settled']:,}" for r in agent)
            + f" (overflows: {', '.join(str(r['overflows']) for r in agent)}).",
            "",
        ]
        + [
            f"Round {n}: `trueup apply B` itself exited {r['cli_seconds']:.1f} s after it started "
            f"with `{r['cli_error']}` while the agent went on applying; the wall time above is to "
            "the agent's commit (its applied.json names the new version), polled every 0.2 s.\n"
            for n, r in enumerate(agent)
            if r["cli_error"]
        ]
        + [
            f"Same run: A from empty took {median([r['first'] for r in ipb]):.2f} s with `ip -batch` "
            f"and {median([r['first'] for r in cli]):.2f} s with `trueup apply`; agent start → "
            f"startup phases done with A applied: {median([r['startup'] for r in agent]):.2f} s. "
            f"Load average (1 min) {load_before[0]:.1f} before, {load_after[0]:.1f} after, on "
            f"{os.cpu_count()} cores.",
            "",
        ]
    )
    return "\n".join(lines)


def run(quick: bool) -> str:
    if os.environ.get("BENCH_REPLACE", "") == "0":
        return _from_empty(quick)
    return _from_empty(quick) + "\n" + _replace(quick)


if __name__ == "__main__":
    quick_mode = "--quick" in sys.argv or os.environ.get("BENCH_QUICK", "") not in ("", "0")
    if "--replace-only" in sys.argv:
        print(_replace(quick_mode))
    else:
        print(run(quick_mode))
