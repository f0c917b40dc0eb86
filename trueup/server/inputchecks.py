"""`audit verify`'s checks of the fleet inputs: every stored profile version and every
device's variables and own layer compared with the entry that wrote it.

A profile version is covered by its `profile.create|update|delete` entry (its digest,
whether it deleted the profile, who wrote it, the comment) and its document must hash to
that digest; a device's inputs by its newest `device.variables` entry (version, digests
of the variables and of the own layer). A row without an entry was inserted directly;
an audited profile version missing from the table was deleted behind the server's back.
`audit.verify` runs CHECKS after coverchecks.CHECKS.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Connection, select

from trueup.model.digests import json_digest
from trueup.server.coverage import CoverFacts
from trueup.server.coverchecks import Finding, differs
from trueup.server.keys import ServerKey
from trueup.server.tables import device_inputs, devices, profiles, tenants

__all__ = ["CHECKS", "check_device_inputs", "check_profiles"]


def _json_digest(text: str | None) -> str | None:
    if text is None:
        return None
    try:
        value: Any = json.loads(text)
    except ValueError:
        return "unreadable"
    return json_digest(value)


def check_profiles(conn: Connection, _key: ServerKey, facts: CoverFacts) -> list[Finding]:
    """Each stored profile version as its audited write recorded it."""
    found = []
    names = {r.id: r.name for r in conn.execute(select(tenants.c.id, tenants.c.name))}
    live = set()
    for row in conn.execute(select(profiles).order_by(profiles.c.id)).mappings():
        ident = (row["tenant_id"], row["name"], row["version"])
        live.add(ident)
        label = f"{row['name']} version {row['version']} (tenant {names.get(row['tenant_id'])})"
        fact = facts.profiles.get(ident)
        if fact is None:
            found.append(Finding("profile", label, "has no audit entry (inserted directly)"))
            continue
        if row["digest"] != fact.digest:
            found.append(
                Finding("profile", label, differs("digest", row["digest"], fact.digest, fact.seq))
            )
        if _json_digest(row["document"]) != fact.digest:
            found.append(
                Finding(
                    "profile",
                    label,
                    f"its document does not hash to the audited digest (seq={fact.seq}): "
                    "changed behind the server's back",
                )
            )
        if bool(row["deleted"]) != fact.deleted:
            found.append(
                Finding(
                    "profile",
                    label,
                    differs("deleted", bool(row["deleted"]), fact.deleted, fact.seq),
                )
            )
        if row["created_by"] != fact.actor:
            found.append(
                Finding(
                    "profile", label, differs("created_by", row["created_by"], fact.actor, fact.seq)
                )
            )
        if fact.comment is not None and row["comment"] != fact.comment:
            found.append(
                Finding(
                    "profile", label, differs("comment", row["comment"], fact.comment, fact.seq)
                )
            )
    for ident, fact in sorted(facts.profiles.items(), key=lambda item: item[1].seq):
        if ident not in live:
            tenant_id, name, version = ident
            found.append(
                Finding(
                    "profile",
                    f"{name} version {version} (tenant {names.get(tenant_id or 0)})",
                    f"audited at seq={fact.seq} but missing from the table (deleted)",
                )
            )
    return found


def check_device_inputs(conn: Connection, _key: ServerKey, facts: CoverFacts) -> list[Finding]:
    """Each device's variables and own layer as its newest audited write recorded them."""
    found = []
    names = dict(conn.execute(select(devices.c.id, devices.c.name)).all())
    live = set()
    for row in conn.execute(select(device_inputs).order_by(device_inputs.c.device_id)).mappings():
        device_id = row["device_id"]
        live.add(device_id)
        label = f"variables of {names.get(device_id, device_id)}"
        fact = facts.inputs.get(device_id)
        if fact is None:
            found.append(Finding("device inputs", label, "has no audit entry (inserted directly)"))
            continue
        if row["version"] != fact.version:
            found.append(
                Finding(
                    "device inputs",
                    label,
                    f"the live row is version {row['version']}, the log's newest is version "
                    f"{fact.version} (seq={fact.seq}): changed behind the server's back",
                )
            )
            continue
        variables = _json_digest(row["variables"])
        if variables != fact.variables_digest:
            found.append(
                Finding(
                    "device inputs",
                    label,
                    differs("variables", variables, fact.variables_digest, fact.seq),
                )
            )
        own = _json_digest(row["own"])
        if own != fact.own_digest:
            found.append(
                Finding(
                    "device inputs", label, differs("own layer", own, fact.own_digest, fact.seq)
                )
            )
    for device_id, fact in sorted(facts.inputs.items()):
        if device_id not in live:
            found.append(
                Finding(
                    "device inputs",
                    f"variables of {names.get(device_id, device_id)}",
                    f"audited at seq={fact.seq} but missing from the table (deleted)",
                )
            )
    return found


CHECKS = {"profile versions": check_profiles, "device inputs": check_device_inputs}
