"""Staging an archive's components, and a full restore's lease replacement.

Who calls this: the restore state machine (`trueup.backup.restore`) in its
`staged` and `applying` states. Both steps are idempotent, so a restore
killed in the middle of one runs it again from the start on resume:

* `stage_components` streams each entry through `open_component` (verified
  while it streams) into `STATE_DIR/restore/staged/`; a file is renamed into
  place only after its whole entry verified.
* `replace_leases` stops Kea through the daemon supervisor (never anything
  else), moves the files Kea loads aside as a dated copy (once: the record
  remembers it) and puts the staged lease file in place atomically. Kea is
  started again by the restore's transaction (the DHCP subsystem's `start`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from trueup.backup.reader import open_component
from trueup.journal.restore import RestoreRecord
from trueup.system.atomicfile import fsync_dir
from trueup.system.daemonspec import Daemons
from trueup.system.kealeases import lease_files
from trueup.system.safefile import ensure_dir, open_file

__all__ = ["file_sha256", "lease_family", "put_back_leases", "replace_leases", "stage_components"]

_CHUNK = 1 << 20


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for chunk in iter(lambda: stream.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _new_private(tmp: Path) -> BinaryIO:
    """A fresh 0600 temp file, never opened through a link (`trueup.system.safefile`)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # left by a crash; unlink never follows a link
    return os.fdopen(open_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL), "wb")


def _fsynced_copy(source: Path, target: Path) -> None:
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    with os.fdopen(open_file(source, os.O_RDONLY), "rb") as src, _new_private(tmp) as dst:
        shutil.copyfileobj(src, dst, _CHUNK)
        dst.flush()
        os.fsync(dst.fileno())
    os.chmod(tmp, 0o600)
    os.replace(tmp, target)
    fsync_dir(target.parent)


def stage_components(archive: Path, entries: list[str], staged: Path) -> dict[str, str]:
    """Copy `entries` of `archive` into `staged` (verified); entry path → sha256 of the copy."""
    out: dict[str, str] = {}
    for entry in entries:
        target = staged / entry
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        digest = hashlib.sha256()
        with open_component(archive, entry) as stream, _new_private(tmp) as out_file:
            for chunk in iter(lambda: stream.read(_CHUNK), b""):
                digest.update(chunk)
                out_file.write(chunk)
            out_file.flush()
            os.fsync(out_file.fileno())
        # Only here, after the loop: open_component raises at EOF when the bytes are wrong.
        os.chmod(tmp, 0o600)
        os.replace(tmp, target)
        fsync_dir(target.parent)
        out[entry] = digest.hexdigest()
    return out


def lease_family(entry: str) -> int:
    """4 or 6, from `native/dhcp-leases/kea-leasesN.csv`."""
    name = Path(entry).name
    return 6 if name.startswith("kea-leases6") else 4


def replace_leases(
    daemons: Daemons, staged: Path, record: RestoreRecord, save: Callable[[], None]
) -> list[str]:
    """Put the staged lease files in place with Kea stopped; what was done, in words.

    `record["leases"]` (entry → progress) is updated in place: the dated copy
    is made once, so a resume never overwrites the copy of the original file;
    `save` writes the record after each durable step.
    """
    done: list[str] = []
    progress = record.setdefault("leases", {})
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    for entry, staged_sha in sorted(record.get("staged", {}).items()):
        if not entry.startswith("native/dhcp-leases/"):
            continue
        family = lease_family(entry)
        name = f"kea-dhcp{family}"
        daemons.stop(name)
        done.append(f"{name} stopped")
        run = ensure_dir(daemons.run_dir(name))  # refused when not a directory of ours
        target = run / f"kea-leases{family}.csv"
        mine = progress.setdefault(entry, {})
        if mine.get("replaced"):
            continue
        if "previous" not in mine:
            copies = []
            for old in lease_files(target):
                copy = old.with_name(f"{old.name}.pre-restore-{stamp}")
                os.replace(old, copy)
                copies.append(str(copy))
            fsync_dir(run)
            mine["previous"] = copies
            save()
        else:  # resumed: what Kea may have written since goes away; the dated copy stays
            for old in lease_files(target):
                old.unlink()
        _fsynced_copy(staged / entry, target)
        mine["replaced"] = True
        mine["sha256"] = staged_sha
        save()
        kept = ", ".join(mine["previous"]) or "none existed"
        done.append(f"{target} replaced from the archive (previous: {kept})")
    return done


def put_back_leases(daemons: Daemons, record: RestoreRecord) -> list[str]:
    """Undo `replace_leases` (a rolled-back restore): the dated copies go back, Kea stopped."""
    done: list[str] = []
    for entry, mine in sorted(record.get("leases", {}).items()):
        if not mine.get("replaced"):
            continue
        family = lease_family(entry)
        name = f"kea-dhcp{family}"
        daemons.stop(name)
        target = daemons.run_dir(name) / f"kea-leases{family}.csv"
        for old in lease_files(target):
            old.unlink()
        for copy in mine.get("previous", []):
            source = Path(copy)
            original = source.with_name(source.name.split(".pre-restore-")[0])
            _fsynced_copy(source, original)
        mine["replaced"] = False
        done.append(f"{target}: the previous lease file is back")
    return done
