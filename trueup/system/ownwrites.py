"""Which of trueup's own writes is under way in this process: "trueup heal TXN", …

Who calls this: the engine names each transaction while it writes
(`writing("trueup apply 20261202T…-ab12cd")`, also recovery's rollback), and
the event source (`trueup.system.events`) asks, for a notification sent from
one of this process's own netlink sockets (`trueup.system.rtnl.is_own_port`),
which write sent it (`writer_at`). A drift record's attribution then reads
"trueup heal TXN", never "unknown".

Notifications are read on the event source's thread a little after the
write; a write is still named for `GRACE` seconds after it ended. Only one
transaction writes at a time (the writer lock), so the most recent write that
covers the notification's time is the one.

Standard library only.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

__all__ = ["GRACE", "OUTSIDE", "writer_at", "writing"]

GRACE = 5.0
# An own write no named transaction was making (the fast boot's management, a console fix).
OUTSIDE = "trueup (this agent, outside a transaction)"


@dataclass
class _Write:
    label: str
    started: float  # wall-clock seconds
    ended: float | None = None  # None while it runs


_LOCK = threading.Lock()
_WRITES: deque[_Write] = deque(maxlen=64)  # oldest first


@contextmanager
def writing(label: str) -> Iterator[None]:
    """Name the writes this process makes until the block ends."""
    entry = _Write(label, time.time())
    with _LOCK:
        _WRITES.append(entry)
    try:
        yield
    finally:
        with _LOCK:
            entry.ended = time.time()


def writer_at(when: float) -> str | None:
    """The own write under way at `when` (or ended at most `GRACE` before it); None: none."""
    with _LOCK:
        for write in reversed(_WRITES):
            if write.started <= when and (write.ended is None or when <= write.ended + GRACE):
                return write.label
    return None
