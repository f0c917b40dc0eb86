"""The state directory: everything the agent must remember, in one place.

```
STATE_DIR/
  state.json          schema version of this directory, device name
  applied.json        the applied revision: version, digest, outcome, when
  revisions/N.json    accepted desired revisions (the documents)
  journal.jsonl       write-ahead journal of transactions
  audit.jsonl         append-only, hash-chained audit log
  audit.head          its anchor: seq, hash and size of the last line (truncation shows)
  audit.torn          torn last lines a repair moved out of audit.jsonl (evidence)
  reconcile.json      reconcile history: breaker, back-off, failures
  lock                one writer at a time
  agent.sock          the agent's local API
```
Every file is written atomically. `digest` fields let `doctor` detect edits
made behind the agent's back.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from trueup.journal.atomic import StateFileError, read_json, write_json
from trueup.journal.audit import AuditLog
from trueup.journal.journal import Journal
from trueup.journal.lock import WriterLock
from trueup.model.digests import json_digest
from trueup.model.records import Applied

__all__ = ["STATE_SCHEMA", "StateDir", "StateDirError"]

STATE_SCHEMA = 1
DEFAULT_STATE_DIR = "/var/lib/trueup"
_KEEP_REVISIONS = 100


class StateDirError(RuntimeError):
    pass


def _digest(value: Any) -> str:
    return json_digest(value)


class StateDir:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    # -- layout -----------------------------------------------------------
    @property
    def socket_path(self) -> Path:
        return self.root / "agent.sock"

    @property
    def journal(self) -> Journal:
        return Journal(self.root / "journal.jsonl")

    @property
    def audit(self) -> AuditLog:
        return AuditLog(self.root / "audit.jsonl")

    def writer_lock(self, purpose: str, wait: float = 0.0) -> WriterLock:
        return WriterLock(self.root / "lock", purpose, wait)

    def ensure(self) -> None:
        """Create the directory on first use; refuse one written by a newer trueup."""
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        (self.root / "revisions").mkdir(exist_ok=True, mode=0o700)
        meta = read_json(self.root / "state.json")
        if meta is None:
            write_json(self.root / "state.json", {"schema": STATE_SCHEMA})
        else:
            self.check_schema(meta)

    def check_schema(self, meta: dict[str, Any] | None = None) -> int:
        meta = meta if meta is not None else read_json(self.root / "state.json", {})
        schema = int((meta or {}).get("schema", 0))
        if schema > STATE_SCHEMA:
            raise StateDirError(
                f"{self.root}/state.json: schema {schema} was written by a newer trueup; this "
                f"agent supports schema {STATE_SCHEMA} — upgrade the agent"
            )
        return schema

    def exists(self) -> bool:
        return (self.root / "state.json").exists()

    # -- applied revision -------------------------------------------------
    def applied_record(self) -> Applied:
        """The applied record, typed; version 0 when nothing was ever applied.

        Raises `StateFileError` naming the file when it is not valid JSON or
        not an applied record.
        """
        path = self.root / "applied.json"
        raw = read_json(path)
        if not raw:
            return Applied()
        try:
            return Applied.model_validate(raw)
        except ValidationError as exc:
            raise StateFileError(path, f"not an applied record: {exc.errors()[0]['msg']}") from None

    def applied(self) -> dict[str, Any]:
        """`applied_record()` as JSON, for code that reads it field by field."""
        return self.applied_record().to_json()

    def set_applied(self, record: Applied | dict[str, Any]) -> None:
        if isinstance(record, dict):
            record = Applied.model_validate(record)
        write_json(self.root / "applied.json", record.to_json())

    # -- revisions --------------------------------------------------------
    def _revision_path(self, version: int) -> Path:
        return self.root / "revisions" / f"{version:08d}.json"

    def save_revision(self, version: int, document: dict[str, Any], **meta: Any) -> None:
        """Store an accepted revision; one with the same number and other content is kept aside.

        On a managed device a local override can take a number the control
        plane later publishes; the override's document moves to
        `revisions/superseded/` instead of being lost.
        """
        path = self._revision_path(version)
        digest = _digest(document)
        try:
            existing = read_json(path)
        except ValueError:
            existing = None
        if isinstance(existing, dict) and existing.get("digest") not in (None, digest):
            aside = self.root / "revisions" / "superseded"
            aside.mkdir(exist_ok=True, mode=0o700)
            old = str(existing.get("digest", "")).removeprefix("sha256:")[:12]
            os.replace(path, aside / f"{version:08d}-{old}.json")
        write_json(path, {"version": version, "document": document, "digest": digest, **meta})
        self._prune_revisions()

    def revision(self, version: int) -> dict[str, Any] | None:
        record = read_json(self._revision_path(version))
        return dict(record) if record else None

    def revision_versions(self) -> list[int]:
        folder = self.root / "revisions"
        if not folder.exists():
            return []
        return sorted(int(p.stem) for p in folder.glob("*.json") if p.stem.isdigit())

    def _prune_revisions(self) -> None:
        versions = self.revision_versions()
        for version in versions[:-_KEEP_REVISIONS]:
            os.unlink(self._revision_path(version))

    def tampered_revisions(self) -> list[str]:
        """Revisions whose content no longer matches the digest written with them."""
        out = []
        for version in self.revision_versions():
            try:
                record = self.revision(version) or {}
            except StateFileError:
                record = {}  # not even JSON any more: edited or torn
            if not isinstance(record, dict) or record.get("digest") != _digest(
                record.get("document")
            ):
                out.append(str(self._revision_path(version)))
        return out

    # -- small JSON records -----------------------------------------------
    def read(self, name: str, default: Any = None) -> Any:
        return read_json(self.root / name, default)

    def write(self, name: str, value: Any) -> None:
        write_json(self.root / name, value)
