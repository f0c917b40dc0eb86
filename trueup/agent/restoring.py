"""The agent's restore routes and its resume at startup.

Who calls this: `trueup.agent.api` (`GET /v1/restore`, `POST
/v1/restore/analyze`, `POST /v1/restore/apply` — always served, never gated
by service health) and the agent's startup thread, which resumes a pending
restore after the management tier and recovery, before the subsystem phase
(the services tier's time): management never waits for it.
"""

from __future__ import annotations

import logging
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trueup.backup.analysis import analyze
from trueup.backup.restore import RestoreRefused, resume, start_restore
from trueup.journal.restore import read_record

if TYPE_CHECKING:
    from trueup.agent.process import Agent

__all__ = ["restore_analyze", "restore_apply", "restore_resume", "restore_status"]

log = logging.getLogger("trueup.agent")


def _links() -> list[str]:
    return [name for _index, name in socket.if_nameindex()]


def restore_status(agent: Agent) -> dict[str, Any]:
    """`GET /v1/restore`: the record (pending or last finished), or `{"restore": null}`."""
    record = read_record(agent.state.root)
    return record if record is not None else {"restore": None}


def restore_analyze(agent: Agent, archive: str, mappings: dict[str, str]) -> dict[str, Any]:
    """`POST /v1/restore/analyze`: the analysis of an archive on this router (read-only)."""
    return analyze(Path(archive), agent.state, _links(), mappings).to_json()


def restore_apply(
    agent: Agent,
    archive: str,
    mode: str,
    mappings: dict[str, str],
    *,
    reboot: bool,
    actor: str,
) -> dict[str, Any]:
    """`POST /v1/restore/apply`: start (or resume) the restore; raises RestoreRefused."""
    return start_restore(
        agent.engine, Path(archive), mode, mappings, _links(), reboot=reboot, actor=actor
    )


def restore_resume(agent: Agent) -> None:
    """At startup: a pending restore goes on from its state (or keeps waiting for a reboot)."""
    try:
        record = resume(agent.engine, "agent")
    except RestoreRefused as exc:
        log.error("the pending restore cannot go on: %s", exc)
        return
    if record is not None and record.get("state") not in ("completed", "rolled_back"):
        log.warning("restore %s: %s; next: %s", record.get("id"), record["state"], record["next"])
