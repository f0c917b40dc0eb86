"""The sd_notify seam against a fake NOTIFY_SOCKET."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from trueup.system.notify import Notifier, watchdog_interval


def test_messages_reach_the_socket(tmp_path: Path) -> None:
    path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        notifier = Notifier(str(path))
        assert notifier.send("READY=1", "STATUS=management ready")
        assert sock.recv(1024) == b"READY=1\nSTATUS=management ready"


def test_disabled_without_socket() -> None:
    assert Notifier("").send("READY=1") is False


def test_watchdog_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "2000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    assert watchdog_interval() == 1.0
    monkeypatch.setenv("WATCHDOG_PID", "1")
    assert watchdog_interval() is None
