"""systemd's notify protocol (sd_notify): READY=1, STATUS=…, WATCHDOG=1.

Sends datagrams to `$NOTIFY_SOCKET` when set (an abstract socket when the
path starts with '@'); a no-op otherwise.
"""

from __future__ import annotations

import os
import socket

__all__ = ["Notifier", "watchdog_interval"]


class Notifier:
    def __init__(self, address: str | None = None) -> None:
        self.address = address if address is not None else os.environ.get("NOTIFY_SOCKET")
        self.sent: list[str] = []

    def send(self, *lines: str) -> bool:
        if not self.address:
            return False
        target = self.address
        if target.startswith("@"):
            target = "\0" + target[1:]
        message = "\n".join(lines)
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.connect(target)
                sock.sendall(message.encode())
        except OSError:
            return False
        self.sent.append(message)
        return True


def watchdog_interval() -> float | None:
    """Half of systemd's WatchdogSec, in seconds, when the watchdog is on for this process."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid.isdigit() and int(pid) != os.getpid()):
        return None
    try:
        return max(0.05, int(usec) / 2_000_000)
    except ValueError:
        return None
