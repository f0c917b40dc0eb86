"""Rollouts: a plan's targets published wave by wave, gated by the agents' own health.

`start` checks the spec and puts each target in one wave (rolloutplan.py),
refuses devices another unfinished rollout holds (Busy, 409) and plans made
against a version that has moved (Conflict), and stores the rollout, its
members and its lease in one transaction with its audit entry (rolloutstart.py). The controller
(rolloutcontrol.py) drives it from there, in whichever control-plane process
holds the lease. Operators `pause`, `resume`, `approve` (a wave that waits for
an approval) and `abort` (every device that was sent the change is put back on
its previous revision); each is audited (`rollout.*`).

While a rollout is unfinished (running, paused, waiting for an approval) its
devices are busy: `PUT …/desired` for one of them is refused naming the
rollout (`refuse_busy`, called by DesiredRevisions inside its write), and a
planner asks `busy_devices`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

from sqlalchemy import Connection, and_, select, update

from trueup.model.jsontypes import JSONObject
from trueup.server.service.errors import Busy, Invalid, NotFound, WrongState
from trueup.server.service.fleettypes import Plan
from trueup.server.service.rolloutplan import assign_waves, parse_spec
from trueup.server.service.rolloutrecords import (
    RolloutSummary,
    RolloutUpdate,
    RolloutView,
    StartedRollout,
    TransitionDetail,
)
from trueup.server.service.rolloutrows import (
    ACTIVE,
    InsertRevision,
    active_holders,
    device_facts,
    put_back,
)
from trueup.server.service.rolloutstart import insert_rollout, lock_targets
from trueup.server.service.rolloutview import rollout_view, summary
from trueup.server.service.store import Store
from trueup.server.tables import devices, rollout_members, rollouts

__all__ = ["Rollouts"]

# selector text -> the names of the tenant's devices it selects (None: no labels here).
Matching = Callable[[int, str], Collection[str]]


class Rollouts:
    def __init__(
        self, store: Store, insert_revision: InsertRevision, *, matching: Matching | None = None
    ) -> None:
        self.store = store
        self.insert_revision = insert_revision
        self.matching = matching

    # -- start ------------------------------------------------------------------------------

    def start(
        self,
        tenant_id: int,
        plan: Plan,
        *,
        waves: Sequence[JSONObject] | None = None,  # parse_spec checks them
        max_unavailable: int | str = "25%",
        soak_seconds: float = 0.0,
        failure_budget: int = 0,
        confirm_within: int | None = None,
        approval: bool = False,
        gate_timeout: float = 900.0,
        actor: str,
        comment: str = "",
    ) -> StartedRollout:
        """Store a rollout of `plan`'s targets; its view. Raises Invalid, Busy or Conflict."""
        try:
            spec = parse_spec(
                {
                    "waves": list(waves) if waves is not None else None,
                    "max_unavailable": max_unavailable,
                    "soak_seconds": soak_seconds,
                    "failure_budget": failure_budget,
                    "confirm_within": confirm_within,
                    "approval": approval,
                    "gate_timeout": gate_timeout,
                }
            )
        except ValueError as exc:
            raise Invalid(list(exc.args[0])) from None
        if spec.waves[0].approval:  # a rollout starts with its first wave: nothing to wait for
            first = "waves[0].approval: the first wave starts with the rollout and cannot wait"
            raise Invalid([f"{first} for an approval; put it on the wave after the canary"])
        if not plan.targets:
            raise Invalid(["targets: the plan changes no device; there is nothing to roll out"])
        by_name = {t.device: t for t in plan.targets}
        matching = self.matching
        assigned, problems = assign_waves(
            spec,
            sorted(by_name),
            None if matching is None else (lambda text: matching(tenant_id, text)),
            {r.device: f"{r.kind}: {'; '.join(r.problems[:1])}" for r in plan.refused},
        )
        if problems:
            raise Invalid(problems)
        now = time.time()
        with self.store.write() as conn:
            lock_targets(conn, tenant_id, plan)
            rollout_id = insert_rollout(
                conn, self.store, tenant_id, plan, spec, assigned, now, actor, comment
            )
        return {
            **self.get(tenant_id, rollout_id),
            "refused": [
                {"device": r.device, "kind": r.kind, "problems": list(r.problems)}
                for r in plan.refused
            ],
        }

    # -- who holds which device -------------------------------------------------------------

    def busy_devices(self, tenant_id: int) -> set[int]:
        """The ids of the tenant's devices an unfinished rollout holds."""
        return set(self.busy_holders(tenant_id))

    def busy_holders(self, tenant_id: int) -> dict[int, tuple[int, str]]:
        """device id -> (rollout id, state) for the tenant's devices unfinished rollouts hold."""
        with self.store.db.read() as conn:
            rows = conn.execute(
                select(rollout_members.c.device_id, rollouts.c.id, rollouts.c.state)
                .join(rollouts, rollouts.c.id == rollout_members.c.rollout_id)
                .where(and_(rollouts.c.tenant_id == tenant_id, rollouts.c.state.in_(ACTIVE)))
            )
            return {int(r.device_id): (int(r.id), str(r.state)) for r in rows}

    def refuse_busy(self, conn: Connection, device_id: int, device: str) -> None:
        """Raise Busy when an unfinished rollout holds the device (inside the caller's write,
        the device's row locked first: a rollout starting meanwhile is seen)."""
        conn.execute(select(devices.c.id).where(devices.c.id == device_id).with_for_update()).all()
        held = active_holders(conn, [device_id]).get(device_id)
        if held is not None:
            raise Busy([device], held[0], held[1])

    # -- reading ----------------------------------------------------------------------------

    def _row(self, conn: Connection, tenant_id: int, rollout_id: int, lock: bool = False) -> Any:
        query = select(rollouts).where(
            and_(rollouts.c.id == rollout_id, rollouts.c.tenant_id == tenant_id)
        )
        # An operator's action locks the row, as the controller's tick does: the two take
        # turns, so an abort sees every send that committed before it.
        row = conn.execute(query.with_for_update() if lock else query).mappings().one_or_none()
        if row is None:
            raise NotFound(f"rollout {rollout_id} not found")
        return row

    def list(self, tenant_id: int) -> list[RolloutSummary]:
        """The tenant's rollouts, newest first."""
        with self.store.db.read() as conn:
            rows = conn.execute(
                select(rollouts)
                .where(rollouts.c.tenant_id == tenant_id)
                .order_by(rollouts.c.id.desc())
            ).mappings()
            return [summary(r) for r in rows]

    def get(self, tenant_id: int, rollout_id: int) -> RolloutView:
        """A rollout: its waves (counts per state), each member with its state, reason and
        (while sent) its gates as the latest report shows them."""
        now = time.time()
        with self.store.db.read() as conn:
            row = self._row(conn, tenant_id, rollout_id)
            members = list(
                conn.execute(
                    select(rollout_members, devices.c.name)
                    .join(devices, devices.c.id == rollout_members.c.device_id)
                    .where(rollout_members.c.rollout_id == rollout_id)
                    .order_by(rollout_members.c.wave, devices.c.name)
                ).mappings()
            )
            sent = [int(m["device_id"]) for m in members if m["state"] == "sent"]
            rolled_back = self.store.covered(conn).rolled_back if sent else {}
            facts = device_facts(conn, sent, now, rolled_back) if sent else {}
        return rollout_view(row, members, facts, now)

    # -- operators' actions -----------------------------------------------------------------

    def _transition(
        self,
        tenant_id: int,
        rollout_id: int,
        *,
        allowed: tuple[str, ...],
        to: str,
        action: str,
        actor: str,
        reason: str = "",
        next_wave: bool = False,
        put_back_members: bool = False,
    ) -> RolloutView:
        now = time.time()
        with self.store.write() as conn:
            row = self._row(conn, tenant_id, rollout_id, lock=True)
            if row["state"] not in allowed:
                raise WrongState(
                    f"rollout {rollout_id} is {row['state']}: `{action.split('.')[1]}` is "
                    f"possible only while it is {' or '.join(allowed)}; nothing was changed"
                )
            values: RolloutUpdate = {"state": to, "updated_at": now, "reason": reason or None}
            detail: TransitionDetail = {"rollout_id": rollout_id, "from": row["state"], "to": to}
            if reason:
                detail["reason"] = reason
            if next_wave:
                values["current_wave"] = row["current_wave"] + 1
                values["wave_started_at"] = now
                values["wave_done_at"] = None
                values["accepted_failures"] = 0
            if action == "rollout.resume":
                # The wave's failures so far are accepted: its budget counts new ones.
                accepted = len(
                    conn.execute(
                        select(rollout_members.c.id).where(
                            and_(
                                rollout_members.c.rollout_id == rollout_id,
                                rollout_members.c.wave == row["current_wave"],
                                rollout_members.c.state.in_(("failed", "reverted")),
                            )
                        )
                    ).all()
                )
                values["accepted_failures"] = accepted
                detail["accepted_failures"] = accepted
                detail["wave"] = row["current_wave"] + 1
            if to in ("aborted", "completed", "failed"):
                values["finished_at"] = now
            if put_back_members:
                members = list(
                    conn.execute(
                        select(rollout_members, devices.c.name)
                        .join(devices, devices.c.id == rollout_members.c.device_id)
                        .where(rollout_members.c.rollout_id == rollout_id)
                        .order_by(rollout_members.c.id)
                    ).mappings()
                )
                changed = [m for m in members if m["state"] in ("sent", "passed", "failed")]
                put = put_back(
                    conn,
                    self.insert_revision,
                    tenant_id=tenant_id,
                    rollout_id=rollout_id,
                    members=changed,
                    names={int(m["device_id"]): m["name"] for m in members},
                    author=actor,
                    why="rollout aborted",
                    now=now,
                )
                detail["put_back"] = [p.as_json() for p in put]
                conn.execute(
                    update(rollout_members)
                    .where(
                        and_(
                            rollout_members.c.rollout_id == rollout_id,
                            rollout_members.c.state == "pending",
                        )
                    )
                    .values(state="skipped", finished_at=now, reason="rollout aborted")
                )
            conn.execute(update(rollouts).where(rollouts.c.id == rollout_id).values(**values))
            self.store.audit(
                conn,
                tenant_id=tenant_id,
                actor=actor,
                action=action,
                target=f"rollout:{rollout_id}",
                detail=detail,
                at=now,
            )
        return self.get(tenant_id, rollout_id)

    def pause(
        self, tenant_id: int, rollout_id: int, *, actor: str, reason: str = ""
    ) -> RolloutView:
        """Stop sending (devices already sent keep their gates evaluated once resumed)."""
        return self._transition(
            tenant_id,
            rollout_id,
            allowed=("running", "waiting-approval"),
            to="paused",
            action="rollout.pause",
            actor=actor,
            reason=reason or f"paused by {actor}",
        )

    def resume(self, tenant_id: int, rollout_id: int, *, actor: str) -> RolloutView:
        return self._transition(
            tenant_id,
            rollout_id,
            allowed=("paused",),
            to="running",
            action="rollout.resume",
            actor=actor,
        )

    def approve(self, tenant_id: int, rollout_id: int, *, actor: str) -> RolloutView:
        """Start the wave that waits for an approval."""
        return self._transition(
            tenant_id,
            rollout_id,
            allowed=("waiting-approval",),
            to="running",
            action="rollout.approve",
            actor=actor,
            next_wave=True,
        )

    def abort(
        self, tenant_id: int, rollout_id: int, *, actor: str, reason: str = ""
    ) -> RolloutView:
        """Stop for good: every device that was sent the change is put back on its previous
        revision; members not yet sent are skipped."""
        return self._transition(
            tenant_id,
            rollout_id,
            allowed=ACTIVE,
            to="aborted",
            action="rollout.abort",
            actor=actor,
            reason=reason or f"aborted by {actor}",
            put_back_members=True,
        )
