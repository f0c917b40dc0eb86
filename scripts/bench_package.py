"""The router agent's Debian package: install, upgrade, the CLI, and its size.

All in one bookworm container booted with systemd (podman, PID 1), the agent's document
and links in place so the unit has work to do. Every round, timed inside the container
(`date +%s%N` around the command, so `podman exec` itself is not counted):

- fresh install: `dpkg -i` of v1 after a purge, until dpkg returns with the unit active
  (Type=notify: systemd waits for READY=1), against `systemctl restart` of the same unit;
- upgrade v1 → v2: `dpkg -i` (copy of the release, `trueup preflight`, switch, restart to
  READY) against `systemctl restart` of the v2 agent: the ratio is the price of the gate;
- the CLI through /usr/bin/trueup (`trueup --version`, `trueup status -o json` against the
  running agent) against `python3 -c pass` (the interpreter's start) in the same container.

`python -m scripts.bench_package [--quick]` prints the section.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from scripts import build_deb
from scripts.benchlib import median, percentile
from tests.packaging.debian import CACHE, UNIT, V1, V2, DebianRoot

DOCUMENT = """apiVersion: trueup/v1
kind: DeviceState
metadata: {device: edge-bench}
spec:
  management: {interface: mgmt0, addresses: ["198.51.100.2/24"], gateway: 198.51.100.1}
  interfaces:
    - {name: lan0, addresses: ["203.0.113.1/24"]}
"""


def _timed(root: DebianRoot, command: str) -> float:
    """Seconds `command` (a shell line) takes inside the container; it must succeed."""
    out = root.run(
        "sh", "-c", f"s=$(date +%s%N); {command} >/dev/null; e=$(date +%s%N); echo $((e - s))"
    ).stdout
    return int(out.strip().splitlines()[-1]) / 1e9


def _active(root: DebianRoot, version: str) -> None:
    unit = root.unit()
    if unit.get("ActiveState") != "active" or unit.get("SubState") != "running":
        raise RuntimeError(f"{UNIT} is not active after the step: {unit}")
    current = root.current()
    if current != f"releases/{version}":
        raise RuntimeError(f"/opt/trueup/current is {current}, expected releases/{version}")


def _fresh(root: DebianRoot) -> None:
    """No package, no configuration, no state; the document written again."""
    root.run("dpkg", "-P", "trueup-agent", check=False)
    root.run(
        "sh", "-c", f"mkdir -p /etc/trueup && cat > /etc/trueup/desired.yaml <<'EOF'\n{DOCUMENT}EOF"
    )


def _cli(root: DebianRoot, command: str, rounds: int) -> list[float]:
    return [_timed(root, command) for _ in range(rounds)]


def run(quick: bool) -> str:
    rounds = 3 if quick else 7
    cli_rounds = 5 if quick else 15
    with tempfile.TemporaryDirectory(prefix="trueup-bench-deb-") as tmp:
        out = Path(tmp)
        debs = {v: build_deb.build(v, out, CACHE) for v in (V1, V2)}
        deb_mb = debs[V2].stat().st_size / 1e6
        root = DebianRoot(debs)
        try:
            root.start()
            for link in ("mgmt0", "lan0"):
                root.run("ip", "link", "add", link, "type", "veth", "peer", "name", f"{link}p")
                root.run("ip", "link", "set", f"{link}p", "up")
            install: list[float] = []
            install_base: list[float] = []
            upgrade: list[float] = []
            upgrade_base: list[float] = []
            version: list[float] = []
            status: list[float] = []
            interp: list[float] = []
            # Round 0 warms the page cache and is not counted.
            for i in range(rounds + 1):
                _fresh(root)
                t_install = _timed(root, f"dpkg -i {root.deb(V1)}")
                _active(root, V1)
                t_install_base = _timed(root, f"systemctl restart {UNIT}")
                _active(root, V1)
                t_upgrade = _timed(root, f"dpkg -i {root.deb(V2)}")
                _active(root, V2)
                t_upgrade_base = _timed(root, f"systemctl restart {UNIT}")
                _active(root, V2)
                if i == 0:
                    continue
                install.append(t_install)
                install_base.append(t_install_base)
                upgrade.append(t_upgrade)
                upgrade_base.append(t_upgrade_base)
            # The upgrade's parts, on the running v2 agent: the release copy and the gate.
            copy: list[float] = []
            gate: list[float] = []
            preflight = (
                f"/opt/trueup/releases/{V2}/bin/python -I -m trueup.cli preflight "
                "--state-dir /var/lib/trueup --config /etc/trueup/desired.yaml"
            )
            for _ in range(rounds):
                copy.append(_timed(root, "cp -a /opt/trueup/package /var/tmp/tu-bench-copy"))
                root.run("rm", "-rf", "/var/tmp/tu-bench-copy")
                gate.append(_timed(root, preflight))
            root.run("trueup", "status", "-o", "json")  # warm
            for _ in range(cli_rounds):
                interp.append(_timed(root, "python3 -c pass"))
                version.append(_timed(root, "trueup --version"))
                status.append(_timed(root, "trueup status -o json"))
            release_mb = (
                int(root.run("du", "-sk", f"/opt/trueup/releases/{V2}").stdout.split()[0]) / 1024
            )
            installed_kb = int(
                root.run("dpkg-query", "-W", "-f", "${Installed-Size}", "trueup-agent").stdout
            )
            opt_mb = int(root.run("du", "-sk", "/opt/trueup").stdout.split()[0]) / 1024
        finally:
            root.close()

    def row(label: str, values: list[float]) -> str:
        return f"| {label} | {median(values):.2f} | {percentile(values, 90):.2f} |"

    def ratio(a: list[float], b: list[float]) -> str:
        return f"{median(a) / median(b):.1f}"

    return "\n".join(
        [
            "## Debian package",
            "",
            "One bookworm container booted with systemd (podman), the agent's document and links in "
            "place; every time is measured inside the container (`date` around the command). "
            f"{rounds} rounds after one warm-up round, seconds:",
            "",
            "| step | median | p90 |",
            "|---|---|---|",
            row("`systemctl restart` of the v1 agent to READY (baseline)", install_base),
            row("fresh `dpkg -i` of v1 to the unit active (READY)", install),
            row("`systemctl restart` of the v2 agent to READY (baseline)", upgrade_base),
            row("upgrade `dpkg -i` v1 → v2 (copy, preflight, switch, restart to READY)", upgrade),
            row("of which: `cp -a` of the release (measured alone)", copy),
            row("of which: `trueup preflight` of v2 (measured alone)", gate),
            "",
            f"Ratios (medians): fresh install / restart {ratio(install, install_base)}; "
            f"upgrade / restart {ratio(upgrade, upgrade_base)}: the upgrade's extra time over a "
            f"restart is {median(upgrade) - median(upgrade_base):.2f} s: the preflight gate "
            f"{median(gate):.2f} s, the release copy {median(copy):.2f} s, and "
            f"{median(upgrade) - median(upgrade_base) - median(gate) - median(copy):.2f} s left, "
            "not measured apart: dpkg unpacking the archive and everything else it and the "
            "maintainer scripts do.",
            "",
            f"The CLI through `/usr/bin/trueup` in the same container, {cli_rounds} runs each, seconds:",
            "",
            "| command | median | p90 |",
            "|---|---|---|",
            row("`python3 -c pass` (interpreter start, baseline)", interp),
            row("`trueup --version` (the full CLI; asks the running agent too)", version),
            row("`trueup status -o json` against the running agent (fast path)", status),
            "",
            f"Ratios to the interpreter's start (medians): `--version` {ratio(version, interp)}, "
            f"`status` {ratio(status, interp)}.",
            "",
            f"Size: the .deb {deb_mb:.1f} MB (xz); the installed release "
            f"`/opt/trueup/releases/{V2}` {release_mb:.0f} MB (`du`); dpkg's Installed-Size "
            f"{installed_kb / 1024:.0f} MB (the staging copy under `/opt/trueup/package`, of which "
            f"each release is a copy); all of `/opt/trueup` after the upgrade {opt_mb:.0f} MB "
            "(staging, the current release and the previous one, kept for a rollback).",
            "",
        ]
    )


if __name__ == "__main__":
    print(run("--quick" in sys.argv[1:]))
