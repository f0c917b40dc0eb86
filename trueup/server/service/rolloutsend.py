"""Sending one batch of a rollout's members, inside the controller's transaction.

For each pending member: when the device's desired version is still the one the
plan was made against, its revision is stored (DesiredRevisions.insert_revision,
compare-and-set) and the member marked `sent` with that version; otherwise it is
marked `failed` with the reason (a concurrent edit), and nothing is sent over it.
The member's update is a compare-and-set on `state = 'pending'`: a member another
process sent raises Lost, and the caller's transaction, revisions included, rolls
back. One `rollout.send` audit entry names the batch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from sqlalchemy import Connection, RowMapping, and_, select, update

from trueup.model.document import parse_document
from trueup.server.service.rolloutrecords import MemberUpdate, RefusedSend, SentMember
from trueup.server.service.rolloutrows import ACTOR, InsertRevision, device_facts
from trueup.server.service.store import Store
from trueup.server.tables import devices, rollout_members

__all__ = ["Lost", "send_members"]


class Lost(Exception):
    """Another process sent this member: roll the batch back."""


def send_members(
    conn: Connection,
    store: Store,
    insert_revision: InsertRevision,
    *,
    row: RowMapping,
    member_ids: Sequence[int],
    confirm_within: int | None,
    now: float,
) -> tuple[list[SentMember], list[RefusedSend]]:
    """Send the batch; (sent: device and version, refused: device and reason)."""
    rollout_id = int(row["id"])
    members = list(
        conn.execute(
            select(rollout_members, devices.c.name)
            .join(devices, devices.c.id == rollout_members.c.device_id)
            .where(
                and_(
                    rollout_members.c.id.in_(list(member_ids)),
                    rollout_members.c.state == "pending",
                )
            )
            .order_by(rollout_members.c.id)
        ).mappings()
    )
    facts = device_facts(conn, [int(m["device_id"]) for m in members], now)
    sent: list[SentMember] = []
    refused: list[RefusedSend] = []
    for m in members:
        device_id = int(m["device_id"])
        report, current = facts[device_id].report, facts[device_id].desired_version
        values: MemberUpdate
        if current != m["from_version"]:
            reason = (
                f"not sent: its desired version is {current}, not the version "
                f"{m['from_version']} the plan was made against (a concurrent edit)"
            )
            values = {"state": "failed", "finished_at": now, "reason": reason}
            refused.append({"device": m["name"], "reason": reason})
        else:
            revision = insert_revision(
                conn,
                tenant_id=int(row["tenant_id"]),
                device_id=device_id,
                device=m["name"],
                expected_version=int(m["from_version"]),
                document=parse_document(json.loads(m["document"])),
                author=str(row["created_by"]),
                comment=f"rollout {rollout_id} wave {m['wave']}"
                + (f": {row['comment']}" if row["comment"] else ""),
                provenance=json.loads(m["provenance"]) if m["provenance"] else None,
                confirm_within=confirm_within,
                at=now,
            )
            values = {
                "state": "sent",
                "sent_version": revision.version,
                "sent_at": now,
                "baseline_codes": json.dumps(
                    sorted({str(c) for c in (report or {}).get("reason_codes") or []})
                ),
            }
            sent.append({"device": m["name"], "version": revision.version})
        marked = conn.execute(
            update(rollout_members)
            .where(
                and_(
                    rollout_members.c.id == m["id"],
                    rollout_members.c.state == "pending",
                )
            )
            .values(**values)
        ).rowcount
        if marked != 1:
            raise Lost(m["name"])
    store.audit(
        conn,
        tenant_id=int(row["tenant_id"]),
        actor=ACTOR,
        action="rollout.send",
        target=f"rollout:{rollout_id}",
        detail={
            "rollout_id": rollout_id,
            "wave": int(row["current_wave"]),
            "sent": sent,
            "refused": refused,
        },
        at=now,
    )
    return sent, refused
