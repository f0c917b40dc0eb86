"""What the audit log vouches for beyond credentials: secret versions, notification
targets, evidence bundles, revision metadata, device labels, profile versions and
device inputs.

Who calls it: the writers (service/secrets.py, service/notify/routing.py,
service/revisions.py, service/evidence.py, service/profiles.py,
service/deviceinputs.py) record what this module's replay
reads; `audit.verify` runs the checks in coverchecks.py over the replay; and
the data paths ask `CoverLog` before they serve a value:

- a device's secret is served only if its row is the newest audited version of
  that secret and its value matches the audited keyed digest;
- an evidence bundle is served only if its sha256 and size are the audited
  ones, and its bytes hash to them;
- a device's desired revision is served to its agent only if it is the newest
  audited revision of the device, its document hashes to the audited content
  hash, and the chain holds together after it.

Nothing secret goes into the log: a secret is recorded by a version number and
an HMAC under the server key (purpose "secret-digest") over the secret's
identity and value, never its plaintext or a plain hash of it; a notification
target's sealed signing secret by an HMAC over its sealed columns.

Entries written by an older trueup lack some of these fields; the replay keeps
what they do say (a secret's id, an evidence bundle's sha256) and leaves the
rest None, which the checks report as "not covered".

Why this module is over 400 lines: the one replay of the log (`CoverFacts`,
`replay`) that every covered table's check and every data path reads; each
audited action adds one short branch beside the others, and splitting would
split the single pass over the log.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypedDict

from sqlalchemy import Connection, RowMapping, select

from trueup.model.digests import canonical_json
from trueup.model.jsontypes import JSONObject
from trueup.server.keys import ServerKey
from trueup.server.tables import audit_log, notify_targets

__all__ = [
    "APPLIERS",
    "TARGET_COLUMNS",
    "TARGET_SEALED_COLUMNS",
    "Applier",
    "CoverFacts",
    "CoverLog",
    "EvidenceFact",
    "InputsFact",
    "ProfileFact",
    "RevisionFact",
    "SecretVersion",
    "TargetAuditDetail",
    "TargetFact",
    "replay",
    "secret_digest",
    "target_audit_detail",
    "target_state",
]

# The columns of a notification target whose values the log records as they are, and the
# ones (sealed material) it records only through one keyed digest. A new security-relevant
# column of `notify_targets` is added to one of these lists; nothing else changes.
TARGET_COLUMNS: tuple[str, ...] = (
    "tenant_id",
    "name",
    "url",
    "secret_id",
    "auth_header_name",
    "auth_header_secret_id",
    "deleted_at",
)
TARGET_SEALED_COLUMNS: tuple[str, ...] = (
    "nonce",
    "ciphertext",
    "auth_header_nonce",
    "auth_header_ciphertext",
)

_GENESIS = "0" * 64


def _hmac(key: bytes, body: bytes) -> str:
    return hmac.new(key, body, hashlib.sha256).hexdigest()


def secret_digest(
    server_key: ServerKey,
    *,
    secret_id: str,
    tenant_id: int,
    device_id: int,
    name: str,
    value: bytes,
) -> str:
    """The keyed digest of a secret's value the log records (and the read path compares)."""
    identity = canonical_json([secret_id, tenant_id, device_id, name])
    return _hmac(server_key.derive("secret-digest"), identity + b"\n" + value)


def target_state(server_key: ServerKey, row: RowMapping) -> tuple[JSONObject, str]:
    """A target row's audited columns as they are (`TARGET_COLUMNS`: the log records them as
    JSON, and compares them as read back), and the keyed digest of its sealed ones."""
    fields = {column: row[column] for column in TARGET_COLUMNS}
    sealed = [
        None if row[column] is None else bytes(row[column]).hex()
        for column in TARGET_SEALED_COLUMNS
    ]
    body = canonical_json([row["id"], row["tenant_id"], sealed])
    return fields, _hmac(server_key.derive("notify-target-seal"), body)


def target_audit_detail(
    conn: Connection, server_key: ServerKey, target_id: int
) -> TargetAuditDetail:
    """What an audited write of a target records: its id and its state after the write."""
    row = conn.execute(select(notify_targets).where(notify_targets.c.id == target_id)).mappings()
    fields, sealed = target_state(server_key, row.one())
    return {"target_id": target_id, "fields": fields, "sealed_digest": sealed}


class TargetAuditDetail(TypedDict):
    """What an audited write of a notification target records of it."""

    target_id: int
    fields: JSONObject  # `TARGET_COLUMNS`, as they are
    sealed_digest: str


# -- the replay -----------------------------------------------------------------------------


@dataclass(frozen=True)
class SecretVersion:
    seq: int
    secret_id: str
    version: int
    digest: str | None  # None: written by an older trueup


@dataclass(frozen=True)
class TargetFact:
    seq: int
    fields: JSONObject  # `TARGET_COLUMNS` as the log recorded them
    sealed_digest: str


@dataclass(frozen=True)
class EvidenceFact:
    seq: int
    tenant_id: int | None
    device_id: int
    sha256: str
    size: int


@dataclass(frozen=True)
class ProfileFact:
    seq: int
    digest: str
    deleted: bool
    actor: str
    comment: str | None


@dataclass(frozen=True)
class InputsFact:
    seq: int
    version: int
    variables_digest: str | None
    own_digest: str | None


@dataclass(frozen=True)
class RevisionFact:
    seq: int
    author: str
    comment: str | None  # None: written by an older trueup
    content_hash: str | None = None
    confirm_within: int | None = None  # the confirmation window it is delivered with


@dataclass
class CoverFacts:
    # (device id, secret name) -> every audited version, oldest first; and deletions
    secrets: dict[tuple[int, str], list[SecretVersion]] = field(default_factory=dict)
    secret_ids: dict[str, tuple[int, str, SecretVersion]] = field(default_factory=dict)
    deleted_secrets: dict[tuple[int, str], int] = field(default_factory=dict)
    targets: dict[int, TargetFact] = field(default_factory=dict)
    # Targets audited by an older trueup: (tenant, name) -> (seq, url)
    old_targets: dict[tuple[int | None, str], tuple[int, str]] = field(default_factory=dict)
    evidence: dict[int, EvidenceFact] = field(default_factory=dict)
    deleted_evidence: dict[int, int] = field(default_factory=dict)
    revisions: dict[tuple[int, int], RevisionFact] = field(default_factory=dict)
    # (device id, version) -> seq of its `revision.rolled_back`: the agent rolled it back
    rolled_back: dict[tuple[int, int | None], int] = field(default_factory=dict)
    # tenant id -> (seq, entries) of its newest audited webhook allowlist
    allowlists: dict[int, tuple[int, list[str]]] = field(default_factory=dict)
    # device id -> (seq, labels) of its newest audited `device.labels`
    labels: dict[int, tuple[int, dict[str, str]]] = field(default_factory=dict)
    device_ids: dict[tuple[int | None, str], int] = field(default_factory=dict)
    # (tenant id, profile name, version) -> what its write audited
    profiles: dict[tuple[int | None, str, int], ProfileFact] = field(default_factory=dict)
    # device id -> its newest audited variables and own layer
    inputs: dict[int, InputsFact] = field(default_factory=dict)

    def newest_secret(self, device_id: int, name: str) -> SecretVersion | None:
        versions = self.secrets.get((device_id, name))
        return versions[-1] if versions else None


def _int(detail: JSONObject, key: str) -> int | None:
    value = detail.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(detail: JSONObject, key: str) -> str | None:
    value = detail.get(key)
    return value if isinstance(value, str) else None


def _after(target: str, prefix: str) -> str | None:
    return target[len(prefix) :] if target.startswith(prefix) else None


def _device_id(facts: CoverFacts, entry: RowMapping, detail: JSONObject) -> int | None:
    device_id = _int(detail, "device_id")
    if device_id is None:  # older entries name the device in the target
        name = _after(str(entry["target"]), "device:")
        if name is not None:
            device_id = facts.device_ids.get((entry["tenant_id"], name.split("/", 1)[0]))
    return device_id


def _apply_secret(facts: CoverFacts, entry: RowMapping, detail: JSONObject) -> None:
    target = str(entry["target"])
    name = _str(detail, "name") or (
        target.split("/secret:", 1)[1] if "/secret:" in target else None
    )
    device_id = _device_id(facts, entry, detail)
    if name is None or device_id is None:
        return  # malformed: audit.verify names the entry
    key = (device_id, name)
    if entry["action"] == "secret.delete":
        facts.secrets.pop(key, None)
        facts.deleted_secrets[key] = int(entry["seq"])
        return
    secret_id = _str(detail, "secret_id")
    if secret_id is None:
        return
    versions = facts.secrets.setdefault(key, [])
    facts.deleted_secrets.pop(key, None)
    version = _int(detail, "version") or (versions[-1].version + 1 if versions else 1)
    fact = SecretVersion(int(entry["seq"]), secret_id, version, _str(detail, "digest"))
    versions.append(fact)
    facts.secret_ids[secret_id] = (device_id, name, fact)


def _apply_target(facts: CoverFacts, entry: RowMapping, detail: JSONObject) -> None:
    target_id = _int(detail, "target_id")
    fields = detail.get("fields")
    sealed = _str(detail, "sealed_digest")
    if target_id is not None and isinstance(fields, dict) and sealed is not None:
        facts.targets[target_id] = TargetFact(int(entry["seq"]), fields, sealed)
        return
    name = _after(str(entry["target"]), "notify-target:")
    url = _str(detail, "url")
    if name is not None and url is not None and entry["action"] == "notify.target.create":
        facts.old_targets[(entry["tenant_id"], name)] = (int(entry["seq"]), url)


def _apply_evidence(facts: CoverFacts, entry: RowMapping, detail: JSONObject) -> None:
    evidence_id = _int(detail, "evidence_id")
    if evidence_id is None:
        return
    if entry["action"] == "evidence.delete":
        facts.evidence.pop(evidence_id, None)
        facts.deleted_evidence[evidence_id] = int(entry["seq"])
        return
    device_id, sha256, size = (
        _int(detail, "device_id"),
        _str(detail, "sha256"),
        _int(detail, "size"),
    )
    if device_id is None or sha256 is None or size is None:
        return
    facts.evidence[evidence_id] = EvidenceFact(
        int(entry["seq"]), entry["tenant_id"], device_id, sha256, size
    )


def _apply_revision(facts: CoverFacts, entry: RowMapping, detail: JSONObject) -> None:
    device_id, version = _int(detail, "device_id"), _int(detail, "version")
    if device_id is None or version is None:
        return
    author = _str(detail, "author") or str(entry["actor"])
    facts.revisions[(device_id, version)] = RevisionFact(
        int(entry["seq"]),
        author,
        _str(detail, "comment"),
        _str(detail, "content_hash"),
        _int(detail, "confirm_within"),
    )


def _apply_device(facts: CoverFacts, entry: RowMapping, detail: JSONObject) -> None:
    device_id, name = _int(detail, "device_id"), _after(str(entry["target"]), "device:")
    if device_id is not None and name is not None:
        facts.device_ids[(entry["tenant_id"], name)] = device_id


def _apply_rolled_back(facts: CoverFacts, entry: RowMapping, detail: JSONObject) -> None:
    # `version` None: an apply that failed before it took a version.
    device_id = _int(detail, "device_id")
    if device_id is not None:
        facts.rolled_back[(device_id, _int(detail, "version"))] = int(entry["seq"])


def _apply_profile(facts: CoverFacts, entry: RowMapping, detail: JSONObject) -> None:
    name, version, digest = _str(detail, "name"), _int(detail, "version"), _str(detail, "digest")
    if name is not None and version is not None and digest is not None:
        deleted, comment = entry["action"] == "profile.delete", _str(detail, "comment")
        fact = ProfileFact(int(entry["seq"]), digest, deleted, str(entry["actor"]), comment)
        facts.profiles[(entry["tenant_id"], name, version)] = fact


def _apply_inputs(facts: CoverFacts, entry: RowMapping, detail: JSONObject) -> None:
    device_id, version = _int(detail, "device_id"), _int(detail, "version")
    if device_id is not None and version is not None:
        facts.inputs[device_id] = InputsFact(
            int(entry["seq"]),
            version,
            _str(detail, "variables_digest"),
            _str(detail, "own_digest"),
        )


def _apply_labels(facts: CoverFacts, entry: RowMapping, detail: JSONObject) -> None:
    device_id, new = _int(detail, "device_id"), detail.get("new")
    if device_id is not None and isinstance(new, dict):
        facts.labels[device_id] = (int(entry["seq"]), {str(k): str(v) for k, v in new.items()})


def _apply_allowlist(facts: CoverFacts, entry: RowMapping, detail: JSONObject) -> None:
    entries = detail.get("entries")
    if isinstance(entry["tenant_id"], int) and isinstance(entries, list):
        facts.allowlists[entry["tenant_id"]] = (int(entry["seq"]), [str(e) for e in entries])


Applier = Callable[[CoverFacts, RowMapping, JSONObject], None]

# Every audited action this replay reads, and what it does with the entry: declared once,
# as audittables.py declares the actions verification reads. An action not named here
# vouches for nothing the data paths serve.
APPLIERS: dict[str, Applier] = {
    "device.create": _apply_device,
    "device.labels": _apply_labels,
    "device.variables": _apply_inputs,
    "evidence.delete": _apply_evidence,
    "evidence.upload": _apply_evidence,
    "notify.allowlist.set": _apply_allowlist,
    "notify.target.create": _apply_target,
    "notify.target.delete": _apply_target,
    "profile.create": _apply_profile,
    "profile.delete": _apply_profile,
    "profile.update": _apply_profile,
    "revision.create": _apply_revision,
    "revision.rolled_back": _apply_rolled_back,
    "secret.delete": _apply_secret,
    "secret.put": _apply_secret,
}


def apply(facts: CoverFacts, entry: RowMapping) -> None:
    """Apply one authenticated entry (malformed details are audit.verify's to name)."""
    applier = APPLIERS.get(str(entry["action"]))
    if applier is None:
        return
    try:
        detail = json.loads(entry["detail"])
    except (TypeError, ValueError):
        return
    if isinstance(detail, dict):
        applier(facts, entry, detail)


def replay(entries: Iterable[RowMapping]) -> CoverFacts:
    """The facts of `entries` (authenticated rows, in order)."""
    facts = CoverFacts()
    for entry in entries:
        apply(facts, entry)
    return facts


# -- the data paths' view ----------------------------------------------------------------------


class CoverLog:
    """The replay, kept current incrementally, for the paths that serve secrets and evidence.

    Each `refresh` reads the rows appended since the previous one; a row whose
    HMAC does not hold is skipped, and a row that does not extend the chain (a
    gap in the sequence, a broken link, an edited row) is remembered as a break:
    a secret whose newest audited version is older than a break may have had a
    newer version whose entry was deleted, so it is not served. If the row last
    read is gone (a restored database), the replay starts over. Thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._facts = CoverFacts()
        self._last: tuple[int, str] = (0, _GENESIS)
        self._breaks: list[int] = []

    def refresh(self, conn: Connection, intact: Callable[[Any], bool]) -> CoverFacts:
        """Read what was appended since the last call; `intact(row)` checks a row's HMAC."""
        with self._lock:
            seq = self._last[0]
            rows = list(
                conn.execute(
                    select(audit_log).where(audit_log.c.seq >= seq).order_by(audit_log.c.seq)
                ).mappings()
            )
            if seq > 0:
                if rows and (rows[0]["seq"], rows[0]["row_hash"]) == self._last:
                    rows = rows[1:]
                else:
                    self._facts, self._last, self._breaks = CoverFacts(), (0, _GENESIS), []
                    rows = list(
                        conn.execute(select(audit_log).order_by(audit_log.c.seq)).mappings()
                    )
            for row in rows:
                authentic = intact(row)
                last_seq, last_hash = self._last
                if not authentic or row["seq"] != last_seq + 1 or row["prev_hash"] != last_hash:
                    self._breaks.append(int(row["seq"]))
                if authentic:
                    apply(self._facts, row)
                self._last = (int(row["seq"]), str(row["row_hash"]))
            return self._facts

    def break_after(self, seq: int) -> int | None:
        """The first place after `seq` where the chain does not hold together, if any."""
        with self._lock:
            return next((b for b in self._breaks if b > seq), None)
