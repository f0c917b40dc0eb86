"""The agent's control-plane client: enrollment, long-poll pull of desired state, reports.

Who calls this: the agent process, when started with `--control-plane URL
--token-file F`. It never touches local state itself: `SyncLoop` hands each
new revision to the `apply` callable the agent gives it (the same transaction
path as a local apply) and reports whatever `snapshot()` returns. While the
control plane is unreachable the agent keeps enforcing its last accepted
revision; the loop only backs off (exponential, full jitter) and reconnects.

A revision may carry a confirmation window (`confirm_within`, seconds): the
agent then applies it with `--confirm-within` semantics and confirms it itself
once its health holds (`trueup.agent.selfconfirm`); a control plane that
sends none (an older one) means no window. `SyncLoop.last_contact_at` is when
the latest request that the control plane answered was sent: the proof that
the path to it works after an apply.

`upload_backup(path, metadata)` sends a backup archive of this device (streamed,
retried while the control plane is unavailable).

Errors::

    ControlPlaneError
    ├── ControlPlaneUnavailable   network error, timeout or 5xx: retry later
    └── ControlPlaneRefused       4xx: the credential is revoked, the request bad, …

Why this module is over 400 lines: the control-plane client (TLS pinning,
enrollment, long-poll, reports, backup upload) and the sync loop that drives it share one
error vocabulary.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol
from urllib.parse import urlsplit

import httpx

from trueup import __version__
from trueup.model.digests import json_digest, sha256_digest
from trueup.model.document import SUPPORTED_API_VERSIONS, supported_sections
from trueup.model.report import AgentReport
from trueup.system.atomicfile import write_atomic

__all__ = [
    "ControlPlaneClient",
    "ControlPlaneError",
    "ControlPlaneRefused",
    "ControlPlaneUnavailable",
    "DesiredRevision",
    "RetryLater",
    "SyncLoop",
    "report_from_status",
]

log = logging.getLogger("trueup.agent.cpclient")


class ControlPlaneError(Exception):
    pass


# The longest confirmation window an agent accepts from a control plane (one day).
MAX_CONFIRM_WITHIN = 86400.0


@dataclass(frozen=True)
class DesiredRevision:
    """A revision as the control plane delivers it: number, document, confirmation window."""

    version: int
    document: dict[str, Any]
    confirm_within: float | None = None


def _window(value: Any) -> float | None:
    """The delivered `confirm_within`; absent, null or not a positive number of seconds up to
    a day: no window (logged when it was something else)."""
    if value is None:
        return None
    if (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and 0 < value <= MAX_CONFIRM_WITHIN
    ):
        return float(value)
    log.warning("control plane sent confirm_within=%r; applying without a window", value)
    return None


class ControlPlaneUnavailable(ControlPlaneError):
    pass


class ControlPlaneRefused(ControlPlaneError):
    def __init__(self, status_code: int, detail: str, *, retry_after: float | None = None) -> None:
        self.status_code = status_code
        # 429: the control plane's Retry-After (seconds), when it sent one.
        self.retry_after = retry_after
        super().__init__(f"control plane refused the request ({status_code}): {detail}")


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("Retry-After", "")
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if 0 <= seconds <= 3600 else None


def _write_private(path: Path, text: str) -> None:
    """Atomically write a 0600 file (the one atomic write: temp file, fsync, rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text.encode(), 0o600)


def _pinned_path(token_file: Path) -> Path:
    return token_file.with_name(token_file.name + ".server.pem")


def _fetch_pinned_certificate(url: str, fingerprint: str) -> str:
    """The server's certificate (PEM) if its SHA-256 matches the enrollment bundle's pin."""
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    pem = ssl.get_server_certificate((host, parts.port or 443), timeout=10)
    der = ssl.PEM_cert_to_DER_cert(pem)
    actual = sha256_digest(der)
    if actual != fingerprint:
        raise ControlPlaneRefused(
            0,
            f"{url} presented certificate {actual}, but the enrollment bundle pins "
            f"{fingerprint}; not sending the enrollment token",
        )
    return pem


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    if isinstance(body, dict):
        problems = body.get("problems")
        detail = str(body.get("detail", body))
        return detail + ("".join(f"\n  {p}" for p in problems) if problems else "")
    return str(body)


class ControlPlaneClient:
    """One device's HTTP client for the control plane's /api/v1/agent routes."""

    def __init__(self, url: str | None, token_file: str | Path, *, timeout: float = 15.0) -> None:
        self.url = url.rstrip("/") if url else None
        self.token_file = Path(token_file)
        self.timeout = timeout
        self._token: str | None = None
        self._local = threading.local()

    # -- plumbing ------------------------------------------------------------------------------

    def _verify(self) -> ssl.SSLContext | bool:
        pinned = _pinned_path(self.token_file)
        if pinned.exists():
            return ssl.create_default_context(cadata=pinned.read_text())
        return True

    def _http(self) -> httpx.Client:
        # One connection pool per thread: the long poll must not hold up a report.
        client: httpx.Client | None = getattr(self._local, "client", None)
        if client is None:
            client = httpx.Client(verify=self._verify(), timeout=self.timeout)
            self._local.client = client
        return client

    def token(self) -> str:
        if self._token is None:
            try:
                self._token = self.token_file.read_text().strip()
            except OSError as exc:
                raise ControlPlaneRefused(
                    0,
                    f"cannot read the device credential {self.token_file}: {exc.strerror}; "
                    "enroll the device first",
                ) from None
        return self._token

    def _request(
        self, method: str, path: str, *, timeout: float | None = None, **kwargs: Any
    ) -> httpx.Response:
        if self.url is None:
            raise ControlPlaneRefused(0, "no control-plane URL configured")
        headers = {"Authorization": f"Bearer {self.token()}", **kwargs.pop("headers", {})}
        try:
            response = self._http().request(
                method,
                self.url + path,
                headers=headers,
                timeout=timeout if timeout is not None else self.timeout,
                **kwargs,
            )
        except httpx.HTTPError as exc:
            raise ControlPlaneUnavailable(f"{self.url}: {exc.__class__.__name__}: {exc}") from None
        if response.status_code >= 500:
            raise ControlPlaneUnavailable(f"{self.url}{path}: {response.status_code}")
        if response.status_code >= 400:
            raise ControlPlaneRefused(
                response.status_code, _detail(response), retry_after=_retry_after(response)
            )
        return response

    def close(self) -> None:
        client = getattr(self._local, "client", None)
        if client is not None:
            client.close()
            self._local.client = None

    # -- the agent's four questions -----------------------------------------------------------

    def exchange_enrollment(self, bundle_path: str | Path) -> str:
        """Trade an enrollment bundle for a device credential, stored in the token file."""
        try:
            bundle = json.loads(Path(bundle_path).read_text())
        except (OSError, ValueError) as exc:
            raise ControlPlaneRefused(
                0, f"{bundle_path}: not an enrollment bundle: {exc}"
            ) from None
        if not isinstance(bundle, dict) or bundle.get("kind") != "trueup-enrollment":
            raise ControlPlaneRefused(0, f"{bundle_path}: not a trueup enrollment bundle")
        url = str(self.url or bundle["control_plane"]).rstrip("/")
        verify: ssl.SSLContext | bool = True
        pem: str | None = None
        fingerprint = bundle.get("server_certificate_sha256")
        if fingerprint:
            pem = _fetch_pinned_certificate(url, fingerprint)
            verify = ssl.create_default_context(cadata=pem)
        try:
            with httpx.Client(verify=verify, timeout=self.timeout) as client:
                response = client.post(
                    url + "/api/v1/agent/enroll",
                    headers={"Authorization": f"Bearer {bundle['token']}"},
                )
        except httpx.HTTPError as exc:
            raise ControlPlaneUnavailable(f"{url}: {exc}") from None
        if response.status_code != 200:
            raise ControlPlaneRefused(response.status_code, _detail(response))
        credential = str(response.json()["credential"])
        if pem is not None:
            _write_private(_pinned_path(self.token_file), pem)
        _write_private(self.token_file, credential + "\n")
        self.url = url
        self._token = credential
        self.close()
        return credential

    def wait_for_desired(self, after: int, wait: float) -> tuple[int, dict[str, Any]] | None:
        """The newest revision if newer than `after`; waits up to `wait` seconds for one."""
        revision = self.wait_for_revision(after, wait)
        return None if revision is None else (revision.version, revision.document)

    def wait_for_revision(self, after: int, wait: float) -> DesiredRevision | None:
        """`wait_for_desired` with the revision's confirmation window."""
        response = self._request(
            "GET",
            "/api/v1/agent/desired",
            params={"after": after, "wait": wait},
            timeout=wait + self.timeout,
        )
        if response.status_code == 204:
            return None
        body = response.json()
        return DesiredRevision(
            int(body["version"]), dict(body["document"]), _window(body.get("confirm_within"))
        )

    def report(self, payload: dict[str, Any]) -> None:
        self._request("POST", "/api/v1/agent/report", json=payload)

    def secrets(self) -> dict[str, Any]:
        """This device's secrets: `{"secrets": {name: value}, "refused": [...]}`."""
        return dict(self._request("GET", "/api/v1/agent/secrets").json())

    def upload_backup(
        self,
        path: str | Path,
        metadata: dict[str, Any] | None = None,
        *,
        attempts: int = 5,
        sleep: Callable[[float], None] = time.sleep,
    ) -> dict[str, Any]:
        """Upload a backup archive of this device; the control plane's summary of it.

        The file is read twice, chunk by chunk, never whole: once for its sha256
        (sent as X-Trueup-Backup-Sha256, which the control plane checks), once as
        the body, with its Content-Length so that an archive over the server's limit
        is refused (413) before it is sent. `metadata` (format_version, created_at,
        agent_version, applied_revision, with_leases) goes along as JSON. An
        unavailable control plane (network, 503, …) is retried `attempts` times with
        exponential backoff; a refusal (4xx) is raised at once (ControlPlaneRefused).
        """
        return self._upload_file(
            path, "/api/v1/agent/backups", "Backup", metadata, attempts=attempts, sleep=sleep
        )

    def upload_evidence(
        self,
        path: str | Path,
        metadata: dict[str, Any] | None = None,
        *,
        attempts: int = 5,
        sleep: Callable[[float], None] = time.sleep,
    ) -> dict[str, Any]:
        """Upload an evidence bundle (`trueup evidence`'s tar.gz), as `upload_backup` does."""
        return self._upload_file(
            path, "/api/v1/agent/evidence", "Evidence", metadata, attempts=attempts, sleep=sleep
        )

    def evidence_request(self) -> dict[str, Any] | None:
        """The operators' pending request for a fresh evidence bundle, if any."""
        pending = self._request("GET", "/api/v1/agent/evidence-request").json().get("pending")
        return dict(pending) if isinstance(pending, dict) else None

    def _upload_file(
        self,
        path: str | Path,
        route: str,
        kind: str,
        metadata: dict[str, Any] | None,
        *,
        attempts: int,
        sleep: Callable[[float], None],
    ) -> dict[str, Any]:
        archive = Path(path)
        try:
            digest, size = _file_sha256(archive)
        except OSError as exc:
            raise ControlPlaneRefused(0, f"cannot read {archive}: {exc.strerror}") from None
        headers = {
            "Content-Type": "application/octet-stream",
            "Content-Length": str(size),
            f"X-Trueup-{kind}-Sha256": digest,
        }
        if metadata:
            headers[f"X-Trueup-{kind}-Metadata"] = json.dumps(metadata, separators=(",", ":"))
        backoff = _Backoff(1.0, 30.0)
        for attempt in range(1, attempts + 1):
            try:
                with archive.open("rb") as body:
                    response = self._request(
                        "POST",
                        route,
                        content=_chunks(body),
                        headers=headers,
                        timeout=max(self.timeout, 60.0),
                    )
                return dict(response.json())
            except ControlPlaneUnavailable as exc:
                if attempt == attempts:
                    raise
                delay = backoff.next_delay()
                log.warning("%s upload: %s; retrying in %.1f s", kind.lower(), exc, delay)
                sleep(delay)
        raise AssertionError("unreachable")


_UPLOAD_CHUNK = 1024 * 1024


def _file_sha256(path: Path) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    with path.open("rb") as f:
        while chunk := f.read(_UPLOAD_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def _chunks(body: BinaryIO) -> Iterator[bytes]:
    while chunk := body.read(_UPLOAD_CHUNK):
        yield chunk


def _digest(value: Any) -> str:
    return json_digest(value)


def _subsystem_report(sub: dict[str, Any]) -> dict[str, Any]:
    """A subsystem in the report: health and reason, and (when the agent has them) the
    circuit breaker and the local acknowledgement's expiry (the dashboard shows them)."""
    out: dict[str, Any] = {
        "health": sub.get("health", "pending"),
        "reason": sub.get("reason") or None,
    }
    for key in ("breaker", "acknowledged_until"):
        if isinstance(sub.get(key), str):
            out[key] = sub[key]
    return out


def _restore_summary(record: Any) -> dict[str, Any] | None:
    """A restore in the report: `pending` while it runs, `failed` when it rolled back or is
    stuck on a problem, `completed`; the control plane's notifications read `state`;
    the dashboard reads `pending` (the record's own fields are kept beside it)."""
    if not isinstance(record, dict) or not record.get("state"):
        return None
    phase = str(record["state"])
    if phase == "rolled_back" or (record.get("pending") and record.get("problem")):
        state = "failed"
    elif record.get("pending"):
        state = "pending"
    else:
        state = "completed"
    summary = {k: record.get(k) for k in ("id", "since", "mode", "pending", "next")}
    return {**summary, "state": state, "phase": phase}


def _agent_identity(status: dict[str, Any]) -> dict[str, Any]:
    """The agent's version and what documents it understands (the report's identity fields)."""
    agent = status.get("agent")
    version = agent.get("version") if isinstance(agent, dict) else None
    return {
        "agent_version": version if isinstance(version, str) and version else __version__,
        "supported_api_versions": list(SUPPORTED_API_VERSIONS),
        "supported_sections": supported_sections(),
    }


REPORTED_DRIFT = 20  # drift records a report carries (ongoing first, then the newest ended)
REPORTED_PATHS = 50  # paths per drift record
REPORTED_ATTRIBUTION = 5  # notifications per drift record (the newest)


def _writer(event: dict[str, Any]) -> str | None:
    """Who an attribution entry names as the writer, in words (None: nobody known)."""
    sender = event.get("sender")
    if not sender or sender == "kernel" or str(sender).startswith("trueup"):
        return None  # the kernel's own, or this agent's write (the heal itself)
    return f"{event.get('message') or 'a change'} from {sender}"


def _drift_record(name: str, record: dict[str, Any]) -> dict[str, Any]:
    attribution = [a for a in record.get("attribution") or [] if isinstance(a, dict)]
    changed_by = sorted({w for w in map(_writer, attribution) if w})
    paths = [str(p) for p in record.get("paths") or []]
    return {
        "subsystem": name,
        "paths": paths[:REPORTED_PATHS],
        "paths_total": len(paths),
        "since": record.get("since"),
        "healed_at": record.get("ended_at"),
        "detected_by": record.get("detected_by"),
        "changed_by": changed_by[:REPORTED_ATTRIBUTION],
        "attribution": attribution[-REPORTED_ATTRIBUTION:],
        "healed_by": record.get("healed_by"),
    }


# What the report model (`trueup.model.report.AckReport`) takes of each text: an
# acknowledgement's reason and actor are whatever `trueup ack` (or an API client) gave,
# unbounded; one longer than the model takes would fail every report until it is gone.
_ACK_TEXT = {"by": 200, "reason": 10_000, "until": 64, "at": 64, "ended_at": 64}


def _bounded_ack(ack: dict[str, Any]) -> dict[str, Any]:
    for key, limit in _ACK_TEXT.items():
        value = ack.get(key)
        if value is not None and not isinstance(value, str):
            value = str(value)
        if isinstance(value, str) and len(value) > limit:
            value = value[: limit - 1] + "…"
        ack[key] = value
    return ack


def drift_and_acks(status: dict[str, Any]) -> dict[str, Any]:
    """The report's drift history and the router's own acknowledgements.

    `drift_history`: drift going on now (`healed_at` None) and recently ended
    drift, newest first, each with its paths, who changed it (`changed_by`, from
    the notifications that explain it: `attribution`) and who put it back
    (`healed_by`: trueup's heal and its transaction; None when something else
    did). `acknowledgements`: `trueup ack` holds on healing, active and
    recently ended (`state`: active, expired or withdrawn). Bounded in size.
    """
    history = [
        _drift_record(str(r.get("subsystem")), r)
        for r in status.get("drift_history") or []
        if isinstance(r, dict)
    ]
    if not history:
        # An older status without the history: what each subsystem shows.
        for name, sub in (status.get("subsystems") or {}).items():
            for key in ("drift", "last_drift"):
                if isinstance(sub.get(key), dict):
                    history.append(_drift_record(name, {"ended_at": None, **sub[key]}))
    acknowledgements: list[dict[str, Any]] = []
    for name, sub in sorted((status.get("subsystems") or {}).items()):
        ack = sub.get("acknowledgement")
        if isinstance(ack, dict):
            acknowledgements.append(
                _bounded_ack(
                    {
                        "subsystem": name,
                        "until": ack.get("until_at"),
                        "by": ack.get("actor"),
                        "reason": ack.get("reason"),
                        "at": ack.get("at"),
                        "state": "active",
                    }
                )
            )
    for ended in status.get("acknowledgements_ended") or []:
        if isinstance(ended, dict):
            acknowledgements.append(
                _bounded_ack(
                    {
                        **{k: ended.get(k) for k in ("subsystem", "until", "by", "reason", "at")},
                        "state": ended.get("ended") or "expired",
                        "ended_at": ended.get("ended_at"),
                    }
                )
            )
    return {
        "drift_history": history[:REPORTED_DRIFT],
        "acknowledgements": acknowledgements[:REPORTED_DRIFT],
    }


def _confirmation(record: Any) -> dict[str, Any] | None:
    """The last guarded apply in the report: {version, state, deadline (epoch), reason, …}."""
    if not isinstance(record, dict) or record.get("state") not in (
        "pending",
        "confirmed",
        "rolled-back",
    ):
        return None
    out = {
        k: record.get(k)
        for k in ("version", "state", "deadline", "reason", "rollback_to", "origin", "at")
    }
    rolled_to = record.get("rolled_back_to_version")
    if rolled_to is not None:
        out["rolled_back_to_version"] = rolled_to
    if isinstance(out["reason"], str):
        out["reason"] = out["reason"][:1000]
    return out


def report_from_status(status: dict[str, Any]) -> dict[str, Any]:
    """Turn the agent's `/v1/status` document into a control-plane report.

    The applied revision's identity goes along: `applied_digest` (document_digest
    of the applied document), `applied_origin` and `override` (a local apply
    overriding the control plane's revision). Status documents of older agents
    lack them; they are then None, and the control plane compares numbers only.

    Every report also says what this agent is: `agent_version` (status' `agent.version`,
    else this package's), `supported_api_versions` and `supported_sections` (so the
    control plane can tell when a desired revision uses something the agent lacks).
    """
    subsystems = status.get("subsystems", {})
    differences = {
        name: sub.get("differences", [])
        for name, sub in subsystems.items()
        if sub.get("differences")
    }
    versions = status.get("versions", {})
    findings = status.get("reason_codes", [])
    journal = status.get("journal", {})
    digest = versions.get("applied_digest")
    origin = versions.get("origin")
    override = versions.get("override")
    report = {
        "applied_version": versions.get("applied") or None,
        "applied_digest": digest if isinstance(digest, str) and digest else None,
        "applied_origin": origin if isinstance(origin, str) and origin else None,
        "override": dict(override) if isinstance(override, dict) else None,
        "observed_digest": _digest(
            {"applied": versions.get("applied"), "differences": differences}
        ),
        "diff_summary": {
            "paths": sorted(str(d.get("path")) for diffs in differences.values() for d in diffs),
            "subsystems": {name: len(diffs) for name, diffs in differences.items()},
            # Known limitations and the differences they cover (accepted, not drift).
            "accepted": sorted(
                str(d.get("path")) for sub in subsystems.values() for d in sub.get("accepted", [])
            ),
            "limitations": [
                {
                    k: item.get(k)
                    for k in ("id", "subsystem", "path", "reason", "reviewed_by", "ticket")
                }
                for item in status.get("limitations", [])
                if isinstance(item, dict)
            ],
        },
        "subsystems": {name: _subsystem_report(sub) for name, sub in subsystems.items()},
        "reason_codes": sorted({f["code"] for f in findings if isinstance(f, dict)}),
        "findings": [f for f in findings if isinstance(f, dict)],
        "journal": {
            "open": journal.get("open"),
            "last": journal.get("last"),
        },
        "management_ready": status.get("management", {}).get("ready"),
        **_agent_identity(status),
    }
    confirmation = _confirmation(status.get("confirmation"))
    if confirmation is not None:
        report["confirmation"] = confirmation
    restore = _restore_summary(status.get("restore"))
    if restore is not None:
        report["restore"] = restore
    report.update(drift_and_acks(status))
    # The same model the control plane validates with: a report it would refuse
    # fails here, in the agent's log, not as a 422 the agent cannot explain.
    return AgentReport.model_validate(report).model_dump(mode="json")


class ApplyRevision(Protocol):
    """How `SyncLoop` hands over a revision; `confirm_within` only when it has a window."""

    def __call__(
        self, document: dict[str, Any], version: int, /, *, confirm_within: float | None = ...
    ) -> None: ...


class RetryLater(RuntimeError):
    """A revision that could not be applied now, for a reason that passes (a busy writer)."""


class _Backoff:
    def __init__(self, initial: float, maximum: float) -> None:
        self.initial = initial
        self.maximum = maximum
        self.attempt = 0

    def next_delay(self) -> float:
        ceiling = min(self.maximum, self.initial * (2**self.attempt))
        self.attempt += 1
        return random.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self.attempt = 0


class ReportPacer:
    """When the next report is due: coalesced changes, the heartbeat, a 429's back-off.

    A change asked for (`request`) is reported at once when the last report is
    at least `min_interval` old, else when it becomes so: at most one report
    per `min_interval`, and every change asked for meanwhile goes with that
    one (a report carries the state as it is when it is built, never an event
    of its own). Without a change the heartbeat is due `heartbeat` seconds
    after the last report. A refusal with 429 holds every report until its
    Retry-After has passed (at least `min_interval`); the change stays asked
    for, so the report after the back-off carries the latest state. Pure
    bookkeeping on a clock the caller gives: the unit tests drive it by hand.
    """

    def __init__(self, *, heartbeat: float, min_interval: float = 1.0) -> None:
        self.heartbeat = heartbeat
        self.min_interval = min_interval
        self.last_sent: float | None = None
        self.requested = True  # the first report goes out at once
        self.hold_until: float | None = None

    def request(self) -> None:
        self.requested = True

    def due_at(self) -> float:
        """The clock time at which the next report is due (0 when it is due now)."""
        if self.last_sent is None:
            earliest = 0.0
        else:
            wanted = self.min_interval if self.requested else self.heartbeat
            earliest = self.last_sent + wanted
        if self.hold_until is not None:
            earliest = max(earliest, self.hold_until)
        return earliest

    def sent(self, now: float) -> None:
        self.last_sent = now
        self.hold_until = None

    def taken(self) -> None:
        """The report about to be built carries every change asked for so far."""
        self.requested = False

    def throttled(self, now: float, retry_after: float | None) -> None:
        """A 429: nothing goes out before Retry-After; the state is reported after it."""
        self.requested = True
        self.hold_until = now + max(self.min_interval, retry_after or self.min_interval)


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
        snapshot: Callable[[], dict[str, Any]],
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

    def status(self) -> dict[str, Any]:
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

    def _failed(self, where: str, exc: Exception, backoff: _Backoff) -> None:
        self.connected = False
        self.last_error = f"{where}: {exc}"
        delay = backoff.next_delay()
        log.warning("control plane %s failed (%s); retrying in %.1fs", where, exc, delay)
        self._stop.wait(delay)

    def _pull(self) -> None:
        backoff = _Backoff(self.backoff_initial, self.backoff_max)
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

    def answer_evidence_request(self) -> dict[str, Any] | None:
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
        backoff = _Backoff(self.backoff_initial, self.backoff_max)
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

    def send_report(self, backoff: _Backoff | None = None) -> bool:
        """Build and send one report now; True when the control plane took it."""
        backoff = backoff or _Backoff(self.backoff_initial, self.backoff_max)
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
