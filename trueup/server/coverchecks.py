"""The checks `audit verify` runs over coverage.py's replay: each live secret, notification
target, evidence bundle, revision, device confirmation and device's labels compared with
what the log audited.

Who calls it: `audit.verify` (CHECKS), which turns each Finding into an
AuditProblem. The existence of rows (inserted directly, deleted) that audit.py
already checks for secrets and revisions is not repeated here; this module
adds what audit.py did not cover: secret versions and values, deleted secrets,
notification targets, evidence bundles and their content, revision metadata
(author, comment, confirmation window), each device's rolled-back confirmation
and each device's labels.

Why this module is over 400 lines: every table the log vouches for beyond
credentials has its check here, beside the others and the one `CHECKS`
registry `audit.verify` runs, so that a new covered table is one function and
one entry in this file.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable
from typing import Any, NamedTuple

from sqlalchemy import Connection, select

from trueup.server.coverage import (
    TARGET_COLUMNS,
    CoverFacts,
    secret_digest,
    target_state,
)
from trueup.server.keys import SecretBox, SecretRefused, ServerKey
from trueup.server.tables import (
    device_confirmation,
    device_labels,
    devices,
    evidence,
    evidence_chunks,
    notify_allowlists,
    notify_targets,
    revisions,
    secrets,
    tenants,
)

__all__ = ["CHECKS", "Finding", "differs"]


class Finding(NamedTuple):
    table: str
    row: str
    problem: str
    gap: bool = False


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def differs(what: str, live: Any, audited: Any, seq: int) -> str:
    return (
        f"{what} differs from the audited one (seq={seq}): {_short(live)} instead of "
        f"{_short(audited)} (changed behind the server's back)"
    )


def _tenant_names(conn: Connection) -> dict[int, str]:
    return {r.id: r.name for r in conn.execute(select(tenants.c.id, tenants.c.name))}


def _device_names(conn: Connection) -> dict[int, tuple[str, str]]:
    rows = conn.execute(
        select(devices.c.id, devices.c.name, tenants.c.name.label("tenant")).join(
            tenants, tenants.c.id == devices.c.tenant_id
        )
    )
    return {r.id: (r.tenant, r.name) for r in rows}


def _secret_label(names: dict[int, tuple[str, str]], device_id: int, name: str) -> str:
    tenant, device = names.get(device_id, ("?", f"id={device_id}"))
    return f"{name} (tenant {tenant}, device {device})"


def _value_problem(key: ServerKey, row: Any, wrapped: bytes | None, digest: str) -> str | None:
    try:
        if wrapped is None:
            raise SecretRefused("its tenant has no data key")
        box = SecretBox(row["tenant_id"], key.unwrap_tenant_key(row["tenant_id"], wrapped))
        value = box.open(row["id"], row["nonce"], row["ciphertext"])
    except (SecretRefused, ValueError) as exc:
        return f"does not open ({exc}); it is not served"
    live = secret_digest(
        key,
        secret_id=row["id"],
        tenant_id=row["tenant_id"],
        device_id=row["device_id"],
        name=row["name"],
        value=value,
    )
    if not hmac.compare_digest(live, digest):
        return "its value differs from the audited digest (changed behind the server's back)"
    return None


def check_secrets(conn: Connection, key: ServerKey, facts: CoverFacts) -> list[Finding]:
    """The version a device gets is the newest audited one, with the audited value; every
    audited secret not audited as deleted is still there."""
    found = []
    names = _device_names(conn)
    wrapped = dict(conn.execute(select(tenants.c.id, tenants.c.data_key_wrapped)).all())
    live = set()
    for row in conn.execute(select(secrets).order_by(secrets.c.id)).mappings():
        live.add((row["device_id"], row["name"]))
        audited = facts.secret_ids.get(row["id"])
        if audited is None:
            continue  # audit.py names a row without an audit entry
        device_id, name, version = audited
        label = _secret_label(names, device_id, name)
        newest = facts.newest_secret(device_id, name)
        if newest is None:
            seq = facts.deleted_secrets.get((device_id, name))
            found.append(Finding("secret", label, f"deleted at seq={seq} but still present"))
        elif newest.secret_id != row["id"]:
            found.append(
                Finding(
                    "secret",
                    label,
                    f"the live row is version {version.version}, the log's newest is version "
                    f"{newest.version} (seq={newest.seq}): rolled back behind the server's "
                    "back? The device is refused this secret",
                )
            )
        elif newest.digest is None:
            found.append(
                Finding(
                    "secret",
                    label,
                    "its value's digest is not in the audit log (written by an older trueup)",
                    gap=True,
                )
            )
        else:
            problem = _value_problem(key, row, wrapped.get(row["tenant_id"]), newest.digest)
            if problem is not None:
                found.append(Finding("secret", label, problem))
    for (device_id, name), versions in sorted(facts.secrets.items()):
        if versions and (device_id, name) not in live:
            newest = versions[-1]
            found.append(
                Finding(
                    "secret",
                    _secret_label(names, device_id, name),
                    f"deleted without an audited delete (its version {newest.version} was "
                    f"audited at seq={newest.seq})",
                )
            )
    return found


def _deleted_name(row: Any) -> str:
    suffix = f".deleted-{row['id']}"
    name = str(row["name"])
    return name[: -len(suffix)] if row["deleted_at"] is not None and name.endswith(suffix) else name


def check_targets(conn: Connection, key: ServerKey, facts: CoverFacts) -> list[Finding]:
    """Every notification target as audited: its columns, its sealed signing secret."""
    found = []
    tenant_names = _tenant_names(conn)
    live = set()
    for row in conn.execute(select(notify_targets).order_by(notify_targets.c.id)).mappings():
        live.add(row["id"])
        label = f"{row['id']} (tenant {tenant_names.get(row['tenant_id'], row['tenant_id'])})"
        fact = facts.targets.get(row["id"])
        if fact is None:
            old = facts.old_targets.get((row["tenant_id"], _deleted_name(row)))
            if old is None:
                found.append(
                    Finding("notification target", label, "has no audit entry (inserted directly)")
                )
                continue
            seq, url = old
            if row["url"] != url:
                found.append(
                    Finding("notification target", label, differs("url", row["url"], url, seq))
                )
            found.append(
                Finding(
                    "notification target",
                    label,
                    "only its url is in the audit log (written by an older trueup)",
                    gap=True,
                )
            )
            continue
        fields, sealed = target_state(key, row)
        for column in TARGET_COLUMNS:
            if column not in fact.fields:
                found.append(
                    Finding(
                        "notification target",
                        label,
                        f"{column} is not in the audit log (written by an older trueup)",
                        gap=True,
                    )
                )
            elif fields[column] != fact.fields[column]:
                found.append(
                    Finding(
                        "notification target",
                        label,
                        differs(column, fields[column], fact.fields[column], fact.seq),
                    )
                )
        if not hmac.compare_digest(sealed, fact.sealed_digest):
            found.append(
                Finding(
                    "notification target",
                    label,
                    f"its sealed signing secret differs from the audited one (seq={fact.seq}): "
                    "changed behind the server's back",
                )
            )
    for target_id, fact in sorted(facts.targets.items()):
        if target_id not in live:
            found.append(
                Finding(
                    "notification target",
                    str(target_id),
                    f"audited at seq={fact.seq} but missing from the table (deleted)",
                )
            )
    return found


def check_allowlists(conn: Connection, _key: ServerKey, facts: CoverFacts) -> list[Finding]:
    """Every tenant's webhook allowlist as last audited (it decides what targets may reach)."""
    found = []
    tenant_names = _tenant_names(conn)
    live: dict[int, Any] = {
        row.tenant_id: row.entries for row in conn.execute(select(notify_allowlists))
    }
    for tenant_id in sorted(set(live) | set(facts.allowlists)):
        label = f"tenant {tenant_names.get(tenant_id, tenant_id)}"
        audited = facts.allowlists.get(tenant_id)
        if tenant_id not in live:
            if audited is not None and audited[1]:
                found.append(
                    Finding(
                        "webhook allowlist",
                        label,
                        f"audited at seq={audited[0]} but missing from the table (deleted)",
                    )
                )
            continue
        try:
            entries = json.loads(live[tenant_id])
        except (TypeError, ValueError):
            entries = live[tenant_id]
        if audited is None:
            found.append(
                Finding("webhook allowlist", label, "has no audit entry (inserted directly)")
            )
        elif entries != audited[1]:
            found.append(
                Finding(
                    "webhook allowlist", label, differs("entries", entries, audited[1], audited[0])
                )
            )
    return found


def _content(conn: Connection, evidence_id: int) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    rows = conn.execute(
        select(evidence_chunks.c.data)
        .where(evidence_chunks.c.evidence_id == evidence_id)
        .order_by(evidence_chunks.c.seq)
    )
    for (data,) in rows:
        digest.update(data)
        size += len(data)
    return digest.hexdigest(), size


def check_evidence(conn: Connection, _key: ServerKey, facts: CoverFacts) -> list[Finding]:
    """Every stored bundle audited as uploaded, with its sha256 and size, its chunks hashing
    to them; every audited upload not audited as deleted still present."""
    found = []
    names = _device_names(conn)
    live = set()
    for row in conn.execute(select(evidence).order_by(evidence.c.id)).mappings():
        live.add(row["id"])
        label = f"{row['id']} ({names.get(row['device_id'], ('?', row['device_id']))[1]})"
        fact = facts.evidence.get(row["id"])
        if fact is None:
            deleted = facts.deleted_evidence.get(row["id"])
            problem = (
                "has no audit entry (inserted directly)"
                if deleted is None
                else f"deleted at seq={deleted} but still present (restored)"
            )
            found.append(Finding("evidence bundle", label, problem))
            continue
        audited = {
            "tenant_id": fact.tenant_id,
            "device_id": fact.device_id,
            "sha256": fact.sha256,
            "size": fact.size,
        }
        for column, value in audited.items():
            if value is not None and row[column] != value:
                found.append(
                    Finding("evidence bundle", label, differs(column, row[column], value, fact.seq))
                )
        digest, size = _content(conn, row["id"])
        if digest != fact.sha256 or size != fact.size:
            found.append(
                Finding(
                    "evidence bundle",
                    label,
                    f"content digest differs from the audited one (seq={fact.seq}): its chunks "
                    f"hash to {digest} ({size} bytes), not {fact.sha256} ({fact.size} bytes); "
                    "downloads are refused",
                )
            )
    for evidence_id, fact in sorted(facts.evidence.items()):
        if evidence_id not in live:
            found.append(
                Finding(
                    "evidence bundle",
                    str(evidence_id),
                    f"uploaded at seq={fact.seq}, never audited as deleted, but missing "
                    "(deleted behind the server's back)",
                )
            )
    return found


def check_revisions(conn: Connection, _key: ServerKey, facts: CoverFacts) -> list[Finding]:
    """Each revision's author and comment as audited (its content is audit.py's check)."""
    found = []
    names = _device_names(conn)
    for rev in conn.execute(select(revisions).order_by(revisions.c.id)).mappings():
        fact = facts.revisions.get((rev["device_id"], rev["version"]))
        if fact is None:
            continue  # audit.py names a revision without an audit entry
        label = f"{rev['version']} of {names.get(rev['device_id'], ('?', rev['device_id']))[1]}"
        if rev["author"] != fact.author:
            found.append(
                Finding("revision", label, differs("author", rev["author"], fact.author, fact.seq))
            )
        if fact.comment is None:
            found.append(
                Finding(
                    "revision",
                    label,
                    "its comment is not in the audit log (written by an older trueup)",
                    gap=True,
                )
            )
        elif rev["comment"] != fact.comment:
            found.append(
                Finding(
                    "revision", label, differs("comment", rev["comment"], fact.comment, fact.seq)
                )
            )
        if rev["confirm_within"] != fact.confirm_within:
            found.append(
                Finding(
                    "revision",
                    label,
                    differs(
                        "confirmation window", rev["confirm_within"], fact.confirm_within, fact.seq
                    ),
                )
            )
    return found


def check_confirmations(conn: Connection, _key: ServerKey, facts: CoverFacts) -> list[Finding]:
    """A device's confirmation says rolled-back exactly where the log audited the rollback
    (a rollout's gate reads it: a rollback turned into `confirmed` would pass it)."""
    found = []
    names = _device_names(conn)
    for row in conn.execute(
        select(device_confirmation).order_by(device_confirmation.c.device_id)
    ).mappings():
        label = (
            f"{names.get(row['device_id'], ('?', row['device_id']))[1]} version {row['version']}"
        )
        seq = facts.rolled_back.get((row["device_id"], row["version"]))
        if seq is not None and row["state"] != "rolled-back":
            found.append(
                Finding(
                    "device_confirmation",
                    label,
                    differs("state", row["state"], "rolled-back", seq),
                )
            )
        elif seq is None and row["state"] == "rolled-back":
            found.append(
                Finding("device_confirmation", label, "rolled back, but no audit entry says so")
            )
    return found


def check_labels(conn: Connection, _key: ServerKey, facts: CoverFacts) -> list[Finding]:
    """Every device's labels as last audited (they decide which profiles render it)."""
    found = []
    names = _device_names(conn)
    live: dict[int, dict[str, str]] = {}
    for row in conn.execute(
        select(device_labels.c.device_id, device_labels.c.key, device_labels.c.value)
    ):
        live.setdefault(row.device_id, {})[row.key] = row.value
    for device_id in sorted(set(live) | set(facts.labels)):
        label = "/".join(names.get(device_id, ("?", str(device_id))))
        audited = facts.labels.get(device_id)
        labels = live.get(device_id, {})
        if audited is None:
            found.append(Finding("device labels", label, "have no audit entry (inserted directly)"))
        elif labels != audited[1]:
            found.append(
                Finding(
                    "device labels",
                    label,
                    differs("labels", labels, audited[1], audited[0]),
                )
            )
    return found


CHECKS: dict[str, Callable[[Connection, ServerKey, CoverFacts], list[Finding]]] = {
    "secret versions": check_secrets,
    "notification targets": check_targets,
    "webhook allowlists": check_allowlists,
    "evidence bundles": check_evidence,
    "revision metadata": check_revisions,
    "device confirmations": check_confirmations,
    "device labels": check_labels,
}
