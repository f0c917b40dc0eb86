"""What the rollout unit and its controller share over the database: member rows, the
devices' latest facts, putting devices back on their previous revision, the pause when
a wave's failures exceed its budget, the lease.

Every function runs inside the caller's transaction. `put_back` stores, for each
member that was sent a revision, the document of the revision it had before
(`from_version`) as its next revision (compare-and-set on the version it was
sent: a device whose desired version moved since is named, not overwritten).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from sqlalchemy import Connection, RowMapping, and_, select, update

from trueup.model.document import DeviceState, DocumentError, parse_document
from trueup.model.jsontypes import JSONObject
from trueup.model.layering.types import ProvenanceJSON
from trueup.server.service.errors import Conflict
from trueup.server.service.notify.emit import device_of, emit
from trueup.server.service.rolloutrecords import GateConfirmation, RolloutState
from trueup.server.service.store import Store
from trueup.server.tables import (
    acks,
    device_confirmation,
    device_state,
    devices,
    revisions,
    rollout_leases,
    rollout_members,
    rollouts,
)

__all__ = [
    "ACTIVE",
    "ACTOR",
    "NO_FACTS",
    "DeviceFacts",
    "InsertRevision",
    "PutBack",
    "StepStats",
    "active_holders",
    "device_facts",
    "fail_rollout",
    "pause_for_budget",
    "put_back",
    "take_lease",
]

# Rollout states that hold their devices (a second change to them is refused).
# The states in which a rollout holds its devices (unfinished).
ACTIVE: tuple[str, ...] = tuple(
    state.value
    for state in (RolloutState.RUNNING, RolloutState.PAUSED, RolloutState.WAITING_APPROVAL)
)
ACTOR = "trueup:rollouts"  # the controller's actor in the audit log


@dataclass
class StepStats:
    """What one tick did (the benchmark counts device transitions)."""

    driven: int = 0
    sent: int = 0
    passed: int = 0
    failed: int = 0
    reverted: int = 0
    waves: list[tuple[int, int, str]] = field(default_factory=list)

    @property
    def transitions(self) -> int:
        return self.sent + self.passed + self.failed + self.reverted


class InsertRevision(Protocol):
    """`DesiredRevisions.insert_revision` (passed in: the units never import each other)."""

    def __call__(
        self,
        conn: Connection,
        *,
        tenant_id: int,
        device_id: int,
        device: str,
        expected_version: int,
        document: DeviceState,
        author: str,
        comment: str = "",
        provenance: ProvenanceJSON | None = None,
        confirm_within: int | None = None,
        at: float | None = None,
    ) -> Any: ...


def active_holders(conn: Connection, device_ids: Iterable[int]) -> dict[int, tuple[int, str]]:
    """device id -> (rollout id, state) for each device an unfinished rollout holds."""
    ids = sorted(set(device_ids))
    if not ids:
        return {}
    out: dict[int, tuple[int, str]] = {}
    for chunk in range(0, len(ids), 5000):
        rows = conn.execute(
            select(rollout_members.c.device_id, rollouts.c.id, rollouts.c.state)
            .join(rollouts, rollouts.c.id == rollout_members.c.rollout_id)
            .where(
                and_(
                    rollout_members.c.device_id.in_(ids[chunk : chunk + 5000]),
                    rollouts.c.state.in_(ACTIVE),
                )
            )
        )
        for row in rows:
            out[int(row.device_id)] = (int(row.id), str(row.state))
    return out


class DeviceFacts(NamedTuple):
    """What the gates read about one device: its newest report and when it arrived, the
    subsystems acknowledged on the control plane, its desired version, and its latest
    confirmation (the stored record, the audit log's rollback taking precedence)."""

    report: JSONObject | None  # as the agent sent it
    report_at: float | None
    acked: list[str]
    desired_version: int
    confirmation: GateConfirmation | None


NO_FACTS = DeviceFacts(None, None, [], 0, None)


def device_facts(
    conn: Connection,
    device_ids: Sequence[int],
    now: float,
    rolled_back: Mapping[tuple[int, int | None], int] | None = None,
) -> dict[int, DeviceFacts]:
    """device id -> its facts. `rolled_back` is the audit log's (device id, version) -> seq
    of each `revision.rolled_back` (Store.covered): a stored confirmation that says
    otherwise was changed behind the server's back, and the log's word holds."""
    out: dict[int, DeviceFacts] = {}
    ids = sorted(set(device_ids))
    for start in range(0, len(ids), 5000):
        chunk = ids[start : start + 5000]
        acked: dict[int, list[str]] = {}
        for row in conn.execute(
            select(acks.c.device_id, acks.c.subsystem).where(
                and_(acks.c.device_id.in_(chunk), acks.c.expires_at > now)
            )
        ):
            acked.setdefault(int(row.device_id), []).append(str(row.subsystem))
        confirmed: dict[int, GateConfirmation] = {}
        for record in conn.execute(
            select(device_confirmation).where(device_confirmation.c.device_id.in_(chunk))
        ).mappings():
            entry: GateConfirmation = {
                "version": record["version"],
                "state": record["state"],
                "deadline": record["deadline"],
                "reason": record["reason"],
            }
            seq = (rolled_back or {}).get((int(record["device_id"]), record["version"]))
            if seq is not None and entry["state"] != "rolled-back":
                entry["state"] = "rolled-back"
                entry["reason"] = f"the audit log says so (seq={seq})"
            confirmed[int(record["device_id"])] = entry
        for state in conn.execute(
            select(
                devices.c.id,
                devices.c.desired_version,
                device_state.c.report,
                device_state.c.last_report_at,
            )
            .outerjoin(device_state, device_state.c.device_id == devices.c.id)
            .where(devices.c.id.in_(chunk))
        ):
            device_id = int(state.id)
            out[device_id] = DeviceFacts(
                json.loads(state.report) if state.report else None,
                state.last_report_at,
                acked.get(device_id, []),
                int(state.desired_version),
                confirmed.get(device_id),
            )
    return out


def take_lease(conn: Connection, rollout_id: int, holder: str, now: float, ttl: float) -> bool:
    """Take or renew the lease on a rollout: one compare-and-set, atomic on both databases
    (PostgreSQL re-checks the WHERE clause after the row lock; SQLite writes one at a time)."""
    taken = conn.execute(
        update(rollout_leases)
        .where(
            and_(
                rollout_leases.c.rollout_id == rollout_id,
                (rollout_leases.c.expires_at < now) | (rollout_leases.c.holder == holder),
            )
        )
        .values(holder=holder, expires_at=now + ttl)
    ).rowcount
    return bool(taken == 1)


def _previous_document(conn: Connection, device_id: int, version: int) -> DeviceState | None:
    text = conn.execute(
        select(revisions.c.document).where(
            and_(revisions.c.device_id == device_id, revisions.c.version == version)
        )
    ).scalar_one_or_none()
    if text is None:
        return None
    try:
        return parse_document(json.loads(text))
    except (DocumentError, ValueError):
        return None


@dataclass(frozen=True)
class PutBack:
    """What putting one device back did (the audit entry lists them, `as_json`)."""

    device: str
    sent_version: int
    result: str  # why, in a sentence: put back as version N, or not and why not
    reverted_version: int | None = None  # the revision that put it back, if one did

    def as_json(self) -> dict[str, int | str]:
        out: dict[str, int | str] = {"device": self.device, "sent_version": self.sent_version}
        if self.reverted_version is not None:
            out["reverted_version"] = self.reverted_version
        out["result"] = self.result
        return out


def put_back(
    conn: Connection,
    insert_revision: InsertRevision,
    *,
    tenant_id: int,
    rollout_id: int,
    members: Sequence[RowMapping],
    names: dict[int, str],
    author: str,
    why: str,
    now: float,
) -> list[PutBack]:
    """Put each member that was sent a revision back on its previous one; what happened."""
    results: list[PutBack] = []
    for member in members:
        device_id, name = int(member["device_id"]), names[int(member["device_id"])]
        sent, before = member["sent_version"], int(member["from_version"])
        if sent is None:
            continue
        reverted: int | None = None
        previous = _previous_document(conn, device_id, before) if before else None
        reason: str
        if previous is None:
            reason = (
                f"not put back: it had no revision before version {sent}"
                if not before
                else f"not put back: its version {before} cannot be read"
            )
            state = member["state"]
        else:
            try:
                revision = insert_revision(
                    conn,
                    tenant_id=tenant_id,
                    device_id=device_id,
                    device=name,
                    expected_version=int(sent),
                    document=previous,
                    author=author,
                    comment=f"rollout {rollout_id}: put back on version {before} ({why})",
                    at=now,
                )
            except Conflict as exc:
                reason = (
                    f"not put back: its desired version is {exc.current}, no longer the "
                    f"version {sent} the rollout sent"
                )
                state = member["state"]
            else:
                reverted = revision.version
                reason = f"put back on version {before} as version {revision.version} ({why})"
                state = "reverted"
                conn.execute(
                    update(rollout_members)
                    .where(rollout_members.c.id == member["id"])
                    .values(reverted_version=revision.version)
                )
        previous_reason = member["reason"]
        conn.execute(
            update(rollout_members)
            .where(rollout_members.c.id == member["id"])
            .values(
                state=state,
                finished_at=member["finished_at"] or now,
                reason=f"{previous_reason}; {reason}" if previous_reason else reason,
            )
        )
        results.append(PutBack(name, sent, reason, reverted))
    return results


def pause_for_budget(
    conn: Connection,
    store: Store,
    *,
    row: RowMapping,
    wave: int,
    failed_ids: Sequence[int],
    failure_budget: int,
    now: float,
) -> None:
    """Pause a rollout whose wave failed more devices than its budget (each already put
    back when it failed): audit `rollout.pause`, fire a `rollout_paused` notification per
    failed device."""
    rollout_id, tenant_id = int(row["id"]), int(row["tenant_id"])
    failed = [
        m
        for m in conn.execute(
            select(rollout_members, devices.c.name)
            .join(devices, devices.c.id == rollout_members.c.device_id)
            .where(rollout_members.c.id.in_(list(failed_ids)))
            .order_by(rollout_members.c.id)
        ).mappings()
    ]
    reason = (
        f"wave {wave}: {len(failed)} device(s) failed, more than the failure budget "
        f"({failure_budget}): " + "; ".join(f"{m['name']}: {m['reason']}" for m in failed[:5])
    )
    conn.execute(
        update(rollouts)
        .where(rollouts.c.id == rollout_id)
        .values(state="paused", reason=reason, updated_at=now)
    )
    store.audit(
        conn,
        tenant_id=tenant_id,
        actor=ACTOR,
        action="rollout.pause",
        target=f"rollout:{rollout_id}",
        detail={
            "rollout_id": rollout_id,
            "wave": wave,
            "reason": reason,
            "failed": [m["name"] for m in failed],
        },
        at=now,
    )
    for m in failed:
        device = device_of(conn, int(m["device_id"]))
        if device is None:
            continue
        emit(
            conn,
            device,
            "rollout_paused",
            now,
            {
                "rollout": {
                    "id": rollout_id,
                    "wave": wave,
                    "reason": reason,
                    "failed": [f["name"] for f in failed],
                    "device_reason": m["reason"],
                }
            },
            [],
        )


def fail_rollout(conn: Connection, store: Store, row: RowMapping, reason: str, now: float) -> None:
    """End a rollout the controller cannot drive (state `failed`, audited `rollout.fail`)."""
    conn.execute(
        update(rollouts)
        .where(rollouts.c.id == row["id"])
        .values(state="failed", reason=reason, updated_at=now, finished_at=now)
    )
    store.audit(
        conn,
        tenant_id=int(row["tenant_id"]),
        actor=ACTOR,
        action="rollout.fail",
        target=f"rollout:{row['id']}",
        detail={"rollout_id": int(row["id"]), "reason": reason},
        at=now,
    )
