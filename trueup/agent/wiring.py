"""Wires the optional parts of an agent: the reconcile loop and the control-plane sync."""

from __future__ import annotations

from pathlib import Path

from trueup.agent.process import Agent
from trueup.reconcile.loop import ReconcileLoop

__all__ = ["wire"]


def _reconcile_loop(agent: Agent) -> ReconcileLoop:
    return ReconcileLoop.from_env(agent.engine)


def wire(agent: Agent, *, control_plane: str | None, token_file: Path | None) -> None:
    agent.loop_factory = _reconcile_loop
    if control_plane is not None or token_file is not None:
        raise SystemExit("trueup: --control-plane needs the control-plane client (not wired)")
