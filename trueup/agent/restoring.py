"""The agent's restore routes, its resume at startup, and its retry timer.

Who calls this: `trueup.agent.api` (`GET /v1/restore`, `POST
/v1/restore/analyze`, `POST /v1/restore/apply` — always served, never gated
by service health) and the agent's startup thread, which resumes a pending
restore after the management tier and recovery, before the subsystem phase
(the services tier's time): management never waits for it. The startup
resume never waits for links (the subsystem phase must not wait behind it).

Then `RestoreKeeper`, a thread, takes over: a pending restore that was
refused (the writer busy, a Kea that did not take the fence, a problem in
`verifying`) is retried on a timer with a bounded back-off (1 s doubling to
60 s; the next attempt is in the record: `retry`), one waiting for links is
looked at every 0.2 s and goes on within a second of them appearing, one
waiting for a reboot is left waiting. Nothing has to restart the agent for a
restore to finish.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING

from trueup.backup.analysis import AnalysisJSON, analyze
from trueup.backup.restore import RestoreRefused, note_retry, resume, start_restore
from trueup.journal.restore import TERMINAL, RestoreRecord, boot_id, read_record

if TYPE_CHECKING:
    from trueup.agent.process import Agent

__all__ = [
    "RestoreKeeper",
    "restore_analyze",
    "restore_apply",
    "restore_resume",
    "restore_status",
]

log = logging.getLogger("trueup.agent")


def _links() -> list[str]:
    return [name for _index, name in socket.if_nameindex()]


def restore_status(agent: Agent) -> RestoreRecord | dict[str, None]:
    """`GET /v1/restore`: the record (pending or last finished), or `{"restore": null}`."""
    record = read_record(agent.state.root)
    return record if record is not None else {"restore": None}


def restore_analyze(agent: Agent, archive: str, mappings: dict[str, str]) -> AnalysisJSON:
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
) -> RestoreRecord:
    """`POST /v1/restore/apply`: start (or resume) the restore; raises RestoreRefused.

    It never waits for links here: a restore waiting for them is returned as it
    is (the record says so) and the agent's `RestoreKeeper` goes on by itself.
    """
    try:
        return start_restore(
            agent.engine,
            Path(archive),
            mode,
            mappings,
            _links(),
            reboot=reboot,
            actor=actor,
            link_wait=0.0,
        )
    finally:
        keeper = _KEEPERS.get(agent)
        if keeper is not None:
            keeper.kick()


def restore_resume(agent: Agent) -> None:
    """At startup: a pending restore goes on from its state (or keeps waiting for a reboot or
    for links); then the retry timer takes over."""
    try:
        record = resume(agent.engine, "agent", link_wait=0.0)
    except RestoreRefused as exc:
        log.error("the pending restore cannot go on now: %s", exc)
        record = None
    except Exception:  # a startup step never ends startup; the timer retries
        log.exception("resuming the pending restore failed")
        record = None
    finally:
        RestoreKeeper.start_for(agent)
    if record is not None and record.get("state") not in TERMINAL:
        log.warning("restore %s: %s; next: %s", record.get("id"), record["state"], record["next"])


_KEEPERS: weakref.WeakKeyDictionary[Agent, RestoreKeeper] = weakref.WeakKeyDictionary()


class RestoreKeeper:
    """Resumes a pending restore by itself, without a restart of the agent."""

    FIRST = 1.0  # seconds before the first retry of a refused restore
    CAP = 60.0  # the longest wait between retries
    IDLE = 5.0  # how often a finished (or absent) record is looked at; a kick wakes it at once
    LINK_SLICE = 1.0  # each attempt waits this long for links, then looks again

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.attempts = 0
        self._thread = threading.Thread(target=self._run, name="trueup-restore", daemon=True)

    @classmethod
    def start_for(cls, agent: Agent) -> RestoreKeeper:
        keeper = _KEEPERS.get(agent)
        if keeper is None:
            keeper = _KEEPERS[agent] = cls(agent)
            agent.on_stop.append(keeper.stop)
            keeper._thread.start()
        return keeper

    def kick(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def _sleep(self, seconds: float) -> None:
        # Cleared only before each attempt (`_run`): a kick that comes while an attempt
        # runs keeps the event set, so the sleep after it ends at once and looks again.
        self._wake.wait(seconds)

    def _run(self) -> None:
        delay = self.FIRST
        while not self._stop.is_set():
            self._wake.clear()
            try:
                delay = self._once(delay)
            except Exception:  # the timer itself never dies
                log.exception("the restore retry timer failed; it tries again")
                delay = min(delay * 2, self.CAP)
                self._sleep(delay)

    def _pending(self) -> RestoreRecord | None:
        record = read_record(self.agent.state.root)
        if record is None or record.get("state") in (*TERMINAL, "damaged"):
            return None
        return record

    def _once(self, delay: float) -> float:
        record = self._pending()
        if record is None:
            self.attempts = 0
            self._sleep(self.IDLE)
            return self.FIRST
        if (
            record.get("state") == "awaiting_restart"
            and record.get("reboot")
            and record.get("awaiting_boot_id") == boot_id()
        ):
            self._sleep(self.IDLE)  # waiting for the reboot it was asked to wait for
            return self.FIRST
        problem = ""
        try:
            resume(self.agent.engine, "agent", link_wait=self.LINK_SLICE)
        except RestoreRefused as exc:
            problem = str(exc)
        after = self._pending()
        if after is None:
            self.attempts = 0
            if record.get("retry"):
                log.info("restore %s finished on a retry", record.get("id"))
            return self.FIRST
        if after.get("waiting"):
            self.attempts = 0
            return self.FIRST  # looked at again at once: within a second of the link
        if not problem and not after.get("problem"):
            if after.get("state") == record.get("state"):
                self._sleep(self.FIRST)  # nothing to retry (a reboot waited for): no busy loop
            return self.FIRST
        self.attempts += 1
        log.warning(
            "restore %s stays %s (%s); retrying in %g s",
            after.get("id"),
            after.get("state"),
            problem or after.get("problem"),
            delay,
        )
        note_retry(self.agent.engine, self.attempts, time.time() + delay)
        self._sleep(delay)
        return min(delay * 2, self.CAP)
