"""The restore record: `STATE_DIR/restore/restore.json`, one file, written atomically, with history.

Who uses this: the restore state machine (`trueup.backup.restore`), which
writes it at every transition, and status (`trueup status`, `GET
/v1/restore`), which reads it. It lives in the journal layer because it is a
write-ahead record: each state is written (temp file, fsync, rename, fsync
of the directory) *before* the work of that state starts, so a SIGKILL, a
restart or a reboot finds the restore where it was.

The record holds the boot ID (`/proc/sys/kernel/random/boot_id`; the path
is overridable with `TRUEUP_BOOT_ID_FILE` so tests can simulate a reboot)
of every write, so a resume within the same boot and a resume after a reboot
are told apart and written into the history.
"""

from __future__ import annotations

import contextlib
import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import NotRequired, TypedDict, cast

from trueup.system.atomicfile import path_error, write_atomic
from trueup.system.safefile import UnsafeFile, ensure_dir, read_file

__all__ = [
    "PENDING",
    "STATES",
    "TERMINAL",
    "LeaseProgress",
    "RestoreRecord",
    "RestoreRetry",
    "RestoreStatus",
    "RestoreStep",
    "RestoreWaiting",
    "boot_id",
    "next_step",
    "read_record",
    "record_path",
    "restore_status",
    "write_record",
]

STATES = (
    "analyzed",
    "fenced",
    "staged",
    "awaiting_restart",
    "applying",
    "verifying",
    "completed",
    "rolled_back",
)
TERMINAL = ("completed", "rolled_back")
PENDING = tuple(s for s in STATES if s not in TERMINAL)
BOOT_ID_ENV = "TRUEUP_BOOT_ID_FILE"
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
_HISTORY = 64


class RestoreStep(TypedDict, total=False):
    """One line of the record's `history`: a state entered (or resumed), when, by which boot."""

    state: str
    at: str
    boot_id: str
    pid: int
    note: str


# `for` is a keyword: the functional form names it.
RestoreWaiting = TypedDict(
    "RestoreWaiting",
    {"for": str, "since": str, "boot_id": str, "links": list[str], "seconds": float},
    total=False,
)
RestoreWaiting.__doc__ = "What a pending restore waits for (`for`: links), since when, how long."


class RestoreRetry(TypedDict):
    """The agent's next retry of a pending restore."""

    attempts: int
    next_at: str


class RestoreRevision(TypedDict, total=False):
    """A revision the restore names: the previous one, or the one it applied (with its txn)."""

    version: int | None
    digest: str | None
    txn: str | None


class ArchiveRevision(TypedDict, total=False):
    """The archive's applied revision (its manifest's `revision`)."""

    version: int
    digest: str | None
    origin: str | None
    cp_version: int | None


class LeaseProgress(TypedDict, total=False):
    """How far a lease file's replacement went: the dated copies, replaced, its sha256."""

    previous: list[str]
    replaced: bool
    sha256: str


class RestoreRecord(TypedDict, total=False):
    """`restore/restore.json`: the restore, its state and history (state `damaged` when the file
    cannot be read: `problem` says why)."""

    id: str
    archive: str
    archive_sha256: str
    mode: str
    mappings: dict[str, str]
    reboot: bool
    actor: str
    device: str
    revision: ArchiveRevision
    previous: RestoreRevision
    state: str
    since: str
    boot_id: str
    history: list[RestoreStep]
    next: str
    problem: str
    fence_held: bool
    awaiting_boot_id: str
    staged: dict[str, str]  # archive entry → sha256
    leases: dict[str, LeaseProgress]  # archive entry → progress
    notes: list[str]
    waiting: RestoreWaiting
    retry: RestoreRetry
    applied: RestoreRevision


class RestoreStatus(TypedDict):
    """The `restore` section of `trueup status` (a key the record lacks is null)."""

    id: str | None
    state: str | None
    since: str | None
    mode: str | None
    archive: str | None
    reboot: bool | None
    problem: str | None
    next: str | None
    waiting: RestoreWaiting | None
    retry: RestoreRetry | None
    fence_held: bool | None
    pending: bool
    started_at: NotRequired[str]


def boot_id() -> str:
    """This boot's ID (the kernel's, or the file `TRUEUP_BOOT_ID_FILE` names)."""
    path = Path(os.environ.get(BOOT_ID_ENV) or _BOOT_ID)
    try:
        return path.read_text(encoding="ascii").strip()
    except OSError:
        return "unknown"


def record_path(state_dir: Path) -> Path:
    return Path(state_dir) / "restore" / "restore.json"


def read_record(state_dir: Path) -> RestoreRecord | None:
    """The restore record, or None. A damaged record is returned as state `damaged` (fail closed)."""
    path = record_path(state_dir)
    try:
        text = read_file(path).decode("utf-8", errors="replace")  # never through a link
    except FileNotFoundError:
        return None
    except UnsafeFile as exc:
        return {"state": "damaged", "problem": str(exc)}
    except OSError as exc:
        return {"state": "damaged", "problem": f"{path}: unreadable: {exc}"}
    try:
        record = json.loads(text)
    except ValueError:
        record = None
    if not isinstance(record, dict) or record.get("state") not in STATES:
        return {"state": "damaged", "problem": f"{path}: not a restore record"}
    return cast("RestoreRecord", record)


def write_record(
    state_dir: Path, record: RestoreRecord, state: str, note: str = "", *, transition: bool = True
) -> None:
    """Move `record` to `state` (appending to its history) and write it durably.

    `transition=False` writes progress within the state: no history line, `since` kept.
    """
    if state not in STATES:
        raise ValueError(f"{state!r} is not a restore state")
    now = datetime.now(UTC).isoformat(timespec="milliseconds")
    record["boot_id"] = boot_id()
    history = record.setdefault("history", [])
    if transition:
        record["state"] = state
        record["since"] = now
        history.append(
            {"state": state, "at": now, "boot_id": record["boot_id"], "pid": os.getpid()}
        )
        if note:
            history[-1]["note"] = note
        del history[:-_HISTORY]
    record["next"] = next_step(record)
    path = record_path(state_dir)
    try:
        ensure_dir(path.parent)
    except UnsafeFile:
        raise
    except OSError as exc:
        raise path_error(path.parent, exc) from exc
    write_atomic(path, (json.dumps(record, indent=1, sort_keys=True) + "\n").encode(), 0o600)


def next_step(record: RestoreRecord) -> str:
    """What happens next, in the operator's words."""
    step = _next_step(record)
    retry = record.get("retry")
    if record.get("state") in PENDING and isinstance(retry, dict) and retry.get("next_at"):
        step += (
            f" (the agent retries by itself at {retry['next_at']}, attempt "
            f"{int(retry.get('attempts', 0)) + 1})"
        )
    return step


def _next_step(record: RestoreRecord) -> str:
    state = record.get("state")
    mode = record.get("mode", "config-only")
    archive = record.get("archive", "?")
    resume = (
        f"the agent resumes it by itself (at start, and on its retry timer), or now: "
        f"trueup restore apply {archive} --mode {mode}"
    )
    waiting = record.get("waiting")
    if state in PENDING and isinstance(waiting, dict) and waiting.get("for") == "links":
        links = ", ".join(waiting.get("links") or [])
        return (
            f"waiting for links {links} (since {waiting.get('since')}): the restored revision "
            f"names them; it goes on within a second of them appearing, and gives up after "
            f"{float(waiting.get('seconds') or 0):g} s (rolled back, the dhcp fence lifted: "
            "nothing was applied). Create the link, or --map it to one that exists"
        )
    if state == "analyzed":
        return f"the dhcp allocator fence is taken next; {resume}"
    if state == "fenced":
        return f"the archive's components are copied into the state directory next; {resume}"
    if state == "staged":
        return f"the restore waits for a restart (if --reboot) or applies next; {resume}"
    if state == "awaiting_restart":
        if record.get("reboot"):
            return (
                "waiting for a reboot (boot ID "
                f"{str(record.get('awaiting_boot_id'))[:8]}… must change): reboot the router; "
                "the agent applies the restore at startup, after the management tier"
            )
        return f"applies next; {resume}"
    if state == "applying":
        leases = " (Kea stopped, leases replaced from the archive)" if mode == "full" else ""
        return f"the restored revision is being applied{leases}; {resume}"
    if state == "verifying":
        return f"the system is checked against the restored revision; {resume}"
    if state == "completed":
        return "nothing: the restore is complete and the dhcp fence is lifted"
    if state == "rolled_back":
        if record.get("fence_held"):
            return (
                "the system is not yet back at its previous revision, so the dhcp fence is held: "
                "check `trueup status`, then lift it when DHCP is right: trueup dhcp fence lift "
                f"--reason 'restore {record.get('id')} rolled back' (or run the restore again)"
            )
        return "nothing: the system is back at its previous revision; see `problem` for why"
    return "the restore record is damaged: keep it as evidence (`trueup evidence`), then move it"


def restore_status(state_dir: Path) -> RestoreStatus | None:
    """The `restore` section of `trueup status`: state, since, mode, archive, next, problem."""
    record = read_record(state_dir)
    if record is None:
        return None
    out: RestoreStatus = {
        "id": record.get("id"),
        "state": record.get("state"),
        "since": record.get("since"),
        "mode": record.get("mode"),
        "archive": record.get("archive"),
        "reboot": record.get("reboot"),
        "problem": record.get("problem"),
        "next": record.get("next"),
        "waiting": record.get("waiting"),
        "retry": record.get("retry"),
        "fence_held": record.get("fence_held"),
        "pending": record.get("state") not in TERMINAL,
    }
    with contextlib.suppress(KeyError, TypeError, IndexError):
        out["started_at"] = record["history"][0]["at"]
    return out
