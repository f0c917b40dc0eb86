"""`make bench`: run every benchmark and write docs/benchmarks.md.

`BENCH_QUICK=1` shortens the runs (fewer rounds); the figures say which.
`python -m scripts.bench boot dhcp` runs only those sections (`boot` or
`bench_boot` or `scripts.bench_boot`) and replaces only their figures in
docs/benchmarks.md; every other section stays as it was measured.
"""

from __future__ import annotations

import datetime
import importlib
import os
import platform
import re
import sys
import traceback
from pathlib import Path

SECTIONS = [
    "scripts.bench_apply",
    "scripts.bench_startup",
    "scripts.bench_cli",
    "scripts.bench_convergence",
    "scripts.bench_reports",
    "scripts.bench_firewall",
    "scripts.bench_server",
    "scripts.bench_dhcp",
    "scripts.bench_boot",
    "scripts.bench_backup",
    "scripts.bench_ha",
    "scripts.bench_proxy",
    "scripts.bench_hostage",
    "scripts.bench_preflight",
    "scripts.bench_vpn",
    "scripts.bench_dashboard",
    "scripts.bench_notify",
    "scripts.bench_rollout",
    "scripts.bench_credentials",
    "scripts.bench_image",
    "scripts.bench_package",
    "scripts.bench_render",
    "scripts.bench_plan",
    "scripts.bench_routing",
    "scripts.bench_gateways",
    "scripts.bench_gateways_idle",
]


def _marker(name: str) -> str:
    return f"<!-- bench: {name} -->"


_END = "<!-- /bench -->"


def _selected(name: str, only: list[str]) -> bool:
    short = name.split(".")[-1]
    return not only or any(o in (name, short, short.removeprefix("bench_")) for o in only)


def _merge(previous: str, header: list[str], measured: dict[str, str]) -> str:
    """The previous file with the measured sections replaced (appended when new)."""
    text = previous
    for name, block in measured.items():
        pattern = re.compile(re.escape(_marker(name)) + r".*?" + re.escape(_END), re.S)
        title = next((line for line in block.splitlines() if line.startswith("## ")), None)
        unmarked = (
            re.compile(r"^" + re.escape(title) + r"\n.*?(?=^## |^<!-- bench: |\Z)", re.S | re.M)
            if title
            else None
        )
        if pattern.search(text):
            text = pattern.sub(lambda _m, b=block: b, text, count=1)
        elif unmarked is not None and unmarked.search(text):
            text = unmarked.sub(lambda _m, b=block: b + "\n\n", text, count=1)
        else:
            text = text.rstrip("\n") + "\n\n" + block + "\n"
    if not previous.startswith("# Benchmarks"):
        text = "\n".join(header) + "\n" + text
    return text


def main() -> int:
    quick = os.environ.get("BENCH_QUICK", "") not in ("", "0")
    only = sys.argv[1:]
    unknown = [o for o in only if not any(_selected(name, [o]) for name in SECTIONS)]
    if unknown:
        names = ", ".join(n.split(".")[-1].removeprefix("bench_") for n in SECTIONS)
        print(f"bench: no section named {', '.join(unknown)}; there are: {names}", file=sys.stderr)
        return 2
    out = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
    header = [
        "# Benchmarks",
        "",
        f"Measured by `make bench` on {datetime.date.today().isoformat()} — "
        f"{platform.machine()}, {os.cpu_count()} cores, Linux {platform.release()}, "
        f"Python {platform.python_version()}{' (quick mode)' if quick else ''}. Every figure "
        "is compared with a baseline measured in the same run.",
        "",
    ]
    failed = False
    measured: dict[str, str] = {}
    for name in SECTIONS:
        if not _selected(name, only):
            continue
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            print(f"bench: skipping {name}: {exc}", file=sys.stderr)
            continue
        print(f"bench: {name} …", file=sys.stderr, flush=True)
        try:
            section = module.run(quick)
        except Exception:
            traceback.print_exc()
            failed = True
            section = f"## {name}\n\nfailed in this run; see the `make bench` output.\n"
        print(section, flush=True)
        measured[name] = f"{_marker(name)}\n{section.rstrip()}\n{_END}"
    if only and out.exists():
        out.write_text(_merge(out.read_text(), header, measured))
    else:
        out.write_text("\n".join(header) + "\n" + "\n\n".join(measured.values()) + "\n")
    print(f"bench: wrote {out}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
