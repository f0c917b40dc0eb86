"""Wires the optional parts of an agent: the reconcile loop and the control-plane sync."""

from __future__ import annotations

from pathlib import Path

from trueup.agent.process import Agent

__all__ = ["wire"]


def wire(agent: Agent, *, control_plane: str | None, token_file: Path | None) -> None:
    if control_plane is not None or token_file is not None:
        raise SystemExit("trueup: --control-plane needs the control-plane client (not wired)")
