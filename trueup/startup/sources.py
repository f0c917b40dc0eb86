"""Where phase 1 takes the management facts from: the first readable of several copies.

Who calls this: the startup orchestrator (phase 0), `trueup preflight` and
`trueup management show` — all three say the same thing about the next start.

In order, the first that can be read and validated wins:

1. `management-override.json` — set from the console (`trueup management
   set`); laid over whatever comes next, so the API listener settings stay;
2. `management.json` — the management facts of the last commit, kept apart
   so a damaged revision or applied record cannot take management down;
3. the last committed revision (the applied record names it; when that is
   damaged, the journal's last commit; while a transaction is open, the one
   it started from; when a confirmation expired while the agent was down,
   the last confirmed one);
4. the config file (`--config`);
5. the installer fallback (`--management-fallback`);
6. the newest accepted revision that can be read (nothing committed is
   readable any more: better the last accepted management address than none).

Every source that was tried and not used is listed with the reason, so the
operator sees exactly which file is damaged.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from trueup.journal.atomic import StateFileError
from trueup.journal.confirm import read_pending
from trueup.journal.management import MANAGEMENT_FILE, read_management
from trueup.journal.override import OVERRIDE_FILE, ManagementOverride, read_override
from trueup.journal.state import StateDir
from trueup.model.document import DeviceState, DocumentError, load_document, parse_document
from trueup.reconcile.changes import Kind
from trueup.reconcile.confirm import decide
from trueup.reconcile.management_tier import document_from_facts, with_management

__all__ = ["ManagementSource", "management_source"]


class ApiJSON(TypedDict):
    """`spec.management.api` as the document has it."""

    port: int
    bind: str | None


class ManagementSourceJSON(TypedDict):
    """Status' `agent.management_source`: the facts phase 1 used and where they came from."""

    source: str
    kind: str
    interface: str | None
    addresses: list[str]
    gateway: str | None
    api: ApiJSON | None
    skipped: list[str]
    override: dict[str, object] | None  # `ManagementOverride.to_json`
    base: str | None


@dataclass
class ManagementSource:
    """The management facts phase 1 uses, and where they come from."""

    document: DeviceState | None
    source: str  # a sentence: "revision 3", "management.json (revision 3)", …
    kind: str  # override | management-file | revision | config | fallback | newest-revision | none
    skipped: list[str] = field(default_factory=list)  # sources not used, each with why
    override: ManagementOverride | None = None  # the console override laid over `document`
    base: str | None = None  # what the override was laid over

    def to_json(self) -> ManagementSourceJSON:
        mgmt = self.document.spec.management if self.document is not None else None
        return {
            "source": self.source,
            "kind": self.kind,
            "interface": mgmt.interface if mgmt else None,
            "addresses": list(mgmt.addresses) if mgmt else [],
            "gateway": mgmt.gateway if mgmt else None,
            "api": {"port": mgmt.api.port, "bind": mgmt.api.bind} if mgmt else None,
            "skipped": list(self.skipped),
            "override": self.override.to_json() if self.override is not None else None,
            "base": self.base,
        }


def _committed_version(state: StateDir, skipped: list[str]) -> tuple[int, str | None, bool]:
    """The version management must come up as, its document digest, whether a confirmation expired."""
    journal = state.journal
    open_txn = journal.open_transaction()
    version: int = 0
    digest: str | None = None
    try:
        applied = state.applied_record()
        version, digest = applied.version, applied.digest
    except StateFileError as exc:
        skipped.append(f"{exc}: the last commit is taken from the journal")
        for transaction in reversed(journal.transactions()):
            terminal = transaction.terminal
            if terminal is not None and terminal["type"] == "commit":
                if transaction.kind == Kind.RECONCILE:
                    continue
                version = int(terminal.get("version") or 0)
                digest = transaction.begin.get("digest")
                break
    if open_txn is not None:
        previous = open_txn.begin.get("previous_applied") or {}
        version = int(previous.get("version") or 0)
        digest = previous.get("digest")
    pending = read_pending(state)
    if pending and decide(pending, version, time.time()) == "expired":
        # The applied version was never confirmed and its time is up: management
        # comes up as it was confirmed; recovery rolls the rest back.
        return int(pending.get("confirmed_version", version)), None, True
    return version, str(digest) if digest else None, False


def _revision(
    state: StateDir, version: int, skipped: list[str], digest: str | None = None
) -> DeviceState | None:
    try:
        record = state.revision(version, digest)
    except StateFileError as exc:
        skipped.append(str(exc))
        return None
    if record is None:
        skipped.append(f"revision {version}: missing from {state.root}/revisions")
        return None
    try:
        return parse_document(record["document"], f"revision {version}")
    except DocumentError as exc:
        skipped.append(str(exc))
        return None


def management_source(
    state: StateDir,
    *,
    config: DeviceState | None = None,
    config_path: str | None = None,
    fallback_path: str | Path | None = None,
) -> ManagementSource:
    """The management facts the agent brings up first, from the first readable source."""
    skipped: list[str] = []
    found = _base_source(state, config, config_path, fallback_path, skipped)
    try:
        override = read_override(state.root)
    except StateFileError as exc:
        skipped.append(f"{exc}: the console override cannot be used")
        override = None
    except OSError as exc:
        skipped.append(f"{state.root / OVERRIDE_FILE}: {exc.strerror}")
        override = None
    if override is None:
        return found
    where = f"{OVERRIDE_FILE} (set by {override.actor} at {override.set_at})"
    try:
        document = (
            with_management(found.document, override.facts.to_json(), source=where)
            if found.document is not None
            else document_from_facts(override.facts.to_json(), source=where)
        )
    except DocumentError as exc:
        skipped.append(f"{exc}: the console override cannot be used")
        return found
    return ManagementSource(
        document,
        where,
        "override",
        skipped + found.skipped,
        override=override,
        base=found.source if found.document is not None else None,
    )


def _base_source(
    state: StateDir,
    config: DeviceState | None,
    config_path: str | None,
    fallback_path: str | Path | None,
    skipped: list[str],
) -> ManagementSource:
    version, digest, expired = _committed_version(state, skipped)
    facts = read_management(state.root)
    management_path = state.root / MANAGEMENT_FILE
    if facts is None and management_path.exists():
        skipped.append(f"{management_path}: not readable or its checksum does not match")
    elif facts is not None:
        stale = bool(
            expired
            or (version and facts.get("version") not in (None, version))
            or (digest and facts.get("digest") not in (None, digest))
        )
        if stale:
            skipped.append(
                f"{management_path}: holds revision {facts.get('version')}, management comes "
                f"up as revision {version}"
            )
        else:
            try:
                return ManagementSource(
                    document_from_facts(dict(facts), source=str(management_path)),
                    f"{MANAGEMENT_FILE} (revision {facts.get('version')})",
                    "management-file",
                    skipped,
                )
            except DocumentError as exc:
                skipped.append(str(exc))
    if version:
        document = _revision(state, version, skipped, digest)
        if document is not None:
            what = f"revision {version}" + (" (last confirmed)" if expired else "")
            return ManagementSource(document, what, "revision", skipped)
    if config is not None:
        return ManagementSource(config, f"config {config_path}", "config", skipped)
    if fallback_path:
        try:
            return ManagementSource(
                load_document(fallback_path), f"fallback {fallback_path}", "fallback", skipped
            )
        except DocumentError as exc:
            skipped.append(f"management fallback unreadable: {exc}")
    for newest in reversed(state.revision_versions()):
        if newest == version:
            continue
        document = _revision(state, newest, skipped)
        if document is not None:
            return ManagementSource(
                document,
                f"revision {newest} (the newest accepted: nothing committed is readable)",
                "newest-revision",
                skipped,
            )
    return ManagementSource(None, "none", "none", skipped)
