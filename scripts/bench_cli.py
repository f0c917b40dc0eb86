"""The CLI end to end against a running agent: the hot commands, against `ip -br addr`.

An agent runs in a namespace (mgmt0, lan0; policy `notify`). Each command is
the `trueup` console script run inside that namespace the way an operator
runs it (`ip netns exec NS trueup status --state-dir S`), timed from process
start to exit: interpreter start, imports, the request on the agent's socket,
output. Baselines in the same run, through the same `ip netns exec`: `ip -br
addr` and the bare interpreter (`python -c pass`); for contrast, the same
`status` through the typer CLI (`trueup.cli.main`, what `trueup status` ran
before the fast path).

Then the import profile (`python -X importtime`, median of 5) of the fast
path and of the typer CLI for `trueup status`: the ten modules with the
largest cumulative import time.

`run(quick)` returns a markdown section; `python -m scripts.bench_cli` prints it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
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


def _time(commands: list[list[str]], rounds: int) -> list[tuple[list[float], int]]:
    """Wall times of each command over `rounds` rounds (after two warm-up rounds) and its
    exit code. Round-robin, so a busy moment on the machine weighs on every command alike."""
    codes: list[set[int]] = [set() for _ in commands]
    samples: list[list[float]] = [[] for _ in commands]
    for index in range(rounds + 2):
        for number, argv in enumerate(commands):
            start = time.perf_counter()
            proc = subprocess.run(
                argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False
            )
            elapsed = time.perf_counter() - start
            codes[number].add(proc.returncode)
            if index >= 2:
                samples[number].append(elapsed)
    for argv, seen in zip(commands, codes, strict=True):
        if len(seen) != 1:
            raise RuntimeError(f"{' '.join(argv)}: exit codes vary: {seen}")
    return [(times, seen.pop()) for times, seen in zip(samples, codes, strict=True)]


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
        sh(*inside, TRUEUP, "apply", str(config), "--state-dir", str(state))
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
            timed = _time([[*inside, *argv] for _, argv in commands], rounds)
            results = [
                (label, *outcome) for (label, _), outcome in zip(commands, timed, strict=True)
            ]
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
    base = median(results[0][1]) * 1000
    interpreter = median(results[1][1]) * 1000
    lines = [
        "## CLI: hot commands end to end against a running agent",
        "",
        f"`make bench` — median of {rounds} runs each (after two warm-up runs), wall time "
        "from process start to exit of the `trueup` console script inside the agent's "
        "namespace (`ip netns exec NS trueup … --state-dir S`: interpreter start, imports, "
        "the request on the agent's unix socket, output). The baselines run through the "
        "same `ip netns exec` in the same run. The agent answers each request, so its own "
        f"response time is part of every figure. Load average (1 min) {load_before:.2f} "
        f"before the runs, {load_after:.2f} after, on {os.cpu_count()} CPUs.",
        "",
        "| command | exit | median ms | p90 ms | over `python -c pass`, ms "
        "| ratio to `ip -br addr` | goal |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for label, samples, code in results:
        med = median(samples) * 1000
        is_trueup = label.startswith("`trueup") and "typer" not in label
        goal = f"< {GOAL_MS:.0f} ms {'✅' if med < GOAL_MS else '❌'}" if is_trueup else "—"
        over = f"{med - interpreter:.1f}" if label != results[1][0] else "—"
        lines.append(
            f"| {label} | {code} | {med:.1f} | {percentile(samples, 90) * 1000:.1f} | "
            f"{over} | {med / base:.1f} | {goal} |"
        )
    lines += [
        "",
        "The hot commands (`status`, `drift`, `plan`, `confirm`, `ack`) and `trueup --help` "
        "are answered by `trueup.cli.fast` (standard library only, plus PyYAML for `plan` "
        "and `-o yaml`); everything else, and these commands without a running agent, "
        "run the typer CLI as before. The interpreter itself is most of what is left: in "
        "this development install the `site` step also loads setuptools' editable-install "
        "finder (which imports `pathlib`), a cost a regular install does not have.",
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
