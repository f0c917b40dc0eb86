"""The system a subsystem sees: a small bundle of sources, one per transport.

A subsystem's `observe(sources, scope)` and `execute(sources, step)` receive a
`Sources`: `netlink` (links, addresses, routes), `files` (configuration files
and `/proc/sys`), `runner` (external programs: `nft`, `keactrl`, …),
`announcer` (gratuitous ARP / unsolicited neighbour advertisements), `nft`
(nftables: `trueup.system.nft`), `daemons` (the agent's daemon supervisor,
`trueup.system.daemon`: Kea, Knot, … run and supervised in the agent's
namespace) and `state_dir` (the agent's state directory; daemons keep their
private files under `daemons.run_dir(NAME)` = `STATE_DIR/run/NAME`, and durable
records such as fences go in `state_dir` itself). Every read and write of a
daemon's run directory goes through `files` too (`read_private`,
`write_private`, `make_private_dir`, …: 0600 files in 0700 directories, never through a link);
`trueup.subsystems.daemonkit` is how daemon-backed subsystems use it. A
subsystem uses only what it needs, and unit tests hand it fakes
(`trueup.system.fake`).

Who opens one: `trueup.reconcile.engine.Engine.sources()`, for one
observation or one transaction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from trueup.model.jsontypes import JSONObject
from trueup.system.announce import Announcer, KernelAnnouncer
from trueup.system.atomicfile import path_error, write_atomic
from trueup.system.daemon import DaemonSupervisor
from trueup.system.daemonspec import Daemons
from trueup.system.netlink import Netlink
from trueup.system.nft import HostNftables, Nftables
from trueup.system.runner import Runner, SubprocessRunner
from trueup.system.safefile import ensure_dir, read_file

__all__ = ["Files", "HostFiles", "Memo", "Sources"]

# Answers a daemon confirmed within one piece of work (`Sources.memo`): key → (the
# daemon's pid, its answer, in the daemon's own JSON).
Memo = dict[str, tuple[int, JSONObject]]

# = trueup.journal.state.DEFAULT_STATE_DIR (system/ imports no layer above it).
_DEFAULT_STATE_DIR = "/var/lib/trueup"


class Files(Protocol):
    """Reading and writing small text files (configuration, `/proc/sys`)."""

    def read(self, path: str) -> str | None:
        """The file's text, or None when it does not exist."""
        ...

    def write(self, path: str, text: str) -> None:
        """Replace the file's content; raises OSError naming the path on failure."""
        ...

    def remove(self, path: str) -> None:
        """Remove the file; one already gone counts as removed."""
        ...

    # Files of the agent's own: the state directory and the daemons' run directories.
    # Never opened through a link, never another user's (`trueup.system.safefile`).

    def read_private(self, path: Path) -> bytes:
        """The file's bytes; FileNotFoundError when absent, `UnsafeFile` when it is not ours."""
        ...

    def write_private(self, path: Path, data: bytes, *, durable: bool = True) -> None:
        """Replace the file atomically, 0600, in a 0700 directory of ours (made if needed);
        `durable=False` for a cache whose loss is harmless (no fsync)."""
        ...

    def remove_private(self, path: Path) -> None:
        """Remove the file; one already gone counts as removed."""
        ...

    def replace_private(self, source: Path, target: Path) -> None:
        """Rename `source` over `target` (a candidate that passed its check)."""
        ...

    def make_private_dir(self, path: Path) -> None:
        """Make `path` (and its parents) a 0700 directory of ours if it is not one yet;
        `UnsafeFile` when something else is there."""
        ...


@dataclass
class HostFiles:
    """The machine's files. Regular files are replaced atomically; procfs is written in place."""

    root: Path = Path("/")

    def _path(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def read(self, path: str) -> str | None:
        try:
            return self._path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            return None

    def write(self, path: str, text: str) -> None:
        target = self._path(path)
        if str(target).startswith(("/proc/", "/sys/")):
            # Kernel files cannot be renamed over; one write is the update.
            try:
                with target.open("w", encoding="utf-8") as handle:
                    handle.write(text)
            except OSError as exc:
                raise path_error(target, exc) from exc
            return
        try:
            mode = target.stat().st_mode & 0o7777
        except FileNotFoundError:
            mode = 0o644
        write_atomic(target, text.encode(), mode)

    def remove(self, path: str) -> None:
        target = self._path(path)
        try:
            target.unlink()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise path_error(target, exc) from exc

    # The agent's own files are where the state directory says (`root` is not applied).

    def read_private(self, path: Path) -> bytes:
        return read_file(path)

    def write_private(self, path: Path, data: bytes, *, durable: bool = True) -> None:
        ensure_dir(path.parent)
        write_atomic(path, data, 0o600, durable=durable)

    def remove_private(self, path: Path) -> None:
        path.unlink(missing_ok=True)

    def replace_private(self, source: Path, target: Path) -> None:
        source.replace(target)

    def make_private_dir(self, path: Path) -> None:
        ensure_dir(path)


@dataclass
class Sources:
    """What a subsystem may observe and change, for one piece of work."""

    netlink: Netlink
    files: Files = field(default_factory=HostFiles)
    runner: Runner = field(default_factory=SubprocessRunner)
    announcer: Announcer = field(default_factory=KernelAnnouncer)
    nft: Nftables = field(default_factory=HostNftables)
    # The agent's state directory (durable records: fences, …).
    state_dir: Path = Path(_DEFAULT_STATE_DIR)
    # The daemon supervisor. The agent passes its own (`Engine.daemons`), which lives as
    # long as the agent so that supervision outlives any one transaction.
    daemons: Daemons = field(
        default_factory=lambda: DaemonSupervisor(Path(_DEFAULT_STATE_DIR) / "run")
    )
    # Answers a subsystem may reuse within this piece of work (one observation or one
    # transaction, whose workers share it): what a daemon confirmed it holds, keyed by
    # the subsystem and the daemon's pid. The subsystem drops its entry whenever it
    # changes the daemon; a new piece of work starts empty, so every pass of the
    # reconcile loop asks the daemon again and drift is never hidden by it.
    memo: Memo = field(default_factory=dict)

    def close(self) -> None:
        self.netlink.close()
