"""`trueup backup create`: a consistent snapshot of the state directory into one archive.

Who uses this: the CLI (`trueup backup create --out FILE [--with-leases]`),
the benchmark and tests. Consistency: the agent's writer lock is held while
the applied record, the revisions, the audit excerpt and the zone files are
staged (every apply, rollback and reconcile pass takes the same lock), so
the archive never holds a revision set from the middle of an apply. When the
lock cannot be taken because the directory is read-only, the files are read
without it and the applied record is re-read at the end: a change in
between refuses the backup (try again).

Leases (`--with-leases`), per family whose Kea run directory exists: through
Kea's control socket when Kea answers (paged; Kea keeps running and keeps
allocating), else the stopped memfile files as they are. Kea is never
started, stopped or reconfigured. A family with no lease file at all is
archived as a zero-byte file: an empty source, proven.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path

from trueup import __version__
from trueup.backup.format import (
    AUDIT,
    CONFIG,
    DNS,
    LEASES,
    ComponentFacts,
    Manifest,
    section_generation,
)
from trueup.backup.leasecsv import csv_pages
from trueup.backup.secrets import secrets_in_clear
from trueup.backup.writer import ArchiveWriter
from trueup.journal.audit import now_iso
from trueup.journal.lock import LockBusy, LockError
from trueup.journal.state import StateDir
from trueup.model.digests import canonical_json
from trueup.model.jsontypes import JSONObject
from trueup.system.kea import kea_paths
from trueup.system.kealeases import KeaSocketError, lease_files, leases_from_memfile
from trueup.system.knot import knot_paths
from trueup.system.safefile import read_file

__all__ = ["AUDIT_EXCERPT_BYTES", "BackupError", "create_backup"]

AUDIT_EXCERPT_BYTES = 1024 * 1024


class BackupError(RuntimeError):
    """The backup cannot be made; the message names the file and what to do."""


@contextlib.contextmanager
def _consistent(state: StateDir, wait: float) -> Iterator[bool]:
    """Hold the writer lock (True), or nothing when the directory cannot be locked (False)."""
    try:
        lock = state.writer_lock("backup", wait)
        lock.__enter__()
    except LockBusy as exc:
        raise BackupError(f"{exc}; try again when it is done") from None
    except LockError:
        yield False
        return
    try:
        yield True
    finally:
        lock.__exit__(None, None, None)


def _read(path: Path) -> bytes:
    return read_file(path)  # never through a link: a host file never goes into an archive


def create_backup(
    state_dir: Path | str,
    out: Path | str,
    *,
    with_leases: bool = False,
    lock_wait: float = 30.0,
) -> Manifest:
    """Write the archive to `out` (atomically, 0600); its manifest. Raises `BackupError`."""
    state = StateDir(state_dir)
    if not state.exists():
        raise BackupError(f"{state.root}: not a trueup state directory (no state.json)")
    out = Path(out)
    _check_out(out)
    try:
        return _create(state, out, with_leases, lock_wait)
    except OSError as exc:
        raise BackupError(f"{out}: not written: {exc}") from exc


def _check_out(out: Path) -> None:
    """Refuse an --out the archive cannot be renamed to, naming the file and what to do."""
    parent = out.parent
    if out.is_dir():
        raise BackupError(
            f"{out}: is a directory; --out names the archive file, e.g. --out {out / 'edge-01.tar'}"
        )
    if not parent.is_dir():
        what = "is not a directory" if parent.exists() else "does not exist"
        raise BackupError(
            f"{out}: the directory {parent} {what}; create it (mkdir -p {parent}) "
            "or choose another --out; nothing was written"
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise BackupError(
            f"{out}: the directory {parent} is not writable (the archive is staged and renamed "
            "there); choose another --out; nothing was written"
        )


def _create(state: StateDir, out: Path, with_leases: bool, lock_wait: float) -> Manifest:
    with ArchiveWriter(out) as writer, _consistent(state, lock_wait) as locked:
        applied_raw = _read(state.root / "applied.json")
        applied = json.loads(applied_raw)
        version = int(applied.get("version") or 0)
        if not version:
            raise BackupError(f"{state.root}: nothing applied yet; there is nothing to back up")
        record = state.revision(version, applied.get("digest"))
        if record is None:
            raise BackupError(f"{state.root}: the applied revision {version} is missing")
        document: JSONObject = record["document"]
        digest = applied.get("digest")
        dhcp_gen = section_generation(document, "dhcp")
        dns_gen = section_generation(document, "dns")
        writer.add_bytes("config/applied.json", applied_raw, digest)
        count = 0
        for number in state.revision_versions():
            path = state.revision_file(number)
            data = _read(path)
            if number == version:
                data = json.dumps(record, sort_keys=True, indent=1).encode() + b"\n"
            revision = json.loads(data)
            for where, _what in secrets_in_clear(revision.get("document")):
                raise BackupError(
                    f"{path}: {where} holds a secret in clear; trueup archives only references"
                )
            writer.add_bytes(f"config/revisions/{number:08d}.json", data, digest)
            count += 1
        zones = knot_paths(state.root / "run" / "knot").zones
        for zone in sorted(zones.glob("*.zone")) if zones.is_dir() else []:
            writer.add_file(f"{DNS}/{zone.name}", zone, dns_gen)
        audit = _audit_excerpt(state, writer)
        if not locked and _read(state.root / "applied.json") != applied_raw:
            raise BackupError(f"{state.root}: an apply ran during the backup; run it again")
        # Leases last: the big part; their consistency is Kea's, not the lock's.
        leases = _stage_leases(state, writer, dhcp_gen) if with_leases else None
        components: dict[str, ComponentFacts] = {
            CONFIG: {
                "generation": digest,
                "dhcp_generation": dhcp_gen,
                "dns_generation": dns_gen,
                "revisions": count,
            },
            AUDIT: audit,
        }
        if zones.is_dir():
            components[DNS] = {"generation": dns_gen}
        if leases is not None:
            components[LEASES] = leases
        device = (document.get("metadata") or {}).get("device") or socket.gethostname()
        return writer.finish(
            device=str(device),
            revision={
                "version": version,
                "digest": digest,
                "origin": applied.get("origin"),
                "cp_version": applied.get("cp_version"),
            },
            components=components,
            created_at=now_iso(),
            agent_version=__version__,
        )


def _audit_excerpt(state: StateDir, writer: ArchiveWriter) -> ComponentFacts:
    """The log's tail (whole lines) and its proof: how it links to the anchor."""
    records = state.audit.tail(AUDIT_EXCERPT_BYTES)
    try:
        anchor = json.loads(_read(state.audit.head_path) or b"null")
    except (OSError, ValueError):
        anchor = None
    body = b"".join(canonical_json(r) + b"\n" for r in records)
    head = records[-1]["hash"] if records else None
    writer.add_bytes("audit/audit.jsonl", body, head or "")
    proof = {
        "first_seq": records[0]["seq"] if records else None,
        "first_prev": records[0]["prev"] if records else None,
        "last_seq": records[-1]["seq"] if records else None,
        "last_hash": head,
        "anchor": anchor,
    }
    writer.add_bytes("audit/proof.json", canonical_json(proof) + b"\n", head or "")
    return {"lines": len(records), "head": {"seq": proof["last_seq"], "hash": head}}


def _stage_leases(state: StateDir, writer: ArchiveWriter, generation: str) -> ComponentFacts:
    counts: dict[str, int] = {}
    sources: dict[str, str] = {}
    for family in (4, 6):
        run = state.root / "run" / f"kea-dhcp{family}"
        if not run.is_dir():
            continue
        paths = kea_paths(run, family)
        name = paths.leases.name
        if paths.socket.exists():
            counter = [0]
            try:
                writer.add_stream(
                    f"{LEASES}/{name}", csv_pages(family, paths.socket, counter), generation
                )
            except KeaSocketError:
                pass  # Kea is not answering: its memfile is the source
            else:
                counts[str(family)], sources[str(family)] = counter[0], "socket"
                continue
        files = lease_files(paths.leases)
        for path in files:
            writer.add_file(f"{LEASES}/{path.name}", path, generation)
        if not files:
            writer.add_bytes(f"{LEASES}/{name}", b"", generation)
        counts[str(family)] = sum(1 for _ in leases_from_memfile(family, paths.leases))
        sources[str(family)] = "memfile"
    return {"generation": generation, "counts": counts, "source": sources}
