"""The agent's sync with its control plane: pull desired revisions, push reports.

`SyncLoop` runs two threads over a `trueup.agent.cpclient.ControlPlaneClient`:
one long-polls for revisions and hands each to the `apply` callable the agent
gives it (the same transaction path as a local apply), one reports whatever
`snapshot()` returns (`trueup.agent.cpreport.report_from_status`), paced by a
`ReportPacer`. While the control plane is unreachable the agent keeps
enforcing its last accepted revision; the loop only backs off (exponential,
full jitter) and reconnects. `SyncLoop.last_contact_at` is when the latest
request that the control plane answered was sent: the proof that the path to
it works after an apply.
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypedDict

from trueup.agent.cpclient import (
    Backoff,
    ControlPlaneClient,
    ControlPlaneError,
    ControlPlaneRefused,
    RetryLater,
)
from trueup.agent.cpreport import ReportPacer
from trueup.model.jsontypes import JSONObject

__all__ = ["ApplyRevision", "SyncLoop", "SyncStatus"]

log = logging.getLogger("trueup.agent.cpclient")


class ApplyRevision(Protocol):
    """How `SyncLoop` hands over a revision; `confirm_within` only when it has a window."""

    def __call__(
        self, document: JSONObject, version: int, /, *, confirm_within: float | None = ...
    ) -> None: ...


class SyncStatus(TypedDict):
    """Status' `control_plane` section: the sync's connection, versions and counters."""

    url: str | None
    connected: bool
    control_plane_version: int | None
    last_error: str | None
    last_apply_error: str | None
    last_report_at: float | None
    reports_sent: int
    reports_throttled: int
    last_contact_at: float | None


class SyncLoop:
    """Two threads: one long-polls for revisions and applies them, one reports.

    `apply(document, version)` must raise if the agent did not accept the
    revision; the loop then reports (the report carries the agent's reason
    codes) and waits for a newer revision rather than retrying the same one.
    `snapshot()` returns the report payload (see `report_from_status`).
    Reports go out after every accepted revision, whenever `request_report()`
    is called (a change an operator sees: `trueup.agent.reportwatch`), and every
    heartbeat interval; coalesced by a `ReportPacer` (at most one report each
    `min_report_interval` seconds).
    """

    def __init__(
        self,
        client: ControlPlaneClient,
        apply: ApplyRevision,
        snapshot: Callable[[], JSONObject],
        *,
        heartbeat_interval: float = 30.0,
        initial_version: int = 0,
        long_poll_seconds: float = 30.0,
        backoff_initial: float = 1.0,
        backoff_max: float = 60.0,
        build_evidence: Callable[[Path], None] | None = None,
        min_report_interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.clock = clock
        self.pacer = ReportPacer(heartbeat=heartbeat_interval, min_interval=min_report_interval)
        self.reports_throttled = 0
        self.build_evidence = build_evidence
        self.apply = apply
        self.snapshot = snapshot
        self.heartbeat_interval = heartbeat_interval
        self.long_poll_seconds = long_poll_seconds
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.seen_version = initial_version
        self.control_plane_version: int | None = None
        self.connected = False
        self.last_error: str | None = None
        self.last_apply_error: str | None = None
        self.last_report_at: float | None = None
        # When the latest request the control plane answered was sent (wall clock).
        self.last_contact_at: float | None = None
        self.reports_sent = 0
        self._stop = threading.Event()
        self._report_now = threading.Event()
        self._threads: list[threading.Thread] = []

    def status(self) -> SyncStatus:
        return {
            "url": self.client.url,
            "connected": self.connected,
            "control_plane_version": self.control_plane_version,
            "last_error": self.last_error,
            "last_apply_error": self.last_apply_error,
            "last_report_at": self.last_report_at,
            "reports_sent": self.reports_sent,
            "reports_throttled": self.reports_throttled,
            "last_contact_at": self.last_contact_at,
        }

    def start(self) -> None:
        for name, target in (("cp-pull", self._pull), ("cp-report", self._report)):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._report_now.set()
        for thread in self._threads:
            thread.join(timeout)
        self._threads.clear()

    def request_report(self) -> None:
        self.pacer.request()
        self._report_now.set()

    def _contact(self, sent_at: float) -> None:
        self.connected = True
        if self.last_contact_at is None or sent_at > self.last_contact_at:
            self.last_contact_at = sent_at

    def _failed(self, where: str, exc: Exception, backoff: Backoff) -> None:
        self.connected = False
        self.last_error = f"{where}: {exc}"
        delay = backoff.next_delay()
        log.warning("control plane %s failed (%s); retrying in %.1fs", where, exc, delay)
        self._stop.wait(delay)

    def _pull(self) -> None:
        backoff = Backoff(self.backoff_initial, self.backoff_max)
        while not self._stop.is_set():
            sent_at = time.time()
            try:
                revision = self.client.wait_for_revision(self.seen_version, self.long_poll_seconds)
            except ControlPlaneError as exc:
                self._failed("pull", exc, backoff)
                continue
            self._contact(sent_at)
            backoff.reset()
            if revision is None:
                continue
            version, document = revision.version, revision.document
            self.control_plane_version = version
            try:
                if revision.confirm_within is None:
                    self.apply(document, version)
                else:
                    self.apply(document, version, confirm_within=revision.confirm_within)
                self.last_apply_error = None
            except RetryLater as exc:
                # Another writer held the device, or the state directory refused a
                # write: the same revision is asked for again after a back-off.
                self.last_apply_error = f"revision {version}: {exc} (will retry)"
                log.warning("control-plane revision %d deferred: %s", version, exc)
                self.request_report()
                self._stop.wait(backoff.next_delay())
                continue
            except Exception as exc:
                self.last_apply_error = f"revision {version}: {exc}"
                log.warning("control-plane revision %d not applied: %s", version, exc)
            self.seen_version = version
            self.request_report()

    def answer_evidence_request(self) -> JSONObject | None:
        """If an operator asked for fresh evidence, build a bundle and upload it.

        Checked after every report (so at least every heartbeat); a failure is logged
        and the request stays pending, to be answered after a later report.
        """
        if self.build_evidence is None:
            return None
        try:
            pending = self.client.evidence_request()
            if pending is None:
                return None
            with tempfile.TemporaryDirectory(prefix="trueup-evidence-") as tmp:
                bundle = Path(tmp) / "evidence.tar.gz"
                self.build_evidence(bundle)
                return self.client.upload_evidence(
                    bundle, {"source": "agent", "request_id": pending.get("id")}, attempts=1
                )
        except ControlPlaneError as exc:
            log.warning("evidence request not answered: %s", exc)
        except Exception as exc:  # building the bundle must not end the report loop
            log.warning("evidence request not answered: %s: %s", type(exc).__name__, exc)
        return None

    def _report(self) -> None:
        backoff = Backoff(self.backoff_initial, self.backoff_max)
        while not self._stop.is_set():
            # Wait until the pacer says a report is due; a request meanwhile may bring it
            # forward (a change after a quiet heartbeat interval goes out at once).
            delay = self.pacer.due_at() - self.clock()
            if delay > 0:
                self._report_now.wait(delay)
                self._report_now.clear()
                continue
            if self.send_report(backoff):
                self.answer_evidence_request()

    def send_report(self, backoff: Backoff | None = None) -> bool:
        """Build and send one report now; True when the control plane took it."""
        backoff = backoff or Backoff(self.backoff_initial, self.backoff_max)
        self.pacer.taken()
        sent_at = time.time()
        try:
            payload = dict(self.snapshot())
            payload["heartbeat_interval"] = self.heartbeat_interval
            self.client.report(payload)
        except ControlPlaneRefused as exc:
            if exc.status_code != 429:
                self.pacer.request()  # the state still has to reach the control plane
                self._failed("report", exc, backoff)
                return False
            # Too many reports: back off as told; the next report carries the latest state.
            self.reports_throttled += 1
            self.pacer.throttled(self.clock(), exc.retry_after)
            self.last_error = f"report: {exc}"
            log.warning("control plane throttled reports (%s); backing off", exc)
            return False
        except ControlPlaneError as exc:
            self.pacer.request()
            self._failed("report", exc, backoff)
            return False
        except Exception as exc:  # a snapshot that fails must not end the loop
            self.pacer.request()
            self._failed("snapshot", exc, backoff)
            return False
        self._contact(sent_at)
        self.last_report_at = time.time()
        self.reports_sent += 1
        self.pacer.sent(self.clock())
        backoff.reset()
        return True
