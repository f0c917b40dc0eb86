"""The backup archive format: one uncompressed tar, `manifest.json` first.

Who uses this: `trueup.backup.writer` (builds archives), `trueup.backup.reader`
(reads them, verified), `trueup.backup.analysis` and the restore engine.
Pure data and validation; no I/O.

Layout (member names, in this order):

```
manifest.json                         format version, device, revision, every entry's sha256/size/generation
config/applied.json                   the applied record (version, digest, origin, cp_version, …)
config/revisions/00000012.json        every accepted revision: document + provenance (origin, actor,
                                      source, txn, accepted_at, applied_digest)
native/dns/ZONE.zone                  Knot's zone files (SOA + static records)
audit/audit.jsonl                     an excerpt of the audit log (whole lines, the chain's tail)
audit/proof.json                      the chain proof: the excerpt's first prev-hash, its last seq/hash
                                      and the log's anchor (audit.head) when the backup was made
native/dhcp-leases/kea-leases4.csv    Kea memfile CSV(s), optional (`--with-leases`); last, the biggest
```

Why an uncompressed tar: analysis must hash every byte anyway, and an
uncompressed archive is read at disk speed with constant memory; member data
sits at known offsets, so `open_component` can read one entry without
decompressing the entries before it; a truncation or a flipped byte is named
per entry (sha256 and size) instead of "gzip: unexpected end of file"; and
`tar tvf` reads it at 3 a.m. without trueup. Lease CSVs are small (about
100 bytes a lease, 10 MB for 100,000). Compress the file for transport if
you like; trueup reads only the uncompressed form.

Generations: every entry carries the generation of the configuration it
belongs to. Config entries: the applied document's digest. Lease files: the
digest of the `spec.dhcp` section they were made under (`dhcp_generation`),
which must equal the config component's `dhcp_generation` for a full
restore. Zone files: the digest of `spec.dns`. Audit entries: the audit head
hash.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field
from typing import Any, TypedDict, cast

from trueup.journal.restore import ArchiveRevision
from trueup.model.digests import json_digest
from trueup.model.jsontypes import JSONObject

__all__ = [
    "AUDIT",
    "COMPONENTS",
    "CONFIG",
    "DNS",
    "FORMAT",
    "FORMAT_VERSION",
    "LEASES",
    "MANIFEST",
    "AuditHead",
    "ComponentFacts",
    "Entry",
    "EntryJSON",
    "Manifest",
    "ManifestError",
    "ManifestJSON",
    "component_of",
    "section_generation",
    "unsafe_name",
]

FORMAT = "trueup-backup"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
MANIFEST_MAX_BYTES = 64 * 1024 * 1024

CONFIG = "config"
LEASES = "native/dhcp-leases"
DNS = "native/dns"
AUDIT = "audit"
COMPONENTS = (CONFIG, LEASES, DNS, AUDIT)

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_SAFE = re.compile(r"^[A-Za-z0-9._@+-]+(/[A-Za-z0-9._@+-]+)*$")


class ManifestError(ValueError):
    """`manifest.json` is not a manifest this trueup can read; the message names the field."""


def section_generation(document: JSONObject | None, section: str) -> str:
    """The generation id of one `spec` section: the digest of its canonical JSON (absent: null)."""
    spec = (document or {}).get("spec") or {}
    return json_digest(spec.get(section) if isinstance(spec, dict) else None)


def component_of(name: str) -> str | None:
    """Which component a member name belongs to (None: none — the manifest or an intruder)."""
    for component in (LEASES, DNS, CONFIG, AUDIT):
        if name.startswith(component + "/"):
            return component
    return None


def unsafe_name(name: str) -> str | None:
    """Why a member name is unsafe to extract, or None when it is safe.

    Safe: relative, normalised, no `..`, no empty or dot segments, only
    `[A-Za-z0-9._@+-]` and `/` (no backslash, no control characters).
    """
    if not name or name.startswith("/"):
        return "absolute path"
    parts = name.split("/")
    if ".." in parts:
        return "path escapes the extraction directory (..)"
    if posixpath.normpath(name) != name or "." in parts or "" in parts:
        return "path is not normalised"
    if not _SAFE.match(name):
        return "path has characters outside [A-Za-z0-9._@+-/]"
    return None


@dataclass(frozen=True)
class Entry:
    """One member the manifest declares: its bytes' sha256 (64 hex digits), size and generation."""

    path: str
    sha256: str
    size: int
    generation: str

    @property
    def component(self) -> str | None:
        return component_of(self.path)

    def to_json(self) -> EntryJSON:
        return {
            "path": self.path,
            "component": self.component,
            "sha256": self.sha256,
            "size": self.size,
            "generation": self.generation,
        }


class EntryJSON(TypedDict):
    """One entry of `manifest.json`: its path, component, sha256, size and generation."""

    path: str
    component: str | None
    sha256: str
    size: int
    generation: str


class AuditHead(TypedDict):
    """Where an audit excerpt ends: its last seq and hash (None: no lines)."""

    seq: int | None
    hash: str | None


class ComponentFacts(TypedDict, total=False):
    """A component's facts in `manifest.json` (`config`, `native/dhcp-leases`, `native/dns`,
    `audit`): each holds the keys of its component."""

    generation: str  # config: the applied digest; leases: the DHCP generation; dns: spec.dns's
    dhcp_generation: str  # config
    dns_generation: str  # config
    revisions: int  # config: how many revision files
    counts: dict[str, int]  # leases: per family ("4", "6")
    source: dict[str, str]  # leases: per family, socket | memfile
    lines: int  # audit: the excerpt's lines
    head: AuditHead  # audit


class ManifestJSON(TypedDict):
    """`manifest.json` as written."""

    format: str
    format_version: int
    device: str
    created_at: str
    agent_version: str
    revision: ArchiveRevision
    components: dict[str, ComponentFacts]
    entries: list[EntryJSON]


@dataclass
class Manifest:
    """`manifest.json`. `revision` is the applied revision: {version, digest}.

    `components` holds per-component facts: for `config` the `generation`
    (applied digest) and `dhcp_generation`/`dns_generation`; for leases the
    `generation`, the lease `count` per family and the `source`
    (socket | memfile); for the audit excerpt its `head`.
    """

    device: str
    created_at: str
    agent_version: str
    revision: ArchiveRevision
    entries: list[Entry] = field(default_factory=list)
    components: dict[str, ComponentFacts] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION

    def entry(self, path: str) -> Entry | None:
        for entry in self.entries:
            if entry.path == path:
                return entry
        return None

    def component_entries(self, component: str) -> list[Entry]:
        return [e for e in self.entries if e.component == component]

    def to_json(self) -> ManifestJSON:
        return {
            "format": FORMAT,
            "format_version": self.format_version,
            "device": self.device,
            "created_at": self.created_at,
            "agent_version": self.agent_version,
            "revision": self.revision,
            "components": self.components,
            "entries": [e.to_json() for e in self.entries],
        }

    @classmethod
    def from_json(cls, data: Any) -> Manifest:
        """Parse and check a manifest; `ManifestError` names the first bad field.

        A newer `format_version` raises too (the message says so): fields of
        a newer format cannot be trusted to mean what this trueup thinks.
        """
        if not isinstance(data, dict):
            raise ManifestError("manifest.json: not a JSON object")
        if data.get("format") != FORMAT:
            raise ManifestError(f"manifest.json: format is {data.get('format')!r}, not {FORMAT!r}")
        version = data.get("format_version")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise ManifestError("manifest.json: format_version is not a positive integer")
        if version > FORMAT_VERSION:
            raise ManifestError(
                f"manifest.json: format_version {version} was written by a newer trueup; this "
                f"agent reads format {FORMAT_VERSION} — analyse it with a newer trueup"
            )
        for key in ("device", "created_at", "agent_version"):
            if not isinstance(data.get(key), str):
                raise ManifestError(f"manifest.json: {key} is not a string")
        revision = data.get("revision")
        if not isinstance(revision, dict) or not isinstance(revision.get("version"), int):
            raise ManifestError("manifest.json: revision.version is not an integer")
        components = data.get("components", {})
        if not isinstance(components, dict) or not all(
            isinstance(v, dict) for v in components.values()
        ):
            raise ManifestError("manifest.json: components is not an object of objects")
        raw_entries = data.get("entries")
        if not isinstance(raw_entries, list):
            raise ManifestError("manifest.json: entries is not a list")
        entries: list[Entry] = []
        seen: set[str] = set()
        for i, raw in enumerate(raw_entries):
            where = f"manifest.json: entries[{i}]"
            if not isinstance(raw, dict):
                raise ManifestError(f"{where}: not an object")
            path, sha, size, gen = (raw.get(k) for k in ("path", "sha256", "size", "generation"))
            if not isinstance(path, str):
                raise ManifestError(f"{where}.path: not a string")
            why = unsafe_name(path)
            if why is not None or component_of(path) is None:
                raise ManifestError(f"{where}.path {path!r}: {why or 'not in a known component'}")
            if path in seen:
                raise ManifestError(f"{where}.path {path!r}: declared twice")
            seen.add(path)
            if not isinstance(sha, str) or not _HEX64.match(sha):
                raise ManifestError(f"{where}.sha256 ({path}): not 64 hex digits")
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise ManifestError(f"{where}.size ({path}): not a non-negative integer")
            if not isinstance(gen, str):
                raise ManifestError(f"{where}.generation ({path}): not a string")
            entries.append(Entry(path, sha, size, gen))
        return cls(
            device=data["device"],
            created_at=data["created_at"],
            agent_version=data["agent_version"],
            revision=cast("ArchiveRevision", dict(revision)),
            entries=entries,
            components={str(k): cast("ComponentFacts", dict(v)) for k, v in components.items()},
            format_version=version,
        )
