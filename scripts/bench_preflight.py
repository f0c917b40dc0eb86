"""Preflight: `trueup preflight --config NEW.yaml` end to end, against the raw probes it runs.

In one router namespace (`tests.routers.Router`) with a plain revision applied,
`trueup preflight --config NEW.yaml -o json` is timed as the operator runs it
(a new interpreter each time, imports included) for a document that needs
every daemon: Kea with its HA hook, keepalived, Knot, HAProxy and nftables.
The baseline, in the same run and namespace: the same harmless probes run
one after the other by a shell (`kea-dhcp4 -v`, `keepalived -v`, …, the
commands preflight itself executes), plus a bare interpreter start — the
least any preflight that runs the binaries could cost.

`python -m scripts.bench preflight`, or `python -m scripts.bench_preflight` for this section alone.
"""

from __future__ import annotations

import shlex
import shutil
import statistics
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory


def _timed(run: object, argv: list[str]) -> float:
    began = time.perf_counter()
    done = run(*argv)  # type: ignore[operator]
    took = time.perf_counter() - began
    if done.returncode not in (0, 1):
        raise RuntimeError(f"{argv[:3]}: exit {done.returncode}: {done.stderr[-500:]}")
    return took


def run(quick: bool) -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.integration.test_preflight import DHCP, DNS, HA, PROXY, _plain, _with
    from tests.routers import TRUEUP, Router
    from trueup.model.document import DeviceState
    from trueup.subsystems.registry import default_subsystems

    rounds = 5 if quick else 20
    with TemporaryDirectory(prefix="trueup-bench-preflight-") as tmp:
        router = Router(Path(tmp))
        try:
            done = router.trueup("apply", str(router.write("current.yaml", _plain())))
            if done.returncode != 0:
                raise RuntimeError(done.stdout + done.stderr)
            new_doc = _with(dhcp=DHCP, ha=HA, dns=DNS, proxies=[PROXY])
            new = router.write("new.yaml", new_doc)
            document = DeviceState.model_validate(new_doc)
            probes = [
                [shutil.which(r.name) or r.name, *r.probe]
                for sub in default_subsystems()
                for r in sub.requirements(document)
                if r.kind == "binary"
            ]
            script = "; ".join(shlex.join(p) + " >/dev/null 2>&1" for p in probes)
            preflight = [*TRUEUP, "preflight", "--config", str(new), "-o", "json"]
            preflight += ["--state-dir", str(router.state_dir)]
            raw = ["sh", "-c", f"{sys.executable} -c pass; {script}"]
            imports = [sys.executable, "-c", "import trueup.cli.main, trueup.startup.preflight"]
            checked = router.run(*preflight)
            if '"ok": true' not in checked.stdout:
                raise RuntimeError(f"preflight found blockers: {checked.stdout[-2000:]}")
            _timed(router.run, preflight)  # warm the page cache
            _timed(router.run, raw)
            ours = [_timed(router.run, preflight) for _ in range(rounds)]
            base = [_timed(router.run, raw) for _ in range(rounds)]
            imported = [_timed(router.run, imports) for _ in range(rounds)]
        finally:
            router.close()
    p50, b50 = statistics.median(ours), statistics.median(base)
    names = ", ".join(f"`{Path(p[0]).name} {' '.join(p[1:])}`" for p in probes)
    return "\n".join(
        [
            "## Preflight: what the new document needs, checked by running it",
            "",
            f"`python -m scripts.bench preflight` — {rounds} rounds, each a new process "
            "(interpreter start and imports included), in a router namespace; the document "
            "adds DHCP with HA, HA, DNS and a proxy to a plain revision. Baseline in the same "
            f"run: a bare interpreter start and the same {len(probes)} probes run by a shell "
            f"({names}).",
            "",
            "| | p50 | max | ratio |",
            "|---|---:|---:|---:|",
            f"| `trueup preflight --config NEW.yaml` | {p50 * 1000:.0f} ms | "
            f"{max(ours) * 1000:.0f} ms | {p50 / b50:.2f}x |",
            f"| baseline: interpreter start + the raw probes | {b50 * 1000:.0f} ms | "
            f"{max(base) * 1000:.0f} ms | 1.00x |",
            f"| of which trueup's imports alone (the CLI and preflight) | "
            f"{statistics.median(imported) * 1000:.0f} ms | {max(imported) * 1000:.0f} ms | "
            f"{statistics.median(imported) / b50:.2f}x |",
            "",
            "The probes run side by side, so they cost about the slowest of them; the rest is "
            "the interpreter importing the document model and the engine.",
            "",
        ]
    )


if __name__ == "__main__":
    print(run(quick=True))
