"""The firewall with 5,000 rules: apply against `nft -f`, a no-op plan, drift detection latency.

In a fresh network namespace (the measurement runs inside it: `--inner`):

* **apply** — `Engine.apply_document` of a document whose input chain holds
  5,000 rules, replacing a different 5,000-rule revision, against `nft -f` of
  the same ruleset as one script (`table; delete table; add …`: what trueup
  loads, in nft syntax) in the same run. Measured cold (a new engine, so the
  document is canonicalised in a scratch namespace first) and after a plan of
  the same document (the operator's `trueup plan` then `trueup apply`, with
  the agent's canonical form cached);
* **one-rule edit** — the applied document with one rule changed, applied
  without a plan first: only that rule is canonicalised (the others' canonical
  forms are cached per rule);
* **no-op plan** — `Engine.plan` of the applied document, warm (as the agent
  answers `trueup plan`) and cold (a new engine);
* **drift detection** — an agent (policy `notify`, resync 60 s) and `nft add
  rule inet trueup input …`: from just before that command starts to the
  drift record's timestamp (`since`, stamped once the loop has observed the
  table), then the rule is deleted and the end of the drift awaited. The
  `nft add rule` command's own run time is given beside it.

`run(quick)` returns a markdown section; `python -m scripts.bench_firewall`
prints it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from scripts.benchlib import PYTHON, env, median, namespace, percentile

RULES = 5000


def _document(variant: int, policy: str = "auto", edit: int | None = None) -> dict[str, Any]:
    rules = ["ct state established,related accept", 'iifname "mgmt0" tcp dport 7443 accept']
    rules += [
        f"ip saddr 203.0.113.{i % 250 + 1} tcp dport {1024 + i + variant} counter accept"
        for i in range(RULES - 2)
    ]
    if edit is not None:  # one rule changed: a document never seen, its other rules known
        rules[RULES // 2] = f"ip saddr 198.18.{edit // 250}.{edit % 250 + 1} tcp dport 22 accept"
    return {
        "apiVersion": "trueup/v1",
        "kind": "DeviceState",
        "metadata": {"device": "bench"},
        "spec": {
            "management": {"interface": "mgmt0", "addresses": ["198.51.100.2/24"]},
            "convergence": {"default": policy},
            "firewall": {
                "chains": [
                    {"name": "input", "type": "filter", "hook": "input", "policy": "drop",
                     "rules": rules}
                ]
            },
        },
    }  # fmt: skip


def _timed(call: Any) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


# -- inside the namespace ---------------------------------------------------------
def _engine(state: Path) -> Any:
    from trueup.journal.state import StateDir
    from trueup.reconcile.engine import Engine

    directory = StateDir(state)
    directory.ensure()
    return Engine(directory)


def inner(work: Path, rounds: int, trials: int) -> dict[str, Any]:
    from trueup.model.document import parse_document
    from trueup.subsystems.firewall.canonical import script

    docs = [parse_document(_document(v)) for v in (0, 1)]
    texts = []
    for doc in docs:
        text, _ = script(doc.spec.section("firewall"))
        texts.append("table inet trueup\ndelete table inet trueup\n" + text)
    out: dict[str, list[float]] = {k: [] for k in
        ("nft", "cold", "planned", "edit", "noop", "noop_cold", "detect", "nft_add")}  # fmt: skip

    def nft_f(text: str) -> None:
        subprocess.run(["nft", "-f", "-"], input=text, text=True, check=True)

    for r in range(rounds):
        out["nft"].append(_timed(lambda r=r: nft_f(texts[r % 2])))
    subprocess.run(["nft", "delete", "table", "inet", "trueup"], check=False)
    state = work / "state"
    engine = _engine(state)
    assert engine.apply_document(docs[0], management_confirmed=True).ok
    for r in range(rounds):
        doc = docs[(r + 1) % 2]
        fresh = _engine(state)  # nothing cached: canonicalised in a scratch namespace
        started = time.perf_counter()
        result = fresh.apply_document(doc)
        out["cold"].append(time.perf_counter() - started)
        assert result.ok, result.failed
    for r in range(rounds):
        doc = docs[r % 2]
        engine.plan(doc)  # `trueup plan` first: the agent keeps the canonical form
        started = time.perf_counter()
        result = engine.apply_document(doc)
        out["planned"].append(time.perf_counter() - started)
        assert result.ok, result.failed
        out["nft"].append(_timed(lambda r=r: nft_f(texts[r % 2])))  # interleaved baseline
        engine.apply_document(doc)  # back to what the engine applied (nft -f bumped it)
    applied = docs[(rounds - 1) % 2]
    for r in range(rounds):
        edited = parse_document(_document((rounds - 1) % 2, edit=r))
        started = time.perf_counter()
        result = engine.apply_document(edited)  # no plan first: canonicalised here
        out["edit"].append(time.perf_counter() - started)
        assert result.ok, result.failed
    assert engine.apply_document(applied).ok
    for _ in range(rounds * 4):
        started = time.perf_counter()
        plans = engine.plan(applied)
        out["noop"].append(time.perf_counter() - started)
        assert not any(p.changes for p in plans)
    for _ in range(rounds):
        fresh = _engine(state)
        out["noop_cold"].append(_timed(lambda f=fresh: f.plan(applied)))
    out["detect"], out["nft_add"] = _detection(work, state, trials)
    return out


def _detection(work: Path, state: Path, trials: int) -> tuple[list[float], list[float]]:
    import httpx

    log = (work / "agent.log").open("w")
    agent = subprocess.Popen(
        [PYTHON, "-m", "trueup.cli", "agent", "run", "--state-dir", str(state)],
        stdout=log, stderr=subprocess.STDOUT,
        env={**env(), "TRUEUP_RESYNC_SECONDS": "60", "TRUEUP_FLAP_THRESHOLD": "1000000",
             "TRUEUP_RETRY_BUDGET": "1000000"},
    )  # fmt: skip
    detect: list[float] = []
    command: list[float] = []
    try:
        sock = state / "agent.sock"
        client = httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)),
                              base_url="http://agent", timeout=60)  # fmt: skip
        _until(lambda: _status(client) is not None, "agent up", 60)
        response = client.post("/v1/apply", json=_document(0, "notify"))
        assert response.status_code == 200, response.text

        def drift() -> dict[str, Any] | None:
            status = _status(client) or {}
            record = status.get("subsystems", {}).get("firewall", {}).get("drift")
            return record if isinstance(record, dict) else None

        _until(lambda: drift() is None, "in sync", 60)
        for trial in range(trials):
            port = str(60000 + trial)
            started = time.time()
            done = subprocess.run(
                ["nft", "add", "rule", "inet", "trueup", "input", "tcp", "dport", port, "drop"],
                check=True,
            )
            command.append(time.time() - started)
            del done
            _until(lambda: drift() is not None, "drift recorded", 30)
            record = drift()
            assert record is not None
            since = datetime.fromisoformat(record["since"].replace("Z", "+00:00")).timestamp()
            detect.append(since - started)
            listing = subprocess.run(["nft", "-a", "list", "chain", "inet", "trueup", "input"],
                                     capture_output=True, text=True, check=True).stdout  # fmt: skip
            handle = next(
                line.rsplit("# handle ", 1)[1].strip()
                for line in listing.splitlines()
                if f"dport {port} drop" in line
            )
            subprocess.run(["nft", "delete", "rule", "inet", "trueup", "input", "handle", handle],
                           check=True)  # fmt: skip
            _until(lambda: drift() is None, "drift ended", 30)
    finally:
        agent.terminate()
        try:
            agent.wait(timeout=20)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()
        log.close()
    return detect, command


def _status(client: Any) -> dict[str, Any] | None:
    try:
        response = client.get("/v1/status")
    except Exception:
        return None
    return dict(response.json()) if response.status_code == 200 else None


def _until(predicate: Any, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.005)
    raise RuntimeError(f"timed out waiting for {what}")


# -- outside ----------------------------------------------------------------------
def _ms(values: list[float]) -> str:
    return f"{median(values) * 1000:.0f} | {percentile(values, 99) * 1000:.0f}"


def run(quick: bool) -> str:
    rounds, trials = (3, 10) if quick else (7, 50)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp, namespace("fw", ("mgmt0",)) as ns:
        measured = subprocess.run(
            ["ip", "netns", "exec", ns, PYTHON, "-m", "scripts.bench_firewall", "--inner",
             tmp, str(rounds), str(trials)],
            capture_output=True, text=True, env=env(), check=False,
        )  # fmt: skip
        if measured.returncode != 0:
            raise RuntimeError(f"inner measurement failed: {measured.stderr[-3000:]}")
    load_after = os.getloadavg()[0]
    s = json.loads(measured.stdout)
    base = median(s["nft"])
    cold, planned = median(s["cold"]) / base, median(s["planned"]) / base
    edit = median(s["edit"]) / base
    noop_ms = median(s["noop"]) * 1000
    detect_p99 = percentile(s["detect"], 99) * 1000
    return "\n".join(
        [
            f"## Firewall: {RULES:,} nftables rules",
            "",
            f"`python -m scripts.bench_firewall` (also part of `make bench`) — {rounds} applies "
            f"of each kind alternating between two {RULES:,}-rule revisions, {trials} drift trials; "
            f"load average (1 min) {load_before:.2f} before, {load_after:.2f} after, on "
            f"{os.cpu_count()} CPUs.",
            "",
            "| measurement | p50 ms | p99 ms | ratio to `nft -f` (p50) | goal |",
            "|---|---:|---:|---:|---|",
            f"| `nft -f` of the same ruleset (baseline, same run) | {_ms(s['nft'])} | 1.00 | |",
            f"| apply, cold (canonicalise in a scratch namespace, load, verify) | {_ms(s['cold'])} "
            f"| {cold:.2f} | ≤ 1.5x {'✅' if cold <= 1.5 else '❌'} |",
            f"| apply after `plan` of the same document (canonical form cached) "
            f"| {_ms(s['planned'])} | {planned:.2f} | ≤ 1.5x {'✅' if planned <= 1.5 else '❌'} |",
            f"| apply of a one-rule edit, no plan first (only that rule canonicalised) "
            f"| {_ms(s['edit'])} | {edit:.2f} | ≤ 1.5x {'✅' if edit <= 1.5 else '❌'} |",
            f"| no-op plan (warm: the agent answering `trueup plan`) | {_ms(s['noop'])} | | "
            f"< 100 ms {'✅' if noop_ms < 100 else '❌'} |",
            f"| no-op plan, cold (new engine: canonicalise and list) | {_ms(s['noop_cold'])} | | |",
            f"| drift recorded after `nft add rule` (from the command's start) | {_ms(s['detect'])} "
            f"| | p99 ≤ 50 ms {'✅' if detect_p99 <= 50 else '❌'} |",
            f"| the `nft add rule` command itself | {_ms(s['nft_add'])} | | |",
            "",
        ]
    )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--inner":
        print(json.dumps(inner(Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))))
    else:
        print(run(os.environ.get("BENCH_QUICK", "") not in ("", "0")))
