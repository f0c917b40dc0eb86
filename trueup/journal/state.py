"""The state directory: everything the agent must remember, in one place.

```
STATE_DIR/
  state.json          the directory's identity: schema, device, created by (trueup.journal.identity)
  applied.json        the applied revision: version, digest, outcome, when
  revisions/N.json    accepted desired revisions (the documents)
  journal.jsonl       write-ahead journal of transactions
  audit.jsonl         append-only, hash-chained audit log
  audit.head          its anchor: seq, hash and size of the last line (truncation shows)
  audit.torn          torn last lines a repair moved out of audit.jsonl (evidence)
  reconcile.json      reconcile history: breaker, back-off, failures
  lock                one writer at a time
  agent.sock          the agent's local API
  agent.log           the agent's log (also agent.log.1), read by evidence and doctor
  limitations.json    known limitations (trueup.journal.limitations)
```
Every file is written atomically, and none is opened through a symbolic link
or used unless it is a regular file of ours (`trueup.system.safefile`;
`trueup.journal.damage` names anything else). `digest` fields let `doctor` detect edits
made behind the agent's back.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NotRequired, TypedDict, cast

from pydantic import ValidationError

from trueup.journal.atomic import StateFileError, read_json, write_json
from trueup.journal.audit import AuditLog, now_iso
from trueup.journal.identity import STATE_FILE, TRUEUP_FILES, legacy
from trueup.journal.journal import Journal
from trueup.journal.lock import WriterLock
from trueup.model.digests import json_digest
from trueup.model.jsontypes import JSONObject
from trueup.model.records import Applied
from trueup.system.safefile import ensure_dir

__all__ = [
    "STATE_SCHEMA",
    "CreatedBy",
    "RevisionRecord",
    "StateDir",
    "StateDirError",
    "StateIdentity",
]

STATE_SCHEMA = 1
DEFAULT_STATE_DIR = "/var/lib/trueup"
_KEEP_REVISIONS = 100


class StateDirError(RuntimeError):
    pass


class CreatedBy(TypedDict):
    """`state.json`'s `created`: the command that made (or adopted) the directory, when, where."""

    by: str
    at: str
    trueup: str
    host: str
    adopted: NotRequired[bool]  # a directory from before identities, adopted


class StateIdentity(TypedDict, total=False):
    """`state.json`: the directory's schema, the device it belongs to, who created it (a
    directory from before identities has no `created`)."""

    schema: int
    device: str | None
    created: CreatedBy


class RevisionRecord(TypedDict, total=False):
    """`revisions/N.json`: an accepted revision (the document as JSON) and how it came."""

    version: int
    document: JSONObject
    digest: str  # of `document` as written: an edit behind the agent's back shows
    applied_digest: str | None  # the document's identity (`document_digest`)
    accepted_at: str
    actor: str
    source: str | None
    origin: str | None
    txn: str


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

    def ensure(
        self,
        created_by: str | None = None,
        device: str | None = None,
        actor: str = "trueup",
    ) -> None:
        """Create the directory and its identity on first use; refuse one written by a newer trueup.

        `created_by` is the creating command (`trueup agent run`, `trueup
        apply --init`): with it, the creation — or the adoption of a directory
        from before identities — is audited, and `device` (the document's
        `metadata.device`) is bound when the identity names none yet; it is
        never changed. The CLI lets only those two commands get here with a
        directory that is not one yet (`trueup.journal.identity.problem`).

        A damaged `state.json` is left as it is (evidence; `trueup.journal.damage`
        reports it and writes are refused). Raises `StateDirError` for a newer
        schema and `OSError` when the directory cannot be written.
        """
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        had_state = any((self.root / name).exists() for name in TRUEUP_FILES)
        ensure_dir(self.root / "revisions")  # never a link out of the state directory
        try:
            meta = read_json(self.root / STATE_FILE)
        except StateFileError:
            return  # left as evidence: trueup.journal.damage reports it, writes are refused
        events: list[str] = []
        if meta is None:
            meta = {"schema": STATE_SCHEMA, "device": device or None}
            meta["created"] = self._created(created_by, adopted=had_state)
            events.append("state_dir_adopted" if had_state else "state_dir_created")
        else:
            self.check_schema(meta)
            if created_by is not None and legacy(meta):
                meta["created"] = self._created(created_by, adopted=True)
                events.append("state_dir_adopted")
            if created_by is not None and device and not meta.get("device"):
                meta["device"] = device
                events.append("state_dir_device")
            if not events:
                return
        write_json(self.root / STATE_FILE, meta)
        if created_by is not None:
            for event in events:
                self.audit.append(
                    event, actor=actor, by=created_by, device=meta.get("device"), dir=str(self.root)
                )

    @staticmethod
    def _created(created_by: str | None, *, adopted: bool) -> CreatedBy:
        from trueup import __version__

        created: CreatedBy = {
            "by": created_by or "trueup",
            "at": now_iso(),
            "trueup": __version__,
            "host": os.uname().nodename,
        }
        if adopted:
            created["adopted"] = True
        return created

    def identity(self) -> StateIdentity:
        """`state.json` as written (`{}` when missing or damaged)."""
        try:
            meta = read_json(self.root / STATE_FILE, {})
        except StateFileError:
            return {}
        return cast("StateIdentity", dict(meta)) if isinstance(meta, dict) else {}

    def check_schema(self, meta: StateIdentity | None = None) -> int:
        """The directory's schema; 0 when `state.json` is missing or damaged.

        A damaged `state.json` is reported by `trueup.journal.damage` (and
        writes are refused), not raised here: reading status must still work.
        Raises `StateDirError` for a schema written by a newer trueup.
        """
        if meta is None:
            try:
                meta = read_json(self.root / "state.json", {})
            except StateFileError:
                return 0
        schema = meta.get("schema", 0) if isinstance(meta, dict) else 0
        if not isinstance(schema, int) or isinstance(schema, bool):
            return 0
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

    def applied(self) -> Applied:
        """`applied_record()`, or the empty record (version 0) when it cannot be read.

        An `applied.json` that cannot be read reads as nothing applied here;
        the damage is reported by `trueup.journal.damage`, and the engine
        refuses every write until it is repaired, so nothing acts on that
        guess. Code that must know uses `applied_record()`, which raises.
        """
        try:
            return self.applied_record()
        except StateFileError:
            return Applied()

    def set_applied(self, record: Applied | JSONObject) -> None:
        """Write `applied.json`; a JSON body (a journal's `previous_applied`) is validated."""
        if isinstance(record, dict):
            record = Applied.model_validate(record)
        write_json(self.root / "applied.json", record.to_json())

    # -- revisions --------------------------------------------------------
    def _revision_path(self, version: int) -> Path:
        return self.root / "revisions" / f"{version:08d}.json"

    def revision_file(self, version: int) -> Path:
        """Where revision `version` is kept (it may not exist)."""
        return self._revision_path(version)

    def save_revision(self, version: int, document: JSONObject, **meta: Any) -> None:
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
            ensure_dir(aside, levels=2)
            identity = existing.get("applied_digest") or existing.get("digest", "")
            old = str(identity).removeprefix("sha256:")[:12]
            os.replace(path, aside / f"{version:08d}-{old}.json")
        write_json(path, {"version": version, "document": document, "digest": digest, **meta})
        self._prune_revisions(keep=version)

    def revision(self, version: int, digest: str | None = None) -> RevisionRecord | None:
        """An accepted revision's record; None when there is none.

        With `digest`, the revision with that number *and* that content: a
        revision file is written before its transaction commits, so after a
        crash (or a refused commit) `N.json` can hold a document that never
        became the applied one, and the applied one was moved to
        `revisions/superseded/`. Raises `StateFileError` naming the file when
        it is not a revision record.
        """
        path = self._revision_path(version)
        record = read_json(path)
        if record is not None and (
            not isinstance(record, dict) or not isinstance(record.get("document"), dict)
        ):
            raise StateFileError(path, "not a revision record (edited or torn?)")
        # `applied_digest` is the document's identity (trueup.model.document.
        # document_digest); `digest` guards the file's own content.
        if digest is None or record is None or record.get("applied_digest") in (None, digest):
            return cast("RevisionRecord", dict(record)) if record is not None else None
        aside = self.root / "revisions" / "superseded"
        wanted = digest.removeprefix("sha256:")[:12]
        candidate = read_json(aside / f"{version:08d}-{wanted}.json")
        if isinstance(candidate, dict) and candidate.get("applied_digest") == digest:
            return cast("RevisionRecord", dict(candidate))
        return cast("RevisionRecord", dict(record))

    def revision_versions(self) -> list[int]:
        folder = self.root / "revisions"
        if not folder.exists():
            return []
        return sorted(int(p.stem) for p in folder.glob("*.json") if p.stem.isdigit())

    def _prune_revisions(self, keep: int | None = None) -> None:
        """Keep the last revisions by number, and always the applied one.

        Numbers can go back (the first control-plane revision after many local
        applies): the applied revision is never pruned for being low.
        """
        versions = self.revision_versions()
        applied = self.applied().version
        for version in versions[:-_KEEP_REVISIONS]:
            if version not in (applied, keep):
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
