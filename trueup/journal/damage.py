"""Which state files are damaged — torn, edited, not UTF-8, unreadable — and what that forbids.

Who calls this: the engine (it refuses the writes a damaged file makes
unsafe), the startup orchestrator (phase 0 records what it found; phase 1
needs none of it), status, `/v1/health/services`, `doctor` and `preflight`.

Nothing here repairs or rewrites a damaged file: it stays as evidence until
the operator restores it or moves it aside, and the check sees that at once
(each file is checked again when its size, inode or mtime changes).

Each finding names the file, the problem and what it blocks:

| blocks   | files | why |
|---|---|---|
| `writes` | `state.json`, `applied.json`, the applied revision, `pending-confirm.json`, `control-plane.json` | the engine cannot tell what is applied, whether it awaits confirmation, or who owns the device: any apply, rollback, heal or recovery could go the wrong way |
| `heals`  | `reconcile.json` | acknowledgements and breakers are unknown: automatic heals wait, explicit ones (`trueup reconcile`) run |
| `none`   | `journal.jsonl` lines, `audit.jsonl`, older revisions, `management.json`, `management-override.json`, `config.json`, `api-tokens.json`, the directory being read-only or full | reported; what depends on them fails safe by itself |

Management never depends on any of them: phase 1 takes the first readable of
several copies of the management facts (see `trueup.startup.sources`).

Anything in the state directory that is not what the agent keeps there — a
symbolic link, a directory where a file belongs (or a file where a directory
belongs), a FIFO, a device, a file of another user — is damage too, anywhere
in the tree (`run/` included): it is never followed, read or written through
(`trueup.system.safefile`). The JSON records above block what they always
block; `lock`, `journal.jsonl`, `audit.jsonl` and the `revisions/` directory
block writes (no transaction could be locked, journaled or audited); the
rest block nothing more than what fails by itself.

Why this module is over 400 lines: it is the one list of every state file and
what its damage forbids; one check per file, each next to its table row.
"""

from __future__ import annotations

import os
import stat
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from trueup.journal.atomic import StateFileError, read_json
from trueup.journal.confirm import OUTCOME_FILE, PENDING_FILE
from trueup.journal.management import MANAGEMENT_FILE, read_management
from trueup.journal.override import OVERRIDE_FILE, read_override
from trueup.journal.state import STATE_SCHEMA, StateDir
from trueup.model.digests import json_digest
from trueup.model.records import DamageRecord, Pending
from trueup.system.safefile import refusal, unsafe_entries

__all__ = ["Blocks", "Damage", "StateCheck"]

Blocks = Literal["writes", "heals", "none"]

# Files read by name here that are owned by layers above (kept in step by tests).
CONTROL_PLANE_FILE = "control-plane.json"
RECONCILE_FILE = "reconcile.json"
CONFIG_FILE = "config.json"
TOKENS_FILE = "api-tokens.json"
_LOW_SPACE = 64 * 1024

# What the agent keeps at the top of the state directory, by kind. Files with a
# check of their own (the JSON records) are left to it; the rest are checked
# here for what they are, and `_BLOCKING` says what an unusable one refuses.
_CHECKED = frozenset(
    {
        "state.json",
        "applied.json",
        CONTROL_PLANE_FILE,
        PENDING_FILE,
        "journal.jsonl",
        RECONCILE_FILE,
        OVERRIDE_FILE,
        MANAGEMENT_FILE,
        CONFIG_FILE,
        TOKENS_FILE,
    }
)
_FILES = frozenset(
    {
        "lock",
        OUTCOME_FILE,
        "agent.pid",
        "agent.log",
        "agent.log.1",
        "audit.jsonl",
        "audit.head",
        "audit.torn",
        "limitations.json",
        "limitations.lock",
    }
)
_DIRECTORIES = frozenset({"revisions", "fences", "restore", "run", "secrets"})
_SOCKETS = frozenset({"agent.sock"})
_BLOCKING: dict[str, Blocks] = {
    "lock": "writes",
    "audit.jsonl": "writes",
    "revisions": "writes",
}
# A directory under run/ with one of these endings stands where a file belongs.
_FILE_ENDINGS = (".pid", ".log", ".conf", ".cfg", ".json", ".csv", ".new", ".check")

_CONSEQUENCE: dict[str, str] = {
    "writes": "applies, rollbacks, heals and recovery are refused until it is repaired; "
    "management and diagnostics keep running",
    "heals": "automatic heals wait (drift is still detected and reported); "
    "`trueup reconcile` heals explicitly",
    "none": "reported; nothing that depends on it can go wrong because of it",
}


@dataclass(frozen=True)
class Damage:
    path: str
    problem: str
    blocks: Blocks = "none"

    @property
    def file(self) -> str:
        return Path(self.path).name

    def to_json(self) -> DamageRecord:
        return {
            "path": self.path,
            "file": self.file,
            "problem": self.problem,
            "blocks": self.blocks,
            "consequence": _CONSEQUENCE[self.blocks],
        }

    def sentence(self) -> str:
        return f"{self.path}: {self.problem}"


_Signature = tuple[int, int, int] | None


def _signature(path: Path) -> _Signature:
    try:
        st = path.lstat()  # a link is checked as a link, never through
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class StateCheck:
    """The damaged files of one state directory, checked again only when they change."""

    def __init__(self, state: StateDir) -> None:
        self.state = state
        self._cache: dict[tuple[str, Any], tuple[_Signature, list[Damage]]] = {}
        self._noted: dict[str, Damage] = {}
        self._deep_revisions: list[int] = []  # older revisions damaged at the last deep check
        self._deep_audit: list[Damage] = []
        self._lock = threading.Lock()

    # -- what the process itself ran into ----------------------------------------
    def note(self, path: Path | str, problem: str, blocks: Blocks = "none") -> None:
        """Record a problem found while running (a socket that cannot be created, …)."""
        with self._lock:
            self._noted[str(path)] = Damage(str(path), problem, blocks)

    def forget(self, path: Path | str) -> None:
        with self._lock:
            self._noted.pop(str(path), None)

    # -- the check --------------------------------------------------------------
    def damaged(self, *, deep: bool = False) -> list[Damage]:
        """Every damaged file. `deep` also verifies the audit chain and every revision.

        Without `deep`, the last deep findings are included as they were.
        """
        root = self.state.root
        if not root.is_dir():
            return []
        found: list[Damage] = []
        found += self._storage()
        found += self._unsafe()
        found += self._file(root / "state.json", self._state_json)
        applied, applied_damage = self._applied()
        found += applied_damage
        found += self._file(root / CONTROL_PLANE_FILE, lambda p: _json_dict(p, "writes"))
        found += self._file(root / PENDING_FILE, self._pending)
        if applied:
            found += self._revision(applied, "writes")
        found += self._file(root / "journal.jsonl", self._journal)
        found += self._file(root / RECONCILE_FILE, self._reconcile)
        found += self._file(root / OVERRIDE_FILE, self._override)
        found += self._file(root / MANAGEMENT_FILE, self._management)
        found += self._file(root / CONFIG_FILE, lambda p: _json_dict(p, "none"))
        found += self._file(root / TOKENS_FILE, self._tokens)
        if deep:
            damaged_revisions = [
                version
                for version in self.state.revision_versions()
                if version != applied and self._revision(version, "none")
            ]
            audit: list[Damage] = []
            problems = self.state.audit.verify()
            if problems:
                more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
                audit.append(
                    Damage(
                        str(self.state.audit.path),
                        f"hash chain broken: {problems[0]}{more}; `trueup audit verify` "
                        "lists every line",
                    )
                )
            with self._lock:
                self._deep_revisions, self._deep_audit = damaged_revisions, audit
        with self._lock:
            revisions, audit, noted = (
                list(self._deep_revisions),
                list(self._deep_audit),
                list(self._noted.values()),
            )
        # Older revisions found damaged by the last deep check are checked again
        # (cheaply: by signature), so a restored one drops out at once; a broken
        # audit chain stays broken until the next deep check says otherwise.
        for version in revisions:
            if version != applied:
                found += self._revision(version, "none")
        return _one_per_path(found + audit + noted)

    def blocking(self, blocks: Blocks) -> list[Damage]:
        """The damaged files that forbid `blocks` (writes, or heals)."""
        kinds = ("writes",) if blocks == "writes" else ("writes", "heals")
        return [d for d in self.damaged() if d.blocks in kinds]

    def _file(self, path: Path, check: Any, key: Any = None) -> list[Damage]:
        signature = _signature(path)
        if signature is None:
            return []
        cache_key = (str(path), key)
        with self._lock:
            cached = self._cache.get(cache_key)
        if cached is not None and cached[0] == signature:
            return cached[1]
        try:
            result: list[Damage] = check(path)
        except OSError as exc:
            result = [Damage(str(path), f"cannot be read: {exc.strerror or exc}", "none")]
        with self._lock:
            self._cache[cache_key] = (signature, result)
        return result

    # -- what is not a file (or directory) of ours -------------------------------------
    def _unsafe(self) -> list[Damage]:
        """Links, FIFOs, devices, others' files, and the wrong kind where a known name is."""
        root = self.state.root
        found: list[Damage] = []
        try:
            entries = list(os.scandir(root))
        except OSError:
            return []
        for entry in entries:
            name = entry.name
            if name in _CHECKED:
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if name in _DIRECTORIES:
                problem = refusal(entry.path, st, directory=True)
            elif name in _SOCKETS:
                problem = None if stat.S_ISSOCK(st.st_mode) else refusal(entry.path, st)
            elif name in _FILES or not (stat.S_ISDIR(st.st_mode) or stat.S_ISSOCK(st.st_mode)):
                problem = refusal(entry.path, st)
            else:
                problem = refusal(entry.path, st, directory=True)
            if problem is not None:
                found.append(Damage(entry.path, _refused(problem), _BLOCKING.get(name, "none")))
            elif name in _DIRECTORIES:
                found += self._unsafe_below(Path(entry.path), name)
        return found

    def _unsafe_below(self, directory: Path, name: str) -> list[Damage]:
        blocks = _BLOCKING.get(name, "none")
        found = [
            Damage(path, _refused(problem), blocks) for path, problem in unsafe_entries(directory)
        ]
        # A directory where a file belongs: every entry of fences/, secrets/ and
        # revisions/ (but `superseded/`, `restore/staged/`) is a file, and so is
        # any entry under run/ named like one.
        for path in _directories_below(directory, 2 if name == "run" else 1):
            leaf = path.name
            if (
                (name in ("fences", "secrets") or (name == "revisions" and leaf != "superseded"))
                and path.parent == directory
            ) or (name == "run" and path.parent != directory and leaf.endswith(_FILE_ENDINGS)):
                found.append(Damage(str(path), _refused("a directory, not a regular file"), blocks))
        return found

    # -- one function per file ------------------------------------------------------
    def _storage(self) -> list[Damage]:
        root = self.state.root
        try:
            vfs = os.statvfs(root)
        except OSError:
            return []
        if vfs.f_flag & os.ST_RDONLY or not os.access(root, os.W_OK):
            return [
                Damage(
                    str(root),
                    "read-only: nothing can be recorded (journal, audit, revisions, the agent "
                    "socket); writes are refused with the cause",
                )
            ]
        free = vfs.f_bavail * vfs.f_frsize
        if free < _LOW_SPACE:
            return [
                Damage(
                    str(root),
                    f"full ({free} bytes free): writes that need space are refused with the "
                    "cause, nothing is left half-written",
                )
            ]
        return []

    def _state_json(self, path: Path) -> list[Damage]:
        try:
            meta = read_json(path)
        except StateFileError as exc:
            return [Damage(str(path), exc.problem, "writes")]
        schema = meta.get("schema") if isinstance(meta, dict) else None
        if not isinstance(schema, int) or isinstance(schema, bool):
            return [Damage(str(path), "not a state directory record (no schema)", "writes")]
        if schema > STATE_SCHEMA:
            return [
                Damage(
                    str(path),
                    f"schema {schema} was written by a newer trueup; this agent supports "
                    f"schema {STATE_SCHEMA} (upgrade the agent)",
                    "writes",
                )
            ]
        return []

    def _applied(self) -> tuple[int, list[Damage]]:
        """The applied version (0 when unknown) and the damage of `applied.json`."""
        path = self.state.root / "applied.json"
        version = 0

        def check(p: Path) -> list[Damage]:
            try:
                self.state.applied_record()
            except StateFileError as exc:
                return [Damage(str(p), exc.problem, "writes")]
            return []

        damage = self._file(path, check)
        if not damage:
            try:
                version = self.state.applied_record().version
            except (StateFileError, OSError):
                version = 0
        return version, damage

    def _pending(self, path: Path) -> list[Damage]:
        try:
            record = read_json(path)
        except StateFileError as exc:
            return [Damage(str(path), exc.problem, "writes")]
        try:
            Pending.model_validate(record)
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(p) for p in error["loc"]) or "(record)"
            return [
                Damage(str(path), f"not a pending confirmation: {where}: {error['msg']}", "writes")
            ]
        return []

    def _revision(self, version: int, blocks: Blocks) -> list[Damage]:
        path = self.state.root / "revisions" / f"{version:08d}.json"
        if not path.exists():
            if blocks == "writes":
                return [
                    Damage(str(path), f"applied revision {version} is missing", "writes"),
                ]
            return []

        def check(p: Path) -> list[Damage]:
            try:
                record = read_json(p)
            except StateFileError as exc:
                return [Damage(str(p), exc.problem, blocks)]
            if not isinstance(record, dict) or record.get("digest") != json_digest(
                record.get("document")
            ):
                return [
                    Damage(str(p), "no longer matches its digest (edited or torn)", blocks),
                ]
            return []

        return self._file(path, check, blocks)

    def _journal(self, path: Path) -> list[Damage]:
        problems = self.state.journal.problems()
        if not problems:
            return []
        if refusal(path, path.lstat()) is not None:  # no transaction can be recorded
            return [Damage(str(path), problems[0], "writes")]
        more = f" (and {len(problems) - 2} more)" if len(problems) > 2 else ""
        return [Damage(str(path), "; ".join(problems[:2]) + more)]

    def _reconcile(self, path: Path) -> list[Damage]:
        try:
            record = read_json(path)
        except StateFileError as exc:
            return [Damage(str(path), exc.problem, "heals")]
        if not isinstance(record, dict) or not all(
            isinstance(record.get(k, {}), dict) for k in ("subsystems", "acks")
        ):
            return [Damage(str(path), "not a reconcile record", "heals")]
        return []

    def _override(self, path: Path) -> list[Damage]:
        try:
            read_override(path.parent)
        except StateFileError as exc:
            return [
                Damage(
                    str(path),
                    f"{exc.problem}; the override cannot be used (run `trueup management set` "
                    "again)",
                )
            ]
        return []

    def _management(self, path: Path) -> list[Damage]:
        if read_management(path.parent) is not None:
            return []
        try:
            read_json(path)
            problem = "fields or checksum do not match (edited or torn)"
        except StateFileError as exc:
            problem = exc.problem
        return [
            Damage(
                str(path),
                f"{problem}; management comes from the next readable source and the file is "
                "rewritten at the next commit",
            )
        ]

    def _tokens(self, path: Path) -> list[Damage]:
        try:
            tokens = read_json(path)
        except StateFileError as exc:
            problem = exc.problem
        else:
            if isinstance(tokens, list) and all(isinstance(t, dict) for t in tokens):
                return []
            problem = "not a token list"
        return [
            Damage(
                str(path),
                f"{problem}; every management-port token is refused (the unix socket and "
                "/v1/health/* still answer)",
            )
        ]


_STRENGTH: dict[Blocks, int] = {"writes": 2, "heals": 1, "none": 0}


def _one_per_path(found: list[Damage]) -> list[Damage]:
    """The findings in order, one per path: the one that blocks the most."""
    best: dict[str, Damage] = {}
    for damage in found:
        kept = best.get(damage.path)
        if kept is None or _STRENGTH[damage.blocks] > _STRENGTH[kept.blocks]:
            best[damage.path] = damage
    return [d for d in found if best[d.path] is d]


def _refused(problem: str) -> str:
    return f"{problem}: never followed, read or written through; move it aside"


def _directories_below(directory: Path, depth: int) -> list[Path]:
    """Real directories (not links) below `directory`, `depth` levels down."""
    out: list[Path] = []
    level = [directory]
    for _ in range(depth):
        below: list[Path] = []
        for folder in level:
            try:
                below += [
                    Path(e.path) for e in os.scandir(folder) if e.is_dir(follow_symlinks=False)
                ]
            except OSError:
                continue
        out += below
        level = below
    return out


def _json_dict(path: Path, blocks: Blocks) -> list[Damage]:
    try:
        value = read_json(path)
    except StateFileError as exc:
        return [Damage(str(path), exc.problem, blocks)]
    if not isinstance(value, dict):
        return [Damage(str(path), "not a JSON object", blocks)]
    return []
