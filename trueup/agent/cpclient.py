"""The agent's control-plane client: enrollment, long-poll pull of desired state, reports.

Who calls this: the agent process, when started with `--control-plane URL
--token-file F`, through `trueup.agent.cpsync.SyncLoop` (which hands each new
revision to the agent's transaction path and sends the reports
`trueup.agent.cpreport.report_from_status` builds), and the CLI's commands
that talk to a control plane (backup and evidence upload, enrollment). It
never touches local state itself.

A revision may carry a confirmation window (`confirm_within`, seconds): the
agent then applies it with `--confirm-within` semantics and confirms it itself
once its health holds (`trueup.agent.selfconfirm`); a control plane that
sends none (an older one) means no window.

`upload_backup(path, metadata)` sends a backup archive of this device (streamed,
retried while the control plane is unavailable).

Errors::

    ControlPlaneError
    ├── ControlPlaneUnavailable   network error, timeout or 5xx: retry later
    └── ControlPlaneRefused       4xx: the credential is revoked, the request bad, …

Why this module is over 400 lines: one client holds every request to the control plane
(TLS pinning, enrollment, long-poll, reports, backup and evidence upload) with the error
vocabulary and the back-off they share.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urlsplit

import httpx

from trueup.agent.cpreport import report_from_status
from trueup.model.digests import sha256_digest
from trueup.model.jsontypes import JSONObject
from trueup.system.atomicfile import write_atomic

__all__ = [
    "Backoff",
    "ControlPlaneClient",
    "ControlPlaneError",
    "ControlPlaneRefused",
    "ControlPlaneUnavailable",
    "DesiredRevision",
    "RetryLater",
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
    document: JSONObject
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

    def wait_for_desired(self, after: int, wait: float) -> tuple[int, JSONObject] | None:
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

    def report(self, payload: JSONObject) -> None:
        self._request("POST", "/api/v1/agent/report", json=payload)

    def secrets(self) -> JSONObject:
        """This device's secrets: `{"secrets": {name: value}, "refused": [...]}`."""
        return dict(self._request("GET", "/api/v1/agent/secrets").json())

    def upload_backup(
        self,
        path: str | Path,
        metadata: JSONObject | None = None,
        *,
        attempts: int = 5,
        sleep: Callable[[float], None] = time.sleep,
    ) -> JSONObject:
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
        metadata: JSONObject | None = None,
        *,
        attempts: int = 5,
        sleep: Callable[[float], None] = time.sleep,
    ) -> JSONObject:
        """Upload an evidence bundle (`trueup evidence`'s tar.gz), as `upload_backup` does."""
        return self._upload_file(
            path, "/api/v1/agent/evidence", "Evidence", metadata, attempts=attempts, sleep=sleep
        )

    def evidence_request(self) -> JSONObject | None:
        """The operators' pending request for a fresh evidence bundle, if any."""
        pending = self._request("GET", "/api/v1/agent/evidence-request").json().get("pending")
        return dict(pending) if isinstance(pending, dict) else None

    def _upload_file(
        self,
        path: str | Path,
        route: str,
        kind: str,
        metadata: JSONObject | None,
        *,
        attempts: int,
        sleep: Callable[[float], None],
    ) -> JSONObject:
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
        backoff = Backoff(1.0, 30.0)
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


class RetryLater(RuntimeError):
    """A revision that could not be applied now, for a reason that passes (a busy writer)."""


class Backoff:
    """Exponential back-off with full jitter (between half the ceiling and the ceiling)."""

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
