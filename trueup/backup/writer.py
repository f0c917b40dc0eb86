"""Building an archive: entries are staged (hashed on the way), then written manifest first.

Who uses this: `trueup.backup.create` (`trueup backup create`), tests and the
benchmark. Memory does not grow with the entries' sizes: every entry is
streamed into a staging file in a private directory beside the output while
its sha256 and size are computed, then the tar is written — `manifest.json`
first, the entries in the order they were added — and renamed into place
(0600, fsync'd). Nothing is left behind on failure.

```python
with ArchiveWriter(out) as writer:
    writer.add_bytes("config/applied.json", data, generation=digest)
    writer.add_stream("native/dhcp-leases/kea-leases4.csv", chunks, generation=dhcp_gen)
    manifest = writer.finish(device="edge-01", revision={...}, components={...})
```
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

from trueup import __version__
from trueup.backup.format import (
    MANIFEST,
    ComponentFacts,
    Entry,
    Manifest,
    component_of,
    unsafe_name,
)
from trueup.journal.restore import ArchiveRevision
from trueup.system.atomicfile import fsync_dir
from trueup.system.safefile import open_file

__all__ = ["ArchiveWriter"]

_CHUNK = 1024 * 1024


class ArchiveWriter:
    """Stage entries, then write the archive atomically. Use as a context manager."""

    def __init__(self, out: Path | str) -> None:
        self.out = Path(out)
        self._staging = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.", dir=self.out.parent))
        os.chmod(self._staging, 0o700)
        self._entries: list[tuple[Entry, Path]] = []

    def __enter__(self) -> ArchiveWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        shutil.rmtree(self._staging, ignore_errors=True)

    def _check(self, path: str) -> None:
        why = unsafe_name(path)
        if why is not None or component_of(path) is None:
            raise ValueError(f"{path}: not an archive entry name ({why or 'no component'})")
        if any(entry.path == path for entry, _ in self._entries):
            raise ValueError(f"{path}: added twice")

    def add_stream(self, path: str, chunks: Iterable[bytes], generation: str) -> Entry:
        """Stage one entry from `chunks`, hashing as it goes; its `Entry`."""
        self._check(path)
        staged = self._staging / f"{len(self._entries):06d}"
        digest = hashlib.sha256()
        size = 0
        try:
            with open(staged, "xb") as handle:
                for chunk in chunks:
                    digest.update(chunk)
                    size += len(chunk)
                    handle.write(chunk)
        except BaseException:
            staged.unlink(missing_ok=True)  # a source that failed half-way leaves nothing staged
            raise
        entry = Entry(path, digest.hexdigest(), size, generation)
        self._entries.append((entry, staged))
        return entry

    def add_bytes(self, path: str, data: bytes, generation: str) -> Entry:
        return self.add_stream(path, [data], generation)

    def add_file(self, path: str, source: Path, generation: str) -> Entry:
        """Stage a copy of `source` (a snapshot: later changes to it are not in the archive)."""
        with os.fdopen(open_file(source, os.O_RDONLY), "rb") as handle:  # never through a link
            return self.add_stream(path, iter(lambda: handle.read(_CHUNK), b""), generation)

    @property
    def entries(self) -> list[Entry]:
        return [entry for entry, _ in self._entries]

    def finish(
        self,
        *,
        device: str,
        revision: ArchiveRevision,
        components: dict[str, ComponentFacts],
        created_at: str,
        agent_version: str = __version__,
        format_version: int | None = None,
    ) -> Manifest:
        """Write the archive (temp file, fsync, rename, 0600); the manifest it holds."""
        manifest = Manifest(
            device=device,
            created_at=created_at,
            agent_version=agent_version,
            revision=revision,
            entries=self.entries,
            components=components,
        )
        if format_version is not None:
            manifest.format_version = format_version
        body = json.dumps(manifest.to_json(), indent=1, sort_keys=True).encode() + b"\n"
        mtime = int(time.time())
        fd, tmp = tempfile.mkstemp(prefix=f".{self.out.name}.", dir=self.out.parent)
        try:
            os.fchmod(fd, 0o600)
            with (
                os.fdopen(fd, "wb") as raw,
                tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar,
            ):
                tar.addfile(_info(MANIFEST, len(body), mtime), io.BytesIO(body))
                for entry, staged in self._entries:
                    with open(staged, "rb") as handle:
                        tar.addfile(_info(entry.path, entry.size, mtime), handle)
                tar.close()
                raw.flush()
                os.fsync(raw.fileno())
            os.replace(tmp, self.out)
            fsync_dir(self.out.parent)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return manifest


def _info(name: str, size: int, mtime: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = 0o600
    info.mtime = mtime
    info.uname = info.gname = "root"
    return info
