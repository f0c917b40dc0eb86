"""What `trueup plan` answers: one body, from the agent (`POST /v1/plan`) or the CLI alone.

Who calls this: the agent's API (`trueup.reconcile.requests.Requests.plan`)
and the CLI when no agent runs. Both observe the system where they run and
say so in `observed_by` — the agent its pid; the CLI `agent_pid: null` —
so an operator sees which network namespace the plan speaks of
(docs/agent-api.md, `POST /v1/plan`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypedDict

from trueup.model.document import DeviceState
from trueup.reconcile.engine import Engine
from trueup.reconcile.guard import subsystem_risks, unsafe_management_changes
from trueup.subsystems.base import Plan
from trueup.system.hostinfo import network_namespace

__all__ = ["ObservedBy", "ObservedByJSON", "PlanAnswer", "plan_answer"]


class ObservedByJSON(TypedDict):
    agent_pid: int | None
    state_dir: str
    netns: str | None
    applied_version: int


@dataclass(frozen=True)
class ObservedBy:
    """Where a plan was observed: the agent (its pid) or a CLI process (`agent_pid` None)."""

    agent_pid: int | None
    state_dir: str
    netns: str | None
    applied_version: int

    def to_json(self) -> ObservedByJSON:
        return {
            "agent_pid": self.agent_pid,
            "state_dir": self.state_dir,
            "netns": self.netns,
            "applied_version": self.applied_version,
        }


@dataclass(frozen=True)
class PlanAnswer:
    """The steps per subsystem, what they do to management access, who manages the device."""

    plans: list[Plan]
    management_changes: list[str]
    managed_by: str | None
    observed_by: ObservedBy

    def to_json(self) -> dict[str, Any]:
        plans = self.plans
        return {
            "changes": any(p.changes for p in plans),
            "plans": [
                {
                    "subsystem": p.subsystem,
                    "steps": [p.step_json(s) for s in p.steps],
                    "noop": p.noop_reasons,
                    "error": p.error,
                }
                for p in plans
            ],
            "failed": {p.subsystem: p.error for p in plans if p.error},
            "management_changes": self.management_changes,
            "needs_confirmation": bool(self.management_changes),
            "managed_by": self.managed_by,
            "observed_by": self.observed_by.to_json(),
        }


def plan_answer(
    engine: Engine,
    document: DeviceState,
    *,
    previous: DeviceState | None,
    agent_pid: int | None,
) -> PlanAnswer:
    """What applying `document` over `previous` (the applied one) would change, observed here."""
    plans = engine.plan(document)
    unsafe = unsafe_management_changes(previous, document) + subsystem_risks(
        engine.subsystems, previous, document, engine.api_port
    )
    return PlanAnswer(
        plans=plans,
        management_changes=unsafe,
        managed_by=engine.managed_by(),
        observed_by=ObservedBy(
            agent_pid=agent_pid,
            state_dir=str(engine.state.root),
            netns=network_namespace(),
            applied_version=engine.state.applied().version,
        ),
    )
