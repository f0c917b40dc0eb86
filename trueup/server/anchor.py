"""The audit chain's anchor outside the database: a signed checkpoint file.

The file lives in the server's data directory, by default the key file's own
(`<key file name>.audit-checkpoint`, 0600), and holds, per chain, the newest (seq, row hash, time) a server process
saw committed, with an HMAC under a key derived from the server key. Someone
with write access to the database but not to the key's directory can delete
the newest audit rows and rewind `audit_head`, but cannot move this file back:
a database head behind the checkpoint, or a row at the checkpoint's seq with
another hash, is a rewound chain.

A chain is named by the hash of its first row (unique per database: the HMAC
covers the row's time), so one key file may anchor several databases.

Writers advance the checkpoint after their transaction committed, never
before, so the file is never ahead of what is stored. `advance` takes an
exclusive `flock` on `<file>.lock`, re-reads the file, lets the caller check
that the stored checkpoint is an ancestor of the new head (in the database),
and replaces the file atomically (write, fsync, rename, fsync the directory):
it is monotonic and safe with any number of server processes on one host.
This module is file handling only; what is checked against the database is
trueup.server.audit.
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SUFFIX", "Checkpoint", "CheckpointError", "CheckpointFile"]

SUFFIX = ".audit-checkpoint"
_FORMAT = "trueup-audit-checkpoint/1"


class CheckpointError(Exception):
    """The checkpoint file exists but cannot be trusted (unreadable, or a bad MAC)."""


@dataclass(frozen=True)
class Checkpoint:
    chain: str  # the hash of the chain's first row
    seq: int
    row_hash: str
    at: float


class CheckpointFile:
    def __init__(self, path: Path, mac_key: bytes) -> None:
        self.path = path
        self._key = mac_key

    def _mac(self, cp: Checkpoint) -> str:
        body = json.dumps([_FORMAT, cp.chain, cp.seq, cp.row_hash, repr(float(cp.at))])
        return hmac.new(self._key, body.encode(), hashlib.sha256).hexdigest()

    def read(self) -> dict[str, Checkpoint]:
        """Every chain's checkpoint; {} when there is no file. Raises CheckpointError."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise CheckpointError(f"{self.path}: {exc}") from None
        try:
            data = json.loads(text)
            if data.get("format") != _FORMAT:
                raise ValueError("unknown format")
            out: dict[str, Checkpoint] = {}
            for chain, entry in data["chains"].items():
                cp = Checkpoint(
                    str(chain), int(entry["seq"]), str(entry["row_hash"]), float(entry["at"])
                )
                if not hmac.compare_digest(self._mac(cp), str(entry["mac"])):
                    raise CheckpointError(
                        f"{self.path}: checkpoint of chain {chain[:12]}… does not authenticate "
                        "under this server key (edited, or written with another key)"
                    )
                out[cp.chain] = cp
            return out
        except CheckpointError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(f"{self.path}: not a trueup checkpoint file ({exc})") from None

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path.with_name(self.path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _write(self, chains: dict[str, Checkpoint]) -> None:
        data = {
            "format": _FORMAT,
            "chains": {
                c.chain: {"seq": c.seq, "row_hash": c.row_hash, "at": c.at, "mac": self._mac(c)}
                for c in chains.values()
            },
        }
        tmp = self.path.with_name(f"{self.path.name}.tmp{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def advance(
        self, chain: str, step: Callable[[Checkpoint | None], Checkpoint | None]
    ) -> Checkpoint | None:
        """Replace the chain's checkpoint with `step(current)` unless that is None or not newer.

        `step` runs under the lock; it returns None to keep the current
        checkpoint (for example when the database no longer contains it).
        Returns the checkpoint written, or None. Raises CheckpointError.
        """
        with self._locked():
            chains = self.read()
            current = chains.get(chain)
            new = step(current)
            if new is None or (current is not None and new.seq <= current.seq):
                return None
            chains[chain] = new
            self._write(chains)
            return new

    def replace(self, checkpoint: Checkpoint) -> None:
        """Set the chain's checkpoint unconditionally (an operator re-anchoring a restored database)."""
        with self._locked():
            try:
                chains = self.read()
            except CheckpointError:
                chains = {}
            chains[checkpoint.chain] = checkpoint
            self._write(chains)
