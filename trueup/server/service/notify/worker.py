"""The notifier: a background thread in the server process that turns state into webhooks.

It takes committed agent reports from ingest (`submit`, in commit order), runs
the periodic scan (missed reports, heartbeat staleness, escalation), and sends
due deliveries, a few at a time, each signed:

    X-Trueup-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>." + body)>
    X-Trueup-Event-Id:  <event id>   (also Idempotency-Key; receivers deduplicate on it)

Before each attempt the target policy vets the URL (policy.py): the name is
resolved once through `resolve` (the seam tests replace), every address it
resolves to is checked against the policy and the tenant's allowlist, and the
request goes to the vetted address with the name in the Host header and the TLS
server name. The client uses no proxy from the environment and keeps no
connection alive, so each request goes where it was vetted. The log records
error classes (failures.py), never socket errors or a header's value.

All of its state is in the database, so a restart loses nothing: a delivery in
flight when the process died is sent again once its lease runs out.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from trueup.model.jsontypes import JSONObject
from trueup.server.service.errors import Invalid
from trueup.server.service.notify.deliveries import Claimed, Deliveries
from trueup.server.service.notify.engine import Engine
from trueup.server.service.notify.failures import (
    DNS_FAILURE,
    POLICY,
    failure_class,
    status_class,
)
from trueup.server.service.notify.policy import (
    PolicyRefused,
    Resolve,
    redact,
    system_resolve,
    vet,
)

__all__ = ["Notifier", "sign", "verify"]

log = logging.getLogger("trueup.server.notify")

SIGNATURE_HEADER = "X-Trueup-Signature"
EVENT_HEADER = "X-Trueup-Event-Id"
# Reports evaluated in one transaction; reports waiting beyond QUEUE_LIMIT are left
# to the periodic scan (it compares the device's latest report, so only the final
# state of a burst is judged then).
OBSERVE_BATCH = 2000
QUEUE_LIMIT = 100_000


def sign(secret: bytes, timestamp: int, body: bytes) -> str:
    mac = hmac.new(secret, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def verify(secret: bytes, header: str, body: bytes, tolerance: float = 300.0) -> bool:
    """What a receiver does (docs/notifications.md): the MAC, and a timestamp not too old."""
    parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    try:
        timestamp = int(parts["t"])
    except (KeyError, ValueError):
        return False
    if abs(time.time() - timestamp) > tolerance:
        return False
    expected = sign(secret, timestamp, body).split(",v1=", 1)[1]
    return hmac.compare_digest(expected, parts.get("v1", ""))


class Notifier:
    def __init__(
        self,
        engine: Engine,
        deliveries: Deliveries,
        *,
        poll_seconds: float = 1.0,
        scan_seconds: float = 5.0,
        timeout: float = 10.0,
        senders: int = 4,
        resolve: Resolve = system_resolve,
    ) -> None:
        self.engine = engine
        self.resolve = resolve
        self.deliveries = deliveries
        self.poll_seconds = poll_seconds
        self.scan_seconds = scan_seconds
        self.timeout = timeout
        self.senders = senders
        self._reports: queue.Queue[tuple[int, JSONObject, float]] = queue.Queue(QUEUE_LIMIT)
        self._overflowed = False
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def submit(self, device_id: int, report: JSONObject, received_at: float) -> None:
        """A report ingest has committed (called from the ingest thread; never blocks)."""
        try:
            self._reports.put_nowait((device_id, report, received_at))
        except queue.Full:
            # Far behind: the periodic scan evaluates the device's latest report instead.
            if not self._overflowed:
                log.warning("notifier: report queue full; the scan catches up")
            self._overflowed = True
        else:
            self._overflowed = False
        self._wake.set()

    def wake(self) -> None:
        """Look for due deliveries now (after a redelivery, say)."""
        self._wake.set()

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="notifier", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._wake.set()
            self._thread.join(timeout=30)
            self._thread = None

    def _run(self) -> None:
        last_scan = 0.0
        with (
            httpx.Client(
                timeout=self.timeout,
                follow_redirects=False,
                trust_env=False,  # no proxy: the request goes to the vetted address
                limits=httpx.Limits(max_keepalive_connections=0),
            ) as client,
            ThreadPoolExecutor(self.senders, thread_name_prefix="notify-send") as pool,
        ):
            while not self._stop.is_set():
                try:
                    self._observe_queued()
                    if time.monotonic() - last_scan >= self.scan_seconds:
                        self.engine.scan()
                        last_scan = time.monotonic()
                    claimed = self.deliveries.claim(limit=self.senders * 4)
                    list(pool.map(lambda c: self._send(client, c), claimed))
                    if claimed:
                        continue  # more may be due
                except Exception:  # the notifier must outlive any failure; state is in the DB
                    log.exception("notifier pass failed")
                self._wake.wait(self.poll_seconds)
                self._wake.clear()

    def _observe_queued(self) -> None:
        while True:
            batch: list[tuple[int, JSONObject, float]] = []
            while len(batch) < OBSERVE_BATCH:
                try:
                    batch.append(self._reports.get_nowait())
                except queue.Empty:
                    break
            if not batch:
                return
            try:
                self.engine.observe_batch(batch)
            except Exception:  # the scan catches up from device_state
                log.exception("notifier: %d reports not evaluated", len(batch))

    def _send(self, client: httpx.Client, item: Claimed) -> None:
        started = time.monotonic()
        try:
            pinned = vet(item.url, item.allowlist, self.resolve)
        except (PolicyRefused, Invalid) as exc:
            self._record(item, started, None, f"{POLICY}: {exc}", final=True)
            return
        except (OSError, UnicodeError, ValueError):  # the resolver's failure, whatever it says
            self._record(item, started, None, DNS_FAILURE)
            return
        headers = {}
        if item.auth_header is not None:
            headers[item.auth_header[0]] = item.auth_header[1]
        headers.update(
            {
                "Host": pinned.host_header,
                "Content-Type": "application/json",
                "User-Agent": "trueup-notify/1",
                EVENT_HEADER: item.event_id,
                "Idempotency-Key": item.event_id,
                "X-Trueup-Event-Kind": item.kind,
                "X-Trueup-Delivery-Attempt": str(item.attempt),
                SIGNATURE_HEADER: sign(item.secret, int(time.time()), item.body),
            }
        )
        extensions = {"sni_hostname": pinned.sni_hostname} if pinned.sni_hostname else None
        status: int | None = None
        try:
            response = client.post(
                pinned.url, content=item.body, headers=headers, extensions=extensions
            )
            status = response.status_code
            error = status_class(status)
        except httpx.HTTPError as exc:
            error = failure_class(exc)
        except Exception:  # recorded like any failed attempt; the operator's log has the detail
            log.exception("notification %s: the request failed", item.event_id)
            error = "request failed"
        self._record(item, started, status, error)

    def _record(
        self,
        item: Claimed,
        started: float,
        status: int | None,
        error: str | None,
        *,
        final: bool = False,
    ) -> None:
        latency = (time.monotonic() - started) * 1000
        state = self.deliveries.record(
            item.id,
            ok=error is None,
            status_code=status,
            latency_ms=latency,
            error=error,
            final=final,
        )
        if state == "dead":
            log.warning("notification %s to %s is dead: %s", item.event_id, redact(item.url), error)
