"""The rows of `device_labels`, read and written inside a caller's transaction.

Shared like `store.py`: the labels unit writes them, enrollment writes a new
device's first labels in the transaction that creates it, and the fleet view
reads them for its entries and its selector filter. Every write goes through
`replace_labels`, which checks the labels (Kubernetes rules, at most
LABELS_MAX) and appends the `device.labels` audit entry with the whole set
before and after in the same transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import Connection, and_, delete, select

from trueup.model.layering import Selector, SelectorError, label_problems, parse_selector
from trueup.server.limits import LABELS_MAX
from trueup.server.service.errors import Invalid
from trueup.server.service.store import Store
from trueup.server.tables import device_labels

__all__ = [
    "checked_labels",
    "checked_selector",
    "labels_of",
    "replace_labels",
    "tenant_labels",
]


def checked_labels(labels: Any, *, where: str = "labels") -> dict[str, str]:
    """`labels` as a dict of strings, or Invalid naming `labels.<key>` and what is expected."""
    if not isinstance(labels, Mapping):
        raise Invalid([f"{where}: expected an object of label keys to string values"])
    problems = label_problems(labels)
    if where != "labels":
        problems = [where + problem.removeprefix("labels") for problem in problems]
    if len(labels) > LABELS_MAX:
        problems.append(f"{where}: {len(labels)} labels; a device carries at most {LABELS_MAX}")
    if problems:
        raise Invalid(problems)
    return {str(key): str(value) for key, value in labels.items()}


def checked_selector(text: str | None, *, where: str = "selector") -> Selector | None:
    """The parsed selector (None when not given), or Invalid naming `where` and the position."""
    if text is None:
        return None
    try:
        return parse_selector(text)
    except SelectorError as exc:
        raise Invalid([f"{where}: {exc}"]) from None


def labels_of(conn: Connection, device_id: int) -> dict[str, str]:
    rows = conn.execute(
        select(device_labels.c.key, device_labels.c.value)
        .where(device_labels.c.device_id == device_id)
        .order_by(device_labels.c.key)
    )
    return {row.key: row.value for row in rows}


def tenant_labels(
    conn: Connection, tenant_id: int, device_ids: Iterable[int] | None = None
) -> dict[int, dict[str, str]]:
    """Every labelled device of the tenant (or of `device_ids`): device id -> its labels."""
    query = select(device_labels.c.device_id, device_labels.c.key, device_labels.c.value).where(
        device_labels.c.tenant_id == tenant_id
    )
    if device_ids is not None:
        query = query.where(device_labels.c.device_id.in_(list(device_ids)))
    out: dict[int, dict[str, str]] = {}
    for row in conn.execute(query.order_by(device_labels.c.device_id, device_labels.c.key)):
        out.setdefault(row.device_id, {})[row.key] = row.value
    return out


def replace_labels(
    conn: Connection,
    store: Store,
    *,
    tenant_id: int,
    device_id: int,
    device: str,
    labels: Mapping[str, str],
    actor: str,
) -> tuple[dict[str, str], dict[str, str]]:
    """Make the device's labels exactly `labels` (checked first) and audit it; (old, new).

    Nothing is written and nothing audited when the set does not change.
    """
    new = dict(sorted(checked_labels(labels).items()))
    old = labels_of(conn, device_id)
    if new == old:
        return old, new
    gone = [key for key in old if key not in new or old[key] != new[key]]
    if gone:
        conn.execute(
            delete(device_labels).where(
                and_(device_labels.c.device_id == device_id, device_labels.c.key.in_(gone))
            )
        )
    added = [
        {"tenant_id": tenant_id, "device_id": device_id, "key": key, "value": value}
        for key, value in new.items()
        if old.get(key) != value
    ]
    if added:
        conn.execute(device_labels.insert(), added)
    store.audit(
        conn,
        tenant_id=tenant_id,
        actor=actor,
        action="device.labels",
        target=f"device:{device}",
        detail={"device_id": device_id, "old": old, "new": new},
    )
    return old, new
