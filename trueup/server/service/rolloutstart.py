"""Storing a new rollout (Rollouts.start, inside its transaction): the targets' device rows
locked and checked, then the rollout, its members (each in its wave) and its lease, with
the audit entry `rollout.start`."""

from __future__ import annotations

import json
from collections.abc import Sequence

from sqlalchemy import Connection, and_, select

from trueup.server.service.errors import Busy, Conflict, NotFound
from trueup.server.service.fleettypes import Plan
from trueup.server.service.rolloutplan import Spec
from trueup.server.service.rolloutrows import active_holders
from trueup.server.service.store import Store, inserted_id
from trueup.server.tables import devices, rollout_leases, rollout_members, rollouts

__all__ = ["insert_rollout", "lock_targets"]


def lock_targets(conn: Connection, tenant_id: int, plan: Plan) -> None:
    """Lock the targets' device rows; Busy when another unfinished rollout holds one,
    NotFound for a device gone, Conflict for one whose desired version has moved."""
    # The devices' rows locked, in one order: two rollouts (or a rollout and a
    # `PUT …/desired`) over the same device on two processes cannot both pass.
    conn.execute(
        select(devices.c.id)
        .where(devices.c.id.in_(sorted(t.device_id for t in plan.targets)))
        .order_by(devices.c.id)
        .with_for_update()
    ).all()
    held = active_holders(conn, [t.device_id for t in plan.targets])
    if held:
        rollout_id, state = sorted(held.values())[0]
        names = sorted(t.device for t in plan.targets if t.device_id in held)
        raise Busy(names, rollout_id, state)
    current = {
        int(r.id): int(r.desired_version)
        for r in conn.execute(
            select(devices.c.id, devices.c.desired_version).where(
                and_(
                    devices.c.tenant_id == tenant_id,
                    devices.c.id.in_([t.device_id for t in plan.targets]),
                )
            )
        )
    }
    for target in sorted(plan.targets, key=lambda t: t.device):
        if target.device_id not in current:
            raise NotFound(f"device {target.device!r} not found")
        if current[target.device_id] != target.from_version:
            raise Conflict(target.device, target.from_version, current[target.device_id])


def insert_rollout(
    conn: Connection,
    store: Store,
    tenant_id: int,
    plan: Plan,
    spec: Spec,
    assigned: Sequence[Sequence[str]],
    now: float,
    actor: str,
    comment: str,
) -> int:
    """Store the rollout, its members (each in its wave) and its lease, audited."""
    by_name = {t.device: t for t in plan.targets}
    rollout_id = inserted_id(
        conn.execute(
            rollouts.insert().values(
                tenant_id=tenant_id,
                state="running",
                spec=json.dumps(spec.as_json(), sort_keys=True),
                current_wave=0,
                wave_started_at=now,
                created_by=actor,
                created_at=now,
                updated_at=now,
                comment=comment,
            )
        )
    )
    rows = []
    for wave, names in enumerate(assigned):
        for name in names:
            target = by_name[name]
            rows.append(
                {
                    "rollout_id": rollout_id,
                    "device_id": target.device_id,
                    "wave": wave,
                    "document": json.dumps(target.document, sort_keys=True),
                    "digest": target.digest,
                    "provenance": json.dumps(target.provenance.as_json(), sort_keys=True)
                    if target.provenance.profiles
                    else None,
                    "from_version": target.from_version,
                    "state": "pending",
                }
            )
    conn.execute(rollout_members.insert(), rows)
    conn.execute(rollout_leases.insert().values(rollout_id=rollout_id, holder="", expires_at=0.0))
    store.audit(
        conn,
        tenant_id=tenant_id,
        actor=actor,
        action="rollout.start",
        target=f"rollout:{rollout_id}",
        detail={
            "rollout_id": rollout_id,
            "devices": len(rows),
            "waves": [len(names) for names in assigned],
            "refused": [r.device for r in plan.refused],
            "spec": spec.as_json(),
            "comment": comment,
        },
        at=now,
    )
    return rollout_id
