"""An operator's requests to the agent — apply, rollback, plan, confirm, reconcile, ack — and
their one route.

Who calls this: the agent (`trueup.agent.process.Agent.requests`), for its
API routes and its control-plane sync. A write is built here with a
`Change` constructor (`trueup.reconcile.changes`) and handed to whoever
answers requests now:

* once the reconcile loop runs (the agent's phase 4), the loop
  (`ReconcileLoop.write`, `confirm`, `reconcile_now`, `acknowledge`,
  `clear_acknowledgement`): it holds a confirmation window, holds its
  passes off while the write runs, and looks again afterwards;
* before that, `BeforeLoop`: a write goes to the engine, guarded as
  everywhere, without a confirmation window (nothing would hold it yet);
  `confirm` and `ack` wait for the loop.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

from trueup.model.document import DeviceState
from trueup.model.reasons import ReasonCode
from trueup.reconcile.acks import AckAnswer
from trueup.reconcile.changes import Change, NeedsConfirmation, Origin, Refused
from trueup.reconcile.confirmwait import WRITE_LOCK_WAIT, refusal
from trueup.reconcile.engine import Engine
from trueup.reconcile.planning import PlanAnswer, plan_answer

__all__ = ["STARTING", "BeforeLoop", "Handler", "Requests"]

STARTING = "agent still starting"
_NO_WINDOW_YET = "the agent is still starting; --confirm-within is available once it runs"


class Handler(Protocol):
    """What answers requests: the reconcile loop, or `BeforeLoop` until it runs."""

    def write(self, change: Change, confirm_within: float | None) -> dict[str, Any]: ...

    def confirm(
        self, *, actor: str = "api", version: int | None = None, reason: str | None = None
    ) -> dict[str, Any]: ...

    def reconcile_now(self, subsystem: str | None, *, actor: str = "api") -> dict[str, Any]: ...

    def acknowledge(
        self, subsystem: str, seconds: float, reason: str, *, actor: str = "api"
    ) -> AckAnswer: ...

    def clear_acknowledgement(self, subsystem: str, *, actor: str = "api") -> AckAnswer: ...


class BeforeLoop:
    """The answers while the agent starts, before its reconcile loop runs."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def write(self, change: Change, confirm_within: float | None) -> dict[str, Any]:
        state = self.engine.state
        if confirm_within is not None:
            state.audit.append("apply_refused", change.actor, message=_NO_WINDOW_YET)
            return refusal(state, _NO_WINDOW_YET)
        try:
            result = self.engine.transact(replace(change, lock_wait=WRITE_LOCK_WAIT))
        except NeedsConfirmation as exc:  # audited by the engine
            return refusal(state, str(exc))
        return dict(result.to_json())

    def confirm(
        self, *, actor: str = "api", version: int | None = None, reason: str | None = None
    ) -> dict[str, Any]:
        raise Refused(ReasonCode.APPLY_NOT_COMPLETED, f"{STARTING}; retry")

    def reconcile_now(self, subsystem: str | None, *, actor: str = "api") -> dict[str, Any]:
        """Heal every subsystem towards the committed revision (nothing governs heals yet)."""
        self.engine.refuse_if_damaged()
        document = self.engine.applied_document()
        if document is None:
            return {"ok": True, "outcome": "nothing applied"}
        change = Change.heal(document, actor=actor, lock_wait=WRITE_LOCK_WAIT)
        return dict(self.engine.transact(change).to_json())

    def acknowledge(
        self, subsystem: str, seconds: float, reason: str, *, actor: str = "api"
    ) -> AckAnswer:
        return {"ok": False, "message": STARTING}

    def clear_acknowledgement(self, subsystem: str, *, actor: str = "api") -> AckAnswer:
        return {"ok": False, "message": STARTING}


class Requests:
    """The agent's requests, each built once and handed to `Handler` of the moment.

    `loop` returns the running reconcile loop, None before it runs. An
    unknown subsystem is a `KeyError`; an unknown rollback target an
    `UnknownRevision`; a refused write `Refused`.
    """

    def __init__(self, engine: Engine, loop: Callable[[], Handler | None]) -> None:
        self.engine = engine
        self._loop = loop
        self._before = BeforeLoop(engine)

    def handler(self) -> Handler:
        loop = self._loop()
        return loop if loop is not None else self._before

    def apply(
        self,
        document: DeviceState,
        *,
        mode: str = "atomic",
        expect_version: int | None = None,
        actor: str = "api",
        confirm_within: float | None = None,
        origin: Origin = "local-cli",
        override: str | None = None,
    ) -> dict[str, Any]:
        change = Change.apply(
            document,
            origin=origin,
            actor=actor,
            mode=mode,
            expect_version=expect_version,
            override=override,
        )
        return self.handler().write(change, confirm_within)

    def rollback(
        self,
        to: int | None,
        *,
        expect_version: int | None = None,
        actor: str = "api",
        confirm_within: float | None = None,
        override: str | None = None,
    ) -> dict[str, Any]:
        """An earlier revision (default the one before) as a new version, guarded like an apply."""
        applied_version = self.engine.state.applied().version
        target, document = self.engine.revision_document(to)
        change = Change.rollback(
            document,
            target=target,
            applied_version=applied_version,
            actor=actor,
            expect_version=expect_version,
            override=override,
        )
        return self.handler().write(change, confirm_within)

    def plan(self, document: DeviceState) -> PlanAnswer:
        """What applying `document` would change, observed where this agent runs."""
        try:
            previous = self.engine.applied_document()
        except Exception:  # an unreadable revision: planned as from nothing, never a 500
            previous = None
        return plan_answer(self.engine, document, previous=previous, agent_pid=os.getpid())

    def confirm(self, *, actor: str = "api") -> dict[str, Any]:
        return self.handler().confirm(actor=actor)

    def reconcile(self, subsystem: str | None, *, actor: str = "api") -> dict[str, Any]:
        if subsystem is not None:
            self._known(subsystem)
        return self.handler().reconcile_now(subsystem, actor=actor)

    def acknowledge(
        self, subsystem: str, seconds: float, reason: str, *, actor: str = "api"
    ) -> AckAnswer:
        self._known(subsystem)
        return self.handler().acknowledge(subsystem, seconds, reason, actor=actor)

    def clear_acknowledgement(self, subsystem: str, *, actor: str = "api") -> AckAnswer:
        self._known(subsystem)
        return self.handler().clear_acknowledgement(subsystem, actor=actor)

    def _known(self, subsystem: str) -> None:
        if subsystem not in self.engine.by_name:
            raise KeyError(subsystem)
