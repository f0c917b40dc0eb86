"""Shared helpers for trueup's benchmarks: namespaces, timing, statistics."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


def sh(
    *argv: str, check: bool = True, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, input=input)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {proc.stderr}")
    return proc


@contextmanager
def namespace(tag: str, links: tuple[str, ...] = ("lan0",)) -> Iterator[str]:
    """A namespace with veth links (peers up), IPv6 DAD off; removed by name afterwards."""
    name = f"tu-bench-{os.getpid()}-{tag}"
    sh("ip", "netns", "add", name)
    try:
        sh("ip", "-n", name, "link", "set", "lo", "up")
        sh(
            "ip",
            "netns",
            "exec",
            name,
            "sysctl",
            "-qw",
            "net.ipv6.conf.all.accept_dad=0",
            "net.ipv6.conf.default.accept_dad=0",
        )
        for link in links:
            sh("ip", "-n", name, "link", "add", link, "type", "veth", "peer", "name", f"{link}p")
            sh("ip", "-n", name, "link", "set", f"{link}p", "up")
        yield name
    finally:
        sh("ip", "netns", "del", name, check=False)


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(pct / 100 * (len(ordered) - 1))))
    return ordered[index]


def median(values: list[float]) -> float:
    return statistics.median(values)


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}
