"""WireGuard benchmark: a 100-peer interface changed and applied, against raw `wg syncconf`.

In a fresh namespace (veth `mgmt0`, `lan0`), with the agent's `wireguard-go`
running: each round changes one peer's keepalive and applies the document
through the engine (preparation, observe — `wg show dump` and netlink —
plan, journal, `wg syncconf`, verify, commit). The baseline, in the same
namespace and run: one raw `wg syncconf` of the same configuration. No goal
is set; the figure says what the engine's transaction costs on top of `wg`.

`python -m scripts.bench vpn`, or
`python -c 'import scripts.bench_vpn as m; print(m.run(True))'`.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from scripts.benchlib import PYTHON, REPO, env, median, namespace, percentile, sh

PEERS = 100

_APPLY = r"""
import json, os, subprocess, sys, time
from pathlib import Path
from trueup.journal.state import StateDir
from trueup.model.document import parse_document
from trueup.reconcile.engine import Engine
from trueup.system.secretstore import read_secret, write_secret

document, state_dir, rounds, ifname = json.loads(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
key = subprocess.run(["wg", "genkey"], capture_output=True, text=True, check=True).stdout
write_secret(state_dir, "bench-key", key)
engine = Engine(StateDir(state_dir))
engine.state.ensure()
result = engine.apply_document(parse_document(document))
assert result.ok, result
peers = document["spec"]["wireguard"]["interfaces"][0]["peers"]
trueup, baseline = [], []
conf = state_dir / "raw.conf"
for i in range(rounds):
    peers[i % len(peers)]["persistent_keepalive"] = 10 + 2 * i + 1
    doc = parse_document(document)
    t = time.perf_counter(); result = engine.apply_document(doc); trueup.append(time.perf_counter() - t)
    assert result.ok, result
    peers[i % len(peers)]["persistent_keepalive"] = 10 + 2 * i + 2
    lines = ["[Interface]", "PrivateKey = " + read_secret(state_dir, "bench-key"), "ListenPort = 51820"]
    for p in peers:
        lines += ["[Peer]", "PublicKey = " + p["public_key"], "Endpoint = " + p["endpoint"],
                  "AllowedIPs = " + ", ".join(p["allowed_ips"]),
                  "PersistentKeepalive = " + str(p["persistent_keepalive"])]
    fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, ("\n".join(lines) + "\n").encode()); os.close(fd)
    t = time.perf_counter()
    done = subprocess.run(["wg", "syncconf", ifname, str(conf)], capture_output=True, text=True)
    baseline.append(time.perf_counter() - t)
    assert done.returncode == 0, done.stderr
conf.unlink()
print(json.dumps({"trueup": trueup, "baseline": baseline}))
"""


def _document(ifname: str) -> dict[str, Any]:
    peers = []
    for i in range(PEERS):
        public = sh("wg", "pubkey", input=sh("wg", "genkey").stdout).stdout.strip()
        peers.append(
            {
                "public_key": public,
                "endpoint": f"203.0.113.{2 + i % 250}:51820",
                "allowed_ips": [f"198.51.100.{128 + i % 120}/32"] if i < 120 else [],
                "persistent_keepalive": 10,
            }
        )
    return {
        "apiVersion": "trueup/v1",
        "kind": "DeviceState",
        "metadata": {"device": "bench"},
        "spec": {
            "management": {"interface": "mgmt0", "addresses": ["198.51.100.2/25"]},
            "interfaces": [{"name": "lan0", "addresses": ["203.0.113.1/24"]}],
            "wireguard": {
                "interfaces": [
                    {
                        "name": ifname,
                        "private_key": {"secret_ref": "bench-key"},
                        "listen_port": 51820,
                        "addresses": ["192.0.2.129/25"],
                        "peers": peers,
                    }
                ]
            },
        },
    }


def _kill_daemons(state_dir: Path) -> None:
    from trueup.system.pidrecord import verified_pid

    for record in state_dir.glob("run/*/*.pid"):
        try:
            pid = verified_pid(json.loads(record.read_text()))
        except (OSError, ValueError):
            continue
        if pid is not None:
            os.kill(pid, signal.SIGKILL)


def bench_apply(rounds: int) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="tu-vpn-"))
    state_dir = work / "s"
    ifname = f"wgb{secrets.token_hex(3)}"
    try:
        with namespace("vpn", ("mgmt0", "lan0")) as ns:
            out = subprocess.run(
                ["ip", "netns", "exec", ns, PYTHON, "-c", _APPLY, json.dumps(_document(ifname)),
                 str(state_dir), str(rounds), ifname],
                capture_output=True, text=True, check=False, cwd=REPO, env=env(),
            )  # fmt: skip
            _kill_daemons(state_dir)
        if out.returncode != 0:
            raise RuntimeError(out.stderr[-2000:])
        return dict(json.loads(out.stdout.splitlines()[-1]))
    finally:
        _kill_daemons(state_dir)
        shutil.rmtree(work, ignore_errors=True)
        # A killed wireguard-go leaves its control socket behind.
        (Path("/var/run/wireguard") / f"{ifname}.sock").unlink(missing_ok=True)


def run(quick: bool) -> str:
    rounds = 10 if quick else 40
    figures = bench_apply(rounds)
    ours, raw = figures["trueup"], figures["baseline"]
    ratio = median(ours) / median(raw)
    return "\n".join(
        [
            "## WireGuard apply",
            "",
            f"A {PEERS}-peer `wireguard-go` interface; each round changes one peer's keepalive "
            f"and applies the document through the engine; baseline: one raw `wg syncconf` of "
            f"the same configuration, same namespace and run ({rounds} rounds"
            f"{', quick' if quick else ''}).",
            "",
            "| measurement | median ms | p90 ms | ratio to `wg syncconf` |",
            "|---|---|---|---|",
            f"| trueup apply (whole transaction) | {median(ours) * 1000:.1f} | "
            f"{percentile(ours, 90) * 1000:.1f} | {ratio:.1f} times |",
            f"| raw `wg syncconf` | {median(raw) * 1000:.1f} | {percentile(raw, 90) * 1000:.1f} | 1.0 |",
            "",
        ]
    )
