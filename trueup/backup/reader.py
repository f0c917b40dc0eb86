"""Reading an archive safely: every member checked against the manifest while it streams.

Who uses this: `trueup.backup.analysis` (the whole-archive check) and the
restore engine (`open_component`, to read one verified entry). Nothing is
ever extracted to disk here; nothing outside the archive is touched.

```python
scan = scan_archive(path, keep=lambda name: name.startswith("config/"))
scan.problems        # [Problem(entry="config/applied.json", code="hash_mismatch", …)]
scan.kept["config/applied.json"]   # bytes, only for entries that verified
with open_component(path, "native/dhcp-leases/kea-leases4.csv") as stream:
    for chunk in iter(lambda: stream.read(65536), b""):
        staging.write(chunk)      # EntryCorrupt is raised at the end if the bytes were wrong
```

A member is refused (a `Problem` naming it) when it is not a regular file
(symlink, hard link, device, directory, fifo), when its name could escape
the extraction directory, when the manifest does not declare it or it
appears twice, when its size or sha256 differ from the manifest, or when the
archive ends inside it (that entry's problem, not the whole archive's: a copy
cut short inside the lease member, the last, still restores config). A
manifest entry never seen is `entry_missing`. An archive that ends between
members (or inside a header) is `truncated` for the entries it lacks and their
components; one lacking only the tar end-of-archive marker is `truncated` for
the whole archive.

Why this module is over 400 lines: the whole-archive scan and the reading of
one verified entry share every check (names, kinds, sizes, hashes, where a
copy ends), and the checks are only trustworthy if both use the same code.
"""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TypedDict

from trueup.backup.format import (
    MANIFEST,
    MANIFEST_MAX_BYTES,
    Entry,
    Manifest,
    ManifestError,
    component_of,
    unsafe_name,
)

__all__ = [
    "ARCHIVE",
    "ArchiveError",
    "EntryCorrupt",
    "Problem",
    "ProblemJSON",
    "Scan",
    "VerifiedStream",
    "open_component",
    "read_manifest",
    "scan_archive",
]

ARCHIVE = "(archive)"
_CHUNK = 1024 * 1024
_KEEP_MAX = 16 * 1024 * 1024


class ProblemJSON(TypedDict):
    """A problem as the analysis and a refused restore report it."""

    entry: str
    component: str | None
    code: str
    message: str


@dataclass(frozen=True)
class Problem:
    """One thing wrong, naming the entry it concerns (`manifest.json` or `(archive)` for the whole).

    `component` is None when the problem concerns the whole archive (every
    mode is refused). `code` is stable (docs/backup-restore.md lists them).
    """

    entry: str
    code: str
    message: str
    component: str | None = None

    def to_json(self) -> ProblemJSON:
        return {
            "entry": self.entry,
            "component": self.component,
            "code": self.code,
            "message": self.message,
        }

    def __str__(self) -> str:
        return f"{self.entry}: {self.message} [{self.code}]"


class ArchiveError(ValueError):
    """The archive cannot be read at all (no manifest, not a tar, newer format)."""

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        super().__init__(str(problem))


class EntryCorrupt(ArchiveError):
    """An entry's bytes do not match the manifest (raised at the end of the stream)."""


@dataclass
class Scan:
    manifest: Manifest | None
    problems: list[Problem] = field(default_factory=list)
    kept: dict[str, bytes] = field(default_factory=dict)
    seen: list[str] = field(default_factory=list)


def _member_kind(member: tarfile.TarInfo) -> str | None:
    if member.isreg():
        return None
    if member.issym():
        return f"a symbolic link (to {member.linkname!r})"
    if member.islnk():
        return f"a hard link (to {member.linkname!r})"
    if member.isdev():
        return "a device or fifo"
    if member.isdir():
        return "a directory"
    return f"not a regular file (type {member.type!r})"


def _open_tar(path: Path) -> tarfile.TarFile:
    try:
        return tarfile.open(path, mode="r:")
    except FileNotFoundError:
        raise ArchiveError(Problem(ARCHIVE, "unreadable", f"{path}: no such file")) from None
    except (tarfile.TarError, OSError) as exc:
        raise ArchiveError(
            Problem(ARCHIVE, "unreadable", f"{path}: not an uncompressed tar archive ({exc})")
        ) from None


def _read_manifest(tar: tarfile.TarFile) -> Manifest:
    try:
        first = tar.next()
    except tarfile.TarError as exc:
        raise ArchiveError(
            Problem(ARCHIVE, "unreadable", f"first member unreadable: {exc}")
        ) from None
    if first is None or first.name != MANIFEST:
        name = "no member" if first is None else f"{first.name!r}"
        raise ArchiveError(
            Problem(
                MANIFEST,
                "manifest_missing",
                f"manifest.json is not the archive's first member (found {name}): "
                "not a trueup backup, or altered",
            )
        )
    if not first.isreg() or first.size > MANIFEST_MAX_BYTES:
        raise ArchiveError(Problem(MANIFEST, "manifest_invalid", "not a regular file of sane size"))
    handle = tar.extractfile(first)
    assert handle is not None
    try:
        data = json.loads(handle.read())
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ArchiveError(Problem(MANIFEST, "truncated", f"unreadable: {exc}")) from None
    except ValueError as exc:
        raise ArchiveError(Problem(MANIFEST, "manifest_invalid", f"not JSON: {exc}")) from None
    try:
        return Manifest.from_json(data)
    except ManifestError as exc:
        code = "format_newer" if "newer trueup" in str(exc) else "manifest_invalid"
        raise ArchiveError(
            Problem(MANIFEST, code, str(exc).removeprefix("manifest.json: "))
        ) from None


def read_manifest(path: Path | str) -> Manifest:
    """The archive's manifest (checked); `ArchiveError` when there is none to trust."""
    with _open_tar(Path(path)) as tar:
        return _read_manifest(tar)


def _hash_member(
    tar: tarfile.TarFile, member: tarfile.TarInfo, keep: bool
) -> tuple[str, int, bytes | None]:
    handle = tar.extractfile(member)
    assert handle is not None
    digest = hashlib.sha256()
    size = 0
    kept: list[bytes] | None = [] if keep and member.size <= _KEEP_MAX else None
    while chunk := handle.read(_CHUNK):
        digest.update(chunk)
        size += len(chunk)
        if kept is not None:
            kept.append(chunk)
    return digest.hexdigest(), size, (b"".join(kept) if kept is not None else None)


def _check_end(path: Path, offset: int) -> Problem | None:
    """The tar end-of-archive marker (two zero blocks) must follow the last member."""
    with open(path, "rb") as handle:
        handle.seek(offset)
        end = handle.read(1024)
    if len(end) < 1024:
        return Problem(
            ARCHIVE,
            "truncated",
            f"the archive ends at byte {os.path.getsize(path)} before its end-of-archive marker "
            "(truncated copy?)",
        )
    if end.strip(b"\0"):
        return Problem(
            ARCHIVE,
            "corrupt",
            f"unreadable member header at byte {offset} (a damaged header; the members after it "
            "cannot be trusted)",
        )
    return None


def scan_archive(path: Path | str, keep: Callable[[str], bool] = lambda _: False) -> Scan:
    """Check every member against the manifest, streaming; the problems found.

    `keep(name)` selects entries whose bytes are returned in `Scan.kept`
    (only when they verified; at most 16 MiB each). Raises `ArchiveError`
    when there is no manifest to check against (nothing else can be said).
    """
    path = Path(path)
    tar = _open_tar(path)
    with tar:
        manifest = _read_manifest(tar)
        scan = Scan(manifest)
        declared = {entry.path: entry for entry in manifest.entries}
        named: set[str] = set()
        while True:
            try:
                member = tar.next()
            except tarfile.TarError as exc:
                scan.problems.append(
                    Problem(ARCHIVE, "corrupt", f"unreadable member header: {exc}")
                )
                break
            if member is None:
                problem = _check_end(path, tar.offset)
                missing = [e for e in manifest.entries if e.path not in scan.seen]
                if problem is not None and problem.code == "truncated" and missing:
                    # Cut short between entries (or inside a header): what it holds verified
                    # whole; the truncation is the missing entries' and their components'.
                    scan.problems.extend(
                        Problem(e.path, "truncated", f"{problem.message}; this entry is not "
                                "in it", e.component)
                        for e in missing
                    )  # fmt: skip
                    named.update(e.path for e in missing)  # named once, as truncated
                elif problem is not None:
                    scan.problems.append(problem)
                break
            found = _check_member(tar, member, declared, scan, keep)
            scan.problems.extend(found)
            if any(p.code == "truncated" and p.component is not None for p in found):
                # The archive ends inside this (declared) entry: the problem is the entry's
                # and its component's, and every entry declared after it is missing. The
                # entries before it verified whole, so they stay usable (a transfer cut
                # short inside the lease member, always the last, still restores config).
                break
    for entry in manifest.entries:
        if entry.path not in scan.seen and entry.path not in named:
            scan.problems.append(
                Problem(
                    entry.path,
                    "entry_missing",
                    "declared in the manifest but not in the archive",
                    entry.component,
                )
            )
    return scan


def _check_member(
    tar: tarfile.TarFile,
    member: tarfile.TarInfo,
    declared: dict[str, Entry],
    scan: Scan,
    keep: Callable[[str], bool],
) -> list[Problem]:
    name = member.name
    why = unsafe_name(name)
    if why is not None:
        return [Problem(name, "unsafe_path", why)]
    kind = _member_kind(member)
    if kind is not None:
        return [
            Problem(name, "not_regular_file", f"{kind}: refused, archives hold regular files only")
        ]
    entry = declared.get(name)
    if entry is None:
        return [
            Problem(
                name, "entry_not_in_manifest", "in the archive but not declared in the manifest"
            )
        ]
    if name in scan.seen:
        return [Problem(name, "duplicate_entry", "appears twice in the archive", entry.component)]
    scan.seen.append(name)
    try:
        sha, size, data = _hash_member(tar, member, keep(name))
    except (tarfile.TarError, OSError, EOFError) as exc:
        return [
            Problem(
                name, "truncated", f"the archive ends inside this entry ({exc})", entry.component
            )
        ]
    if size != entry.size:
        return [
            Problem(
                name,
                "size_mismatch",
                f"{size} bytes, the manifest says {entry.size}",
                entry.component,
            )
        ]
    if sha != entry.sha256:
        return [
            Problem(
                name,
                "hash_mismatch",
                f"sha256 {sha[:16]}…, the manifest says {entry.sha256[:16]}… (altered or damaged)",
                entry.component,
            )
        ]
    if data is not None:
        scan.kept[name] = data
    return []


class VerifiedStream:
    """A binary stream over one entry's bytes; `EntryCorrupt` at EOF when they are not the manifest's.

    Act on the bytes only after reading to EOF without an exception (stage
    them, then use the staged copy).
    """

    def __init__(self, handle: IO[bytes], entry: Entry) -> None:
        self._handle = handle
        self.entry = entry
        self._digest = hashlib.sha256()
        self._size = 0
        self._done = False

    def read(self, size: int = -1) -> bytes:
        try:
            chunk = self._handle.read(size)
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise EntryCorrupt(
                Problem(self.entry.path, "truncated", f"the archive ends inside this entry ({exc})")
            ) from None
        self._digest.update(chunk)
        self._size += len(chunk)
        if (not chunk or size < 0) and not self._done:
            self._done = True
            self._verify()
        return chunk

    def _verify(self) -> None:
        if self._size != self.entry.size or self._digest.hexdigest() != self.entry.sha256:
            raise EntryCorrupt(
                Problem(
                    self.entry.path,
                    "hash_mismatch",
                    f"{self._size} bytes with sha256 {self._digest.hexdigest()[:16]}…; the manifest "
                    f"says {self.entry.size} bytes, {self.entry.sha256[:16]}…",
                    self.entry.component,
                )
            )


@contextmanager
def open_component(path: Path | str, entry: str) -> Iterator[VerifiedStream]:
    """Stream one entry's bytes, verified against the manifest (see `VerifiedStream`).

    Raises `ArchiveError` when the archive has no trustworthy manifest or
    does not declare or hold `entry`, or holds it as anything but a regular file.
    """
    tar = _open_tar(Path(path))
    with tar:
        manifest = _read_manifest(tar)
        declared = manifest.entry(entry)
        if declared is None:
            raise ArchiveError(
                Problem(
                    entry,
                    "entry_not_in_manifest",
                    "not declared in the manifest",
                    component_of(entry),
                )
            )
        while True:
            try:
                member = tar.next()
            except tarfile.TarError as exc:
                raise ArchiveError(
                    Problem(ARCHIVE, "corrupt", f"unreadable header: {exc}")
                ) from None
            if member is None:
                raise ArchiveError(
                    Problem(
                        entry, "entry_missing", "declared in the manifest but not in the archive"
                    )
                )
            if member.name != entry:
                continue
            if not member.isreg():
                raise ArchiveError(Problem(entry, "not_regular_file", "not a regular file"))
            handle = tar.extractfile(member)
            assert handle is not None
            yield VerifiedStream(handle, declared)
            return
