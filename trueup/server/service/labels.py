"""DeviceLabels: a device's labels (`site=ams`, `role=edge`), set and read; the devices a
selector matches.

Labels follow the Kubernetes rules (trueup.model.layering.selectors); a bad
key or value is Invalid naming `labels.<key>` and what is expected, and
nothing is changed. Every change is one transaction with its `device.labels`
audit entry (the whole set before and after). Reads and matches are filtered
by tenant like every lookup: another tenant's device is not found.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import select

from trueup.model.layering import Selector
from trueup.server.service.errors import Invalid
from trueup.server.service.labelrows import labels_of, replace_labels, tenant_labels
from trueup.server.service.records import LabelsSet
from trueup.server.service.store import Store
from trueup.server.tables import devices

__all__ = ["DeviceLabels"]


class DeviceLabels:
    def __init__(self, store: Store) -> None:
        self.store = store

    def labels(self, tenant_id: int, device: str) -> dict[str, str]:
        """The device's labels, sorted by key. Raises NotFound."""
        with self.store.db.read() as conn:
            row = self.store.device(conn, tenant_id, device)
            return labels_of(conn, int(row["id"]))

    def set_labels(
        self,
        tenant_id: int,
        device: str,
        labels: Mapping[str, Any],
        *,
        remove: Iterable[str] = (),
        merge: bool = False,
        actor: str,
    ) -> LabelsSet:
        """Set the device's labels and audit the change: the whole set is `labels`, or (with
        `merge`) the current set updated by `labels`, less the keys in `remove`.

        Returns {"device", "labels", "changed"}; an unchanged set is not audited again.
        A key both set and removed is Invalid. Raises NotFound, Invalid (nothing changed).
        """
        removed = sorted(set(remove))
        clash = [key for key in removed if key in labels]
        if clash:
            raise Invalid([f"labels.{key}: both set and removed; give one" for key in clash])
        with self.store.write() as conn:
            row = self.store.device(conn, tenant_id, device)
            device_id = int(row["id"])
            # Not checked yet: replace_labels checks every key and value.
            wanted: dict[str, Any] = dict(labels_of(conn, device_id)) if merge else {}
            wanted.update(labels)
            for key in removed:
                wanted.pop(key, None)
            old, new = replace_labels(
                conn,
                self.store,
                tenant_id=tenant_id,
                device_id=device_id,
                device=device,
                labels=wanted,
                actor=actor,
            )
        return {"device": device, "labels": new, "changed": old != new}

    def devices_matching(
        self, tenant_id: int, selector: Selector
    ) -> list[tuple[int, str, dict[str, str]]]:
        """Every device of the tenant whose labels `selector` matches: (id, name, labels),
        by name."""
        with self.store.db.read() as conn:
            rows = list(
                conn.execute(
                    select(devices.c.id, devices.c.name)
                    .where(devices.c.tenant_id == tenant_id)
                    .order_by(devices.c.name)
                )
            )
            labelled = tenant_labels(conn, tenant_id)
        out = []
        for row in rows:
            labels = labelled.get(row.id, {})
            if selector.matches(labels):
                out.append((int(row.id), str(row.name), labels))
        return out
