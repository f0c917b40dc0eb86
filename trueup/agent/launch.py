"""Run the agent from its options: the one implementation behind `trueup agent run`.

Who calls this: `trueup.agent.fastboot.boot` once the fast path has
management up and its listeners answering (it hands them over), and the
typer `agent run` command when the console entry was bypassed (no handover).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

from trueup.agent.fastboot import AgentOptions, Handover
from trueup.agent.process import Agent
from trueup.agent.wiring import wire
from trueup.reconcile import faults
from trueup.subsystems.base import Subsystem
from trueup.subsystems.registry import default_subsystems, load_plugin, ordered
from trueup.system.hostinfo import AGENT_LOG
from trueup.system.safefile import open_file

__all__ = ["run_agent"]

log = logging.getLogger("trueup.agent")


class _AppendHandler(logging.Handler):
    """Appends each record to a file it opens and closes every time.

    The agent holds no file in the state directory open between records: a
    state directory on its own filesystem can still be remounted (read-only,
    resized) under a running agent. At `max_bytes` the file moves to `NAME.1`.
    A write that fails (full, read-only) loses the line, never the agent.
    """

    def __init__(self, path: Path, max_bytes: int = 5 * 1024 * 1024) -> None:
        super().__init__()
        self.path = path
        self.max_bytes = max_bytes

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + "\n"
            fd = open_file(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            if os.fstat(fd).st_size > self.max_bytes:
                os.close(fd)
                os.replace(self.path, self.path.with_name(self.path.name + ".1"))
                fd = open_file(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            try:
                os.write(fd, line.encode("utf-8", "replace"))
            finally:
                os.close(fd)
        except OSError:
            # The log file is a convenience; stderr (journald) still has the line.
            # One that is not a regular file of ours is never written through
            # (trueup.system.safefile) and is named by trueup.journal.damage.
            pass


def _log_to_state_dir(options: AgentOptions) -> None:
    """Also write the log to `STATE_DIR/agent.log` (moved to `agent.log.1` at 5 MB).

    Evidence and doctor read its last lines when the agent does not run under
    systemd (journald has them otherwise).
    """
    handler = _AppendHandler(Path(options.state_dir) / AGENT_LOG)
    formatter = logging.Formatter(
        "%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%Y-%m-%dT%H:%M:%SZ"
    )
    formatter.converter = time.gmtime
    handler.setFormatter(formatter)
    logging.getLogger().addHandler(handler)


def _heartbeat(value: str, default: float = 30.0) -> float:
    """`TRUEUP_HEARTBEAT_SECONDS`: seconds above 0; anything else is logged and the default holds."""
    if not value:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if seconds > 0 and seconds != float("inf"):
        return seconds
    log.error("TRUEUP_HEARTBEAT_SECONDS=%r: not a number above 0; %g is used", value, default)
    return default


def run_agent(options: AgentOptions, handover: Handover | None = None) -> int:
    """Build, wire and run the agent; its exit code (1 for a plugin that does not load)."""
    logging.basicConfig(
        level=getattr(logging, options.log_level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    subsystems: list[Subsystem] = default_subsystems()
    for reference in options.plugins:
        try:
            subsystems.append(load_plugin(reference))
        except (ImportError, AttributeError, ValueError) as exc:
            print(f"trueup: --plugin {reference}: {exc}", file=sys.stderr)
            return 1
    handover = handover or Handover()
    _log_to_state_dir(options)
    for problem in faults.problems(
        os.environ.get("TRUEUP_FAULT", ""), (s.name for s in subsystems)
    ):
        log.error("TRUEUP_FAULT: %s", problem)
    agent = Agent(
        options.state_dir,
        config_path=str(options.config) if options.config else None,
        fallback_path=str(options.management_fallback) if options.management_fallback else None,
        listen_port=options.listen_port,
        subsystems=ordered(subsystems),
        early_sockets=handover.sockets,
        early_release=handover.release,
        agent_lock=handover.agent_lock,
    )
    if handover.steps:
        # Phase 1 will find these done; the audit still says who restored management.
        try:
            agent.state.audit.append(
                "management_restored", "startup", steps=handover.steps, fast_path=handover.source
            )
        except Exception:  # a damaged audit log never keeps management down
            log.exception("recording the fast path's management restore failed")
    wire(
        agent,
        control_plane=options.control_plane,
        token_file=options.token_file,
        heartbeat=_heartbeat(os.environ.get("TRUEUP_HEARTBEAT_SECONDS", "")),
    )
    return agent.run()
