"""Durable fences: a record that keeps a service from acting until the work it protects is done.

A fence is `STATE_DIR/fences/SUBSYSTEM.json` — owner, reason, since —
written atomically (temp file, fsync, rename, fsync of the directory) *before*
the work it protects, and removed only by the step that completes that work
(or an operator's explicit, audited `trueup dhcp fence lift`). It survives
agent restarts and reboots because it is a file, not a flag in memory.

Who uses this: the DHCP subsystem (while `dhcp` is fenced Kea hands out no
lease), status (a fenced subsystem shows `fenced` with owner and reason), and
the CLI that holds and lifts fences.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TypedDict

from trueup.system.atomicfile import fsync_dir, path_error, write_atomic
from trueup.system.safefile import UnsafeFile, ensure_dir, read_file, unsafe_entry

__all__ = [
    "Fence",
    "FenceJSON",
    "fence_path",
    "hold_fence",
    "lift_fence",
    "read_fence",
    "read_fences",
]

_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")


class FenceJSON(TypedDict):
    """A fence record as the file, status and the agent API hold it."""

    subsystem: str
    owner: str
    reason: str
    since: str


@dataclass(frozen=True)
class Fence:
    subsystem: str
    owner: str
    reason: str
    since: str  # ISO 8601, UTC

    def to_json(self) -> FenceJSON:
        return FenceJSON(
            subsystem=self.subsystem, owner=self.owner, reason=self.reason, since=self.since
        )


def fence_path(state_dir: Path, subsystem: str) -> Path:
    if not _NAME.match(subsystem):
        raise ValueError(f"{subsystem!r} is not a subsystem name")
    return Path(state_dir) / "fences" / f"{subsystem}.json"


def read_fence(state_dir: Path, subsystem: str) -> Fence | None:
    """The fence on `subsystem`, or None. An unreadable record counts as held (fail closed)."""
    path = fence_path(state_dir, subsystem)
    try:
        # Never through a link (trueup.system.safefile); anything but a regular
        # file of ours reads as unreadable: the fence counts as held.
        text = read_file(path, 1 << 16)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return Fence(subsystem, "unknown", f"fence record unreadable: {exc}", "")
    try:
        data = json.loads(text)
        return Fence(subsystem, str(data["owner"]), str(data["reason"]), str(data["since"]))
    except (ValueError, KeyError, TypeError):
        return Fence(subsystem, "unknown", f"fence record damaged: {path}", "")


def read_fences(state_dir: Path) -> list[Fence]:
    directory = Path(state_dir) / "fences"
    if not directory.is_dir():
        return []
    out = []
    for path in sorted(directory.glob("*.json")):
        with contextlib.suppress(ValueError):
            fence = read_fence(state_dir, path.stem)
            if fence is not None:
                out.append(fence)
    return out


def hold_fence(state_dir: Path, subsystem: str, owner: str, reason: str) -> Fence:
    """Write the fence (durably) and return it; holding a held fence keeps its `since`."""
    existing = read_fence(state_dir, subsystem)
    since = (
        existing.since
        if existing is not None and existing.since
        else datetime.now(UTC).isoformat(timespec="seconds")
    )
    fence = Fence(subsystem, owner, reason, since)
    path = fence_path(state_dir, subsystem)
    try:
        ensure_dir(path.parent)
    except UnsafeFile:
        raise
    except OSError as exc:
        raise path_error(path.parent, exc) from exc
    write_atomic(path, (json.dumps(fence.to_json(), sort_keys=True) + "\n").encode(), 0o600)
    return fence


def lift_fence(state_dir: Path, subsystem: str) -> Fence | None:
    """Remove the fence durably; the fence that was held, or None."""
    existing = read_fence(state_dir, subsystem)
    path = fence_path(state_dir, subsystem)
    problem = unsafe_entry(path.parent, directory=True)
    if problem is not None:
        raise UnsafeFile(path.parent, problem)
    try:
        path.unlink()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise path_error(path, exc) from exc
    fsync_dir(path.parent)
    return existing
