"""`make bench`: run every benchmark and write docs/benchmarks.md.

`BENCH_QUICK=1` shortens the runs (fewer rounds); the figures say which.
"""

from __future__ import annotations

import datetime
import importlib
import os
import platform
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
    "scripts.bench_credentials",
    "scripts.bench_image",
    "scripts.bench_package",
]


def main() -> int:
    quick = os.environ.get("BENCH_QUICK", "") not in ("", "0")
    only = sys.argv[1:]
    out = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
    parts = [
        "# Benchmarks",
        "",
        f"Measured by `make bench` on {datetime.date.today().isoformat()} — "
        f"{platform.machine()}, {os.cpu_count()} cores, Linux {platform.release()}, "
        f"Python {platform.python_version()}{' (quick mode)' if quick else ''}. Every figure "
        "is compared with a baseline measured in the same run.",
        "",
    ]
    failed = False
    for name in SECTIONS:
        if only and name.split(".")[-1] not in only and name not in only:
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
        parts.append(section)
    out.write_text("\n".join(parts))
    print(f"bench: wrote {out}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
