"""The rollout controller: a background thread in every control-plane process; only the
process holding a rollout's lease drives it.

Each tick (`step`) takes or renews the lease of every running rollout (one
compare-and-set; rolloutrows.take_lease) and, for those it holds, in one
transaction: judges every sent member of the current wave from its device's
newest report (rolloutgates.py) and puts a device that failed back on
its previous revision at once; pauses the rollout when the wave's failures
exceed its budget (a `rollout_paused` notification per failed device); moves on
when every member has finished and the soak has passed: the next wave, a wait
for an approval, or completed. Then it sends, in batches of their own
transactions (rolloutsend.py), as many pending members as `max_unavailable`
leaves room for.

A send is exactly once across processes: the revision (DesiredRevisions.
insert_revision, compare-and-set on the plan's `from_version`) and the member
marked sent with that version (compare-and-set on `state = 'pending'`) commit
in one transaction, which also renews the lease first, so a process whose
lease ran out sends nothing and a takeover sees every send that committed.
A device whose version moved since the plan fails with the reason. Each of
these transactions locks the rollout's row, as an operator's pause, approve or
abort does, so they take turns: an abort sees every send that committed, and a
tick never overwrites an abort.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
import time

from sqlalchemy import Connection, RowMapping, and_, select, update

from trueup.server.service.errors import Conflict
from trueup.server.service.rolloutgates import judge_members
from trueup.server.service.rolloutplan import (
    Spec,
    parse_spec,
    unavailable_limit,
)
from trueup.server.service.rolloutrecords import MemberState, RolloutUpdate
from trueup.server.service.rolloutrows import (
    ACTOR,
    InsertRevision,
    PutBack,
    StepStats,
    device_facts,
    fail_rollout,
    pause_for_budget,
    put_back,
    take_lease,
)
from trueup.server.service.rolloutsend import Lost, send_members
from trueup.server.service.store import Store
from trueup.server.tables import devices, rollout_leases, rollout_members, rollouts

__all__ = ["RolloutController", "StepStats"]

log = logging.getLogger("trueup.server.rollouts")

TERMINAL: tuple[str, ...] = tuple(
    state.value
    for state in (MemberState.PASSED, MemberState.FAILED, MemberState.REVERTED, MemberState.SKIPPED)
)


class RolloutController:
    def __init__(
        self,
        store: Store,
        insert_revision: InsertRevision,
        *,
        holder: str | None = None,
        tick_seconds: float = 1.0,
        lease_seconds: float = 15.0,
        send_batch: int = 500,
    ) -> None:
        self.store = store
        self.insert_revision = insert_revision
        self.holder = (holder or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}")[
            :200
        ]
        self.tick_seconds = tick_seconds
        self.lease_seconds = lease_seconds
        self.send_batch = send_batch
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the thread -------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="rollouts", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop ticking and hand the leases this process holds over at once."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=60)
        self._thread = None
        try:
            with self.store.db.write() as conn:
                conn.execute(
                    update(rollout_leases)
                    .where(rollout_leases.c.holder == self.holder)
                    .values(expires_at=0.0)
                )
        except Exception:  # the database may be gone at shutdown: the lease runs out
            log.warning("rollouts: could not release the leases of %s", self.holder)

    def _run(self) -> None:
        while not self._stop.wait(self.tick_seconds):
            try:
                self.step()
            except Exception:  # the controller outlives any one failure; the next tick retries
                log.exception("rollout controller tick failed")

    # -- one tick ---------------------------------------------------------------------------

    def step(self, now: float | None = None) -> StepStats:
        """Drive every running rollout whose lease this process holds or can take."""
        stats = StepStats()
        with self.store.db.read() as conn:
            running = [
                int(r.id)
                for r in conn.execute(
                    select(rollouts.c.id)
                    .where(rollouts.c.state == "running")
                    .order_by(rollouts.c.id)
                )
            ]
        for rollout_id in running:
            at = time.time() if now is None else now
            with self.store.write() as conn:
                if not take_lease(conn, rollout_id, self.holder, at, self.lease_seconds):
                    continue
                row = (
                    conn.execute(
                        select(rollouts).where(rollouts.c.id == rollout_id).with_for_update()
                    )
                    .mappings()
                    .one()
                )
                if row["state"] != "running":
                    continue
                stats.driven += 1
                try:
                    spec = parse_spec(json.loads(row["spec"]))
                except ValueError as exc:  # a stored spec this trueup cannot read: stop
                    fail_rollout(
                        conn, self.store, row, f"its stored spec cannot be read: {exc}", at
                    )
                    continue
                pending = self._judge(conn, row, spec, at, stats)
            while pending:
                batch, pending = pending[: self.send_batch], pending[self.send_batch :]
                if not self._send(
                    rollout_id, batch, spec, time.time() if now is None else now, stats
                ):
                    break
        return stats

    def _members(self, conn: Connection, rollout_id: int, wave: int) -> list[RowMapping]:
        return list(
            conn.execute(
                select(rollout_members, devices.c.name, devices.c.tenant_id)
                .join(devices, devices.c.id == rollout_members.c.device_id)
                .where(
                    and_(rollout_members.c.rollout_id == rollout_id, rollout_members.c.wave == wave)
                )
                .order_by(rollout_members.c.id)
            ).mappings()
        )

    def _judge(
        self, conn: Connection, row: RowMapping, spec: Spec, now: float, stats: StepStats
    ) -> list[int]:
        """Gates, budget, the wave's end; the ids of the members to send now."""
        rollout_id, wave = int(row["id"]), int(row["current_wave"])
        members = self._members(conn, rollout_id, wave)
        soaking = row["wave_done_at"] is not None
        judged = [
            m for m in members if m["state"] == "sent" or (soaking and m["state"] == "passed")
        ]
        rolled_back = self.store.covered(conn).rolled_back if judged else {}
        facts = device_facts(conn, [int(m["device_id"]) for m in judged], now, rolled_back)
        states = {int(m["id"]): str(m["state"]) for m in members}
        verdicts = judge_members(conn, judged, states, facts, spec, now, stats)
        put = self._put_back_failed(conn, row, judged, states, now, stats)
        if verdicts["passed"] or verdicts["failed"]:
            self.store.audit(
                conn,
                tenant_id=int(row["tenant_id"]),
                actor=ACTOR,
                action="rollout.gate",
                target=f"rollout:{rollout_id}",
                detail={
                    "rollout_id": rollout_id,
                    "wave": wave,
                    **verdicts,
                    "put_back": [p.as_json() for p in put],
                },
                at=now,
            )
        failures = [m for m in members if states[int(m["id"])] in ("failed", "reverted")]
        if len(failures) - int(row["accepted_failures"]) > spec.failure_budget:
            pause_for_budget(
                conn,
                self.store,
                row=row,
                wave=wave,
                failed_ids=[int(m["id"]) for m in failures],
                failure_budget=spec.failure_budget,
                now=now,
            )
            return []
        if all(states[int(m["id"])] in TERMINAL for m in members):
            self._wave_end(conn, row, spec, now, stats)
            return []
        in_flight = sum(1 for s in states.values() if s == "sent")
        room = unavailable_limit(spec, len(members)) - in_flight
        pending = [int(m["id"]) for m in members if states[int(m["id"])] == "pending"]
        return pending[: max(0, room)]

    def _put_back_failed(
        self,
        conn: Connection,
        row: RowMapping,
        judged: list[RowMapping],
        states: dict[int, str],
        now: float,
        stats: StepStats,
    ) -> list[PutBack]:
        """A device that failed its gates just now goes back at once, within budget or not;
        what each put-back did (`states` marks the reverted ones)."""
        rollout_id = int(row["id"])
        fresh = [
            int(m["id"])
            for m in judged
            if states[int(m["id"])] == "failed" and m["state"] != "failed"
        ]
        if not fresh:
            return []
        rows = list(
            conn.execute(
                select(rollout_members, devices.c.name)
                .join(devices, devices.c.id == rollout_members.c.device_id)
                .where(rollout_members.c.id.in_(fresh))
                .order_by(rollout_members.c.id)
            ).mappings()
        )
        put = put_back(
            conn,
            self.insert_revision,
            tenant_id=int(row["tenant_id"]),
            rollout_id=rollout_id,
            members=rows,
            names={int(r["device_id"]): r["name"] for r in rows},
            author=ACTOR,
            why="it failed its gates",
            now=now,
        )
        for r, result in zip(rows, put, strict=True):
            if result.reverted_version is not None:
                states[int(r["id"])] = "reverted"
                stats.reverted += 1
        return put

    def _wave_end(
        self, conn: Connection, row: RowMapping, spec: Spec, now: float, stats: StepStats
    ) -> None:
        rollout_id, wave = int(row["id"]), int(row["current_wave"])
        if row["wave_done_at"] is None:
            conn.execute(
                update(rollouts)
                .where(rollouts.c.id == rollout_id)
                .values(wave_done_at=now, updated_at=now)
            )
            if spec.soak_seconds > 0:
                return
            done_at = now
        else:
            done_at = float(row["wave_done_at"])
        if now - done_at < spec.soak_seconds:
            return
        following = wave + 1
        values: RolloutUpdate = {"updated_at": now}
        if following >= len(spec.waves):
            state = "completed"
            values.update({"state": state, "finished_at": now})
        elif spec.waves[following].approval:
            state = "waiting-approval"
            values.update({"state": state})
        else:
            state = "running"
            values.update(
                {
                    "current_wave": following,
                    "wave_started_at": now,
                    "wave_done_at": None,
                    "accepted_failures": 0,
                }
            )
        conn.execute(update(rollouts).where(rollouts.c.id == rollout_id).values(**values))
        stats.waves.append((rollout_id, following, state))
        self.store.audit(
            conn,
            tenant_id=int(row["tenant_id"]),
            actor=ACTOR,
            action="rollout.complete" if state == "completed" else "rollout.wave",
            target=f"rollout:{rollout_id}",
            detail={
                "rollout_id": rollout_id,
                "finished_wave": wave,
                "wave": None if state == "completed" else following,
                "state": state,
            },
            at=now,
        )

    def _send(
        self, rollout_id: int, member_ids: list[int], spec: Spec, now: float, stats: StepStats
    ) -> bool:
        """Send one batch in one transaction; False when this process no longer drives it."""
        try:
            with self.store.write() as conn:
                if not take_lease(conn, rollout_id, self.holder, now, self.lease_seconds):
                    return False
                row = (
                    conn.execute(
                        select(rollouts).where(rollouts.c.id == rollout_id).with_for_update()
                    )
                    .mappings()
                    .one()
                )
                if row["state"] != "running":
                    return False
                sent, refused = send_members(
                    conn,
                    self.store,
                    self.insert_revision,
                    row=row,
                    member_ids=member_ids,
                    confirm_within=spec.confirm_within,
                    now=now,
                )
        except Lost as exc:
            log.warning("rollout %s: member %s was sent by another process", rollout_id, exc)
            return False
        except Conflict as exc:  # a version moved after it was read: the next tick names it
            log.info("rollout %s: %s; retried at the next tick", rollout_id, exc)
            return False
        stats.sent += len(sent)
        stats.failed += len(refused)
        return True
