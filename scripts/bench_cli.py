"""The CLI end to end against a running agent: the hot commands, against `ip -br addr`.

An agent runs in a namespace (mgmt0, lan0; policy `notify`). Each command is
the `trueup` console script run inside that namespace the way an operator
runs it (`ip netns exec NS trueup status --state-dir S`), timed from process
start to exit: interpreter start, imports, the request on the agent's socket,
output. Baselines in the same run, through the same `ip netns exec`: `ip -br
addr` and the bare interpreter (`python -c pass`); for contrast, the same
`status` through the typer CLI (`trueup.cli.main`, what `trueup status` ran
before the fast path). Next to the wall times, CPU times that a busy machine
does not change much: the command's own, and the agent's for the request
(from /proc, above the agent's idle rate).

Then the import profile (`python -X importtime`, median of 5) of the fast
path and of the typer CLI for `trueup status`: the ten modules with the
largest cumulative import time.

`run(quick)` returns a markdown section; `python -m scripts.bench_cli` prints it.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from scripts.benchlib import PYTHON, median, namespace, percentile, sh
from trueup.agent.client import AgentClient

GOAL_MS = 150.0
TRUEUP = str(Path(PYTHON).parent / "trueup")
TYPER_CLI = "import sys; sys.argv[0] = 'trueup'; from trueup.cli.main import main; main()"
FAST_CLI = "import sys; sys.argv[0] = 'trueup'; from trueup.cli.entry import main; main()"


def _document() -> dict[str, object]:
    return {
        "apiVersion": "trueup/v1",
        "kind": "DeviceState",
        "metadata": {"device": "bench-cli"},
        "spec": {
            "management": {"interface": "mgmt0", "addresses": ["198.51.100.2/24"]},
            "interfaces": [{"name": "lan0", "addresses": ["203.0.113.1/24"]}],
            "routes": [{"to": "192.0.2.0/24", "via": "203.0.113.254"}],
            "convergence": {"default": "notify"},
        },
    }


@dataclass
class Timed:
    label: str
    code: int = 0
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)  # the command's own CPU time
    agent_cpu: list[float] = field(default_factory=list)  # the agent's, above its idle rate


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _time(commands: list[tuple[str, list[str]]], rounds: int, agent: int) -> list[Timed]:
    """Each command `rounds` times (after two warm-up rounds), round-robin, so that a busy
    moment on the machine weighs on every command alike; wall time, the command's CPU
    time and the agent's CPU time above its idle rate."""
    before, started = _cpu_seconds(agent), time.perf_counter()
    time.sleep(3.0)
    idle_rate = (_cpu_seconds(agent) - before) / (time.perf_counter() - started)
    results = [Timed(label) for label, _ in commands]
    codes: list[set[int]] = [set() for _ in commands]
    for index in range(rounds + 2):
        for result, seen, (_, argv) in zip(results, codes, commands, strict=True):
            cpu, agent_cpu = _children_cpu(), _cpu_seconds(agent)
            start = time.perf_counter()
            proc = subprocess.run(
                argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False
            )
            wall = time.perf_counter() - start
            seen.add(proc.returncode)
            if index >= 2:
                result.wall.append(wall)
                result.cpu.append(_children_cpu() - cpu)
                result.agent_cpu.append(
                    max(0.0, _cpu_seconds(agent) - agent_cpu - idle_rate * wall)
                )
    for result, seen in zip(results, codes, strict=True):
        if len(seen) != 1:
            raise RuntimeError(f"{result.label}: exit codes vary: {seen}")
        result.code = seen.pop()
    return results


def _import_profile(argv: list[str], runs: int = 5) -> list[tuple[str, float, float]]:
    """(module, cumulative ms, self ms), the ten largest cumulative, medians over `runs`."""
    cumulative: dict[str, list[float]] = {}
    own: dict[str, list[float]] = {}
    for _ in range(runs):
        proc = subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False
        )
        for line in proc.stderr.splitlines():
            if not line.startswith("import time:") or "cumulative" in line:
                continue
            self_us, cumulative_us, name = line.removeprefix("import time:").split("|")
            key = name.rstrip()
            cumulative.setdefault(key, []).append(int(cumulative_us) / 1000)
            own.setdefault(key, []).append(int(self_us) / 1000)
    rows = [(name, median(values), median(own[name])) for name, values in cumulative.items()]
    return sorted(rows, key=lambda row: -row[1])[:10]


def _wait_started(state: Path, agent: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if agent.poll() is not None:
            raise RuntimeError("the agent exited during startup")
        client = AgentClient.connect(state)
        if client is not None:
            try:
                phases = client.request("GET", "/v1/status").json()["agent"]["startup"]
            except Exception:
                phases = []
            if phases and phases[-1]["state"] == "running":
                return
        time.sleep(0.1)
    raise RuntimeError("the agent did not finish starting within 60 s")


def run(quick: bool) -> str:
    rounds = 7 if quick else 20
    if not Path(TRUEUP).exists():
        raise RuntimeError(f"{TRUEUP}: the console script is not installed (make)")
    with tempfile.TemporaryDirectory() as tmp, namespace("cli", ("mgmt0", "lan0")) as ns:
        work = Path(tmp)
        state = work / "state"
        config = work / "desired.yaml"
        config.write_text(yaml.safe_dump(_document()))
        inside = ["ip", "netns", "exec", ns]
        sh(*inside, TRUEUP, "apply", str(config), "--init", "--state-dir", str(state))
        log = (work / "agent.log").open("w")
        agent = subprocess.Popen(
            [*inside, TRUEUP, "agent", "run", "--state-dir", str(state)],
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            _wait_started(state, agent)
            s = ["--state-dir", str(state)]
            commands: list[tuple[str, list[str]]] = [
                ("`ip -br addr` (baseline)", ["ip", "-br", "addr"]),
                ("`python -c pass` (the interpreter alone)", [PYTHON, "-c", "pass"]),
                ("`trueup status`", [TRUEUP, "status", *s]),
                ("`trueup status -o json`", [TRUEUP, "status", "-o", "json", *s]),
                ("`trueup drift`", [TRUEUP, "drift", *s]),
                ("`trueup plan FILE` (no changes)", [TRUEUP, "plan", str(config), *s]),
                ("`trueup confirm` (nothing pending)", [TRUEUP, "confirm", *s]),
                (
                    "`trueup ack addresses --for 1m --reason bench`",
                    [TRUEUP, "ack", "addresses", "--for", "1m", "--reason", "bench", *s],
                ),
                ("`trueup --help`", [TRUEUP, "--help"]),
                ("`trueup status` through the typer CLI", [PYTHON, "-c", TYPER_CLI, "status", *s]),
            ]
            load_before = os.getloadavg()[0]
            results = _time(
                [(label, [*inside, *argv]) for label, argv in commands], rounds, agent.pid
            )
            load_after = os.getloadavg()[0]
            fast_profile = _import_profile(
                [*inside, PYTHON, "-X", "importtime", "-c", FAST_CLI, "status", *s]
            )
            full_profile = _import_profile(
                [*inside, PYTHON, "-X", "importtime", "-c", TYPER_CLI, "status", *s]
            )
        finally:
            agent.terminate()
            try:
                agent.wait(timeout=10)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait()
            log.close()
    base = median(results[0].wall) * 1000
    lines = [
        "## CLI: hot commands end to end against a running agent",
        "",
        f"`make bench` — {rounds} runs of each command (after two warm-up runs, round-robin), "
        "wall time from process start to exit of the `trueup` console script inside the "
        "agent's namespace (`ip netns exec NS trueup … --state-dir S`: interpreter start, "
        "imports, the request on the agent's unix socket, output), with the baselines "
        "through the same `ip netns exec` in the same run. The agent answers each request, "
        "so its response time is part of every figure; the CPU columns (medians) say where "
        "the time goes independently of how busy the machine is: the command's own CPU "
        "time, and the agent's CPU time for the request (mean, above its idle rate: /proc "
        "counts it in 10 ms ticks). Load average "
        f"(1 min) {load_before:.2f} before the runs, {load_after:.2f} after, on "
        f"{os.cpu_count()} CPUs.",
        "",
        "| command | exit | median ms | p90 ms | ratio to `ip -br addr` | CPU ms "
        "| agent CPU ms | goal |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for result in results:
        med = median(result.wall) * 1000
        is_trueup = result.label.startswith("`trueup") and "typer" not in result.label
        goal = f"< {GOAL_MS:.0f} ms {'✅' if med < GOAL_MS else '❌'}" if is_trueup else "—"
        lines.append(
            f"| {result.label} | {result.code} | {med:.1f} | "
            f"{percentile(result.wall, 90) * 1000:.1f} | {med / base:.1f} | "
            f"{median(result.cpu) * 1000:.0f} | {_mean(result.agent_cpu) * 1000:.0f} | {goal} |"
        )
    interpreter, status = results[1], results[2]
    lines += [
        "",
        "The hot commands (`status`, `drift`, `plan`, `confirm`, `ack`) and `trueup --help` "
        "are answered by `trueup.cli.fast` (standard library only, plus PyYAML for `plan` "
        "and `-o yaml`); everything else, and these commands without a running agent, "
        "run the typer CLI as before. Of the CPU time of `trueup status`, "
        f"{median(interpreter.cpu) * 1000:.0f} ms is starting the interpreter "
        "(`python -c pass`; in this development install the `site` step also loads "
        "setuptools' editable-install finder, which imports `pathlib`, a cost a regular "
        f"install does not have) and {(median(status.cpu) - median(interpreter.cpu)) * 1000:.0f}"
        " ms the fast path's imports, request and output; the agent spends "
        f"{_mean(status.agent_cpu) * 1000:.0f} ms building the status it answers (it "
        "observes the kernel: netlink dumps, which wait for the kernel's RTNL lock while "
        "anything else on the machine changes network configuration). With nothing else "
        "running, the wall time approaches the sum of the two CPU columns.",
        "",
    ]
    for title, profile in (
        ("the fast path (`trueup status`)", fast_profile),
        ("the typer CLI (`trueup status` through `trueup.cli.main`)", full_profile),
    ):
        lines += [
            f"Import profile of {title}: `python -X importtime`, the ten largest "
            "cumulative import times (median of 5 runs, nested modules count in their "
            "parents too).",
            "",
            "| module | cumulative ms | self ms |",
            "|---|---:|---:|",
        ]
        lines += [f"| `{name.strip()}` | {cum:.1f} | {own:.1f} |" for name, cum, own in profile]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(run(quick="--quick" in sys.argv[1:]))
