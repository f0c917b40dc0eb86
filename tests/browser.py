"""Headless Debian Chromium for the dashboard tests, driven by Playwright.

Never a downloaded browser: `/usr/bin/chromium` (make deps installs it); a
missing Chromium or Playwright fails the test loudly. `in_netns` starts the
browser inside a network namespace (the namespace is per thread; the browser
process inherits it), so it reaches a control plane listening there.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
_CLONE_NEWNET = 0x40000000


def require_chromium() -> None:
    if not os.access(CHROMIUM, os.X_OK):
        raise AssertionError(f"{CHROMIUM} is required for the dashboard tests (make deps)")


@contextmanager
def in_netns(name: str | None) -> Iterator[None]:
    """Run the block with this thread in network namespace `name` (None: stay)."""
    if name is None:
        yield
        return
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    target = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(target, _CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {name}")
        try:
            yield
        finally:
            if libc.setns(home, _CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back home")
    finally:
        os.close(target)
        os.close(home)


@contextmanager
def chromium(netns: str | None = None) -> Iterator[Any]:
    """A headless Chromium browser (Playwright's Browser)."""
    require_chromium()
    from playwright.sync_api import sync_playwright

    with in_netns(netns):
        manager = sync_playwright()
        playwright = manager.start()
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
    try:
        yield browser
    finally:
        browser.close()
        playwright.stop()


def screenshot(page: Any, name: str) -> Path:
    """Save a full-page screenshot under test-artifacts/dashboard/ (a test artifact)."""
    out = ARTIFACTS / "dashboard" / f"{name}.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(out), full_page=True)
    return out
