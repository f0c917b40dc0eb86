"""Whether the audit log vouches for a webhook target and a tenant's allowlist.

Before a delivery opens a target's sealed signing secret and secret header, the
target's row is compared with its audited state (url, name, sealed columns; no
break in the chain after it), and the tenant's allowlist with its audited
entries. A row rewritten in the database (a url pointed elsewhere, a deleted
target brought back) would otherwise hand the opened header value to whoever
chose the new url. An allowlist the log does not vouch for counts as empty.
"""

from __future__ import annotations

import hmac
import logging
from typing import Any

from sqlalchemy import Connection

from trueup.server.coverage import TARGET_COLUMNS, CoverFacts, target_state
from trueup.server.service.notify.allowlist import load_allowlist
from trueup.server.service.notify.policy import Allowlist
from trueup.server.service.store import Store

__all__ = ["VERIFY_HINT", "audited_allowlist", "unaudited_target"]

_log = logging.getLogger(__name__)

VERIFY_HINT = (
    "; not delivered (run `trueup server audit verify`; delete the target and add it again)"
)


def unaudited_target(store: Store, facts: CoverFacts, row: Any) -> str | None:
    """Why the audit log does not vouch for sending to this target row; None if it does."""
    fact = facts.targets.get(row["id"])
    if fact is None:
        suffix = f".deleted-{row['id']}"
        name = str(row["name"])
        name = name[: -len(suffix)] if name.endswith(suffix) else name
        old = facts.old_targets.get((row["tenant_id"], name))
        if old is None:
            return f"target {row['id']}: it has no audit entry (inserted directly){VERIFY_HINT}"
        if row["url"] != old[1]:
            return f"target {row['id']}: its url differs from the audited one{VERIFY_HINT}"
        return None  # audited by an older trueup: only its url is in the log
    fields, sealed = target_state(store.key, row)
    for column in TARGET_COLUMNS:
        if column in fact.fields and fields[column] != fact.fields[column]:
            return (
                f"target {row['id']}: its {column} differs from the audited one "
                f"(seq={fact.seq}){VERIFY_HINT}"
            )
    if not hmac.compare_digest(sealed, fact.sealed_digest):
        return (
            f"target {row['id']}: its sealed secrets differ from the audited ones "
            f"(seq={fact.seq}){VERIFY_HINT}"
        )
    broken = store.audit_break_after(fact.seq)
    if broken is not None:
        return (
            f"target {row['id']}: the audit log does not hold together at seq={broken}, "
            f"after the target was last audited (seq={fact.seq}): its deletion may have "
            f"been removed from the log{VERIFY_HINT}"
        )
    return None


def audited_allowlist(
    store: Store, conn: Connection, facts: CoverFacts, tenant_id: int
) -> Allowlist:
    """The tenant's allowlist if the log vouches for it; otherwise none (fails closed)."""
    live = load_allowlist(conn, tenant_id)
    if not live.entries():
        return live
    audited = facts.allowlists.get(tenant_id)
    if (
        audited is None
        or live.entries() != audited[1]
        or store.audit_break_after(audited[0]) is not None
    ):
        _log.error(
            "tenant id=%s: its webhook allowlist differs from the audited one (or the "
            "audit chain is broken after it); deliveries use none — run "
            "`trueup server audit verify`",
            tenant_id,
        )
        return Allowlist()
    return live
