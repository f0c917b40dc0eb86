"""The CLI's client for a running agent's local API (the unix socket in the state directory).

Standard library only (HTTP/1.1 over AF_UNIX, one connection per request): the
CLI's fast path (`trueup.cli.fast`) answers `status`, `drift`, `plan`,
`confirm` and `ack` through this module without importing anything heavy, and
the full typer CLI uses the same client, so both talk to the agent the same way.
"""

from __future__ import annotations

import _socket  # socket.py's enums and selectors cost more than this client needs
import json as jsonlib
import os
import time

TYPE_CHECKING = False  # typing's import time is measurable on the fast path
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any, TypeAlias

    QueryParams: TypeAlias = Mapping[str, str | int | float | bool | None]

__all__ = ["AgentClient", "AgentUnavailable", "Response"]

HEALTH_TIMEOUT = 2.0  # "does an agent answer on this socket?"
REQUEST_TIMEOUT = 120.0  # per connect, send and receive, as before (an apply can take a while)
# While the agent starts, its early responder answers everything but the health
# probe with 503 `agent starting; retry` and Retry-After, without looking at the
# request: sending it again is safe whatever it was. The full agent takes over
# within a second or two; a CLI run at boot waits that long rather than failing.
STARTING_MESSAGE = "agent starting; retry"
STARTING_WAIT = 30.0

# Sockets whose agent did not answer the health check in this process: when the
# fast path falls back to the full CLI, it does not wait for a hung agent twice.
_UNANSWERED: set[str] = set()


class AgentUnavailable(RuntimeError):
    """The agent stopped answering in the middle of a request (it died, or hangs)."""

    def __init__(self, socket_path: str, reason: str) -> None:
        super().__init__(f"agent at {socket_path} did not answer: {reason}")
        self.socket_path = socket_path
        self.reason = reason

    def next_step(self) -> str:
        """One line for the operator: what happened and what to run next."""
        state_dir = os.path.dirname(self.socket_path) or "."
        return (
            f"trueup: the agent stopped answering ({self.reason}) — is it running? "
            f"check: trueup status --state-dir {state_dir} (works without an agent; "
            "`trueup --debug …` prints the traceback)"
        )


class _TransportError(Exception):
    pass


class Response:
    """An HTTP response read in full: what `httpx.Response` offered the CLI."""

    def __init__(self, status_code: int, headers: dict[str, str], content: bytes) -> None:
        self.status_code = status_code
        self.headers = headers
        self.content = content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        """The decoded body; ValueError when it is not JSON."""
        return jsonlib.loads(self.content)


_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


def _quote(text: str) -> str:
    return "".join(chr(b) if b in _UNRESERVED else f"%{b:02X}" for b in text.encode("utf-8"))


def _primitive(value: Any) -> str:
    if value is True:
        return "true"
    if value is False:
        return "false"
    return "" if value is None else str(value)


def _recv_until(sock: _socket.socket, buffer: bytearray, marker: bytes) -> int:
    while (index := buffer.find(marker)) < 0:
        chunk = sock.recv(65536)
        if not chunk:
            raise _TransportError("connection closed before the response was complete")
        buffer += chunk
    return index


def _recv_exactly(sock: _socket.socket, buffer: bytearray, size: int) -> None:
    while len(buffer) < size:
        chunk = sock.recv(max(65536, size - len(buffer)))
        if not chunk:
            raise _TransportError("connection closed before the response was complete")
        buffer += chunk


def _read_response(sock: _socket.socket) -> Response:
    buffer = bytearray()
    end = _recv_until(sock, buffer, b"\r\n\r\n")
    head = bytes(buffer[:end]).decode("latin-1").split("\r\n")
    del buffer[: end + 4]
    parts = head[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise _TransportError(f"not an HTTP response: {head[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in head[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = bytearray()
        while True:
            end = _recv_until(sock, buffer, b"\r\n")
            size = int(bytes(buffer[:end]).split(b";")[0], 16)
            del buffer[: end + 2]
            if size == 0:
                break
            _recv_exactly(sock, buffer, size + 2)
            body += buffer[:size]
            del buffer[: size + 2]
        content = bytes(body)
    elif "content-length" in headers:
        size = int(headers["content-length"])
        _recv_exactly(sock, buffer, size)
        content = bytes(buffer[:size])
    else:
        while chunk := sock.recv(65536):
            buffer += chunk
        content = bytes(buffer)
    return Response(int(parts[1]), headers, content)


def exchange(
    socket_path: str,
    method: str,
    target: str,
    *,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = REQUEST_TIMEOUT,
) -> Response:
    """One request on a new connection; `_TransportError` when the agent does not answer."""
    lines = [f"{method} {target} HTTP/1.1", "Host: trueup-agent", "Accept: */*"]
    lines += ["Connection: close", "User-Agent: trueup-cli"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if body is not None or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body or b'')}")
    request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")
    try:
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            address, directory = _unix_address(socket_path)
            try:
                sock.connect(address)
            finally:
                if directory is not None:
                    os.close(directory)
            sock.sendall(request)
            return _read_response(sock)
        finally:
            sock.close()
    except TimeoutError:
        raise _TransportError("timed out") from None
    except OSError as exc:
        raise _TransportError(exc.strerror or str(exc)) from None
    except ValueError as exc:
        raise _TransportError(f"malformed response: {exc}") from None


def _unix_address(path: str) -> tuple[str, int | None]:
    """`path`, or when it is too long for sun_path (107 bytes) the same socket through its
    directory's descriptor (`/proc/self/fd/N/agent.sock`; close N after connecting)."""
    if len(os.fsencode(path)) <= 107:
        return path, None
    directory = os.open(os.path.dirname(path) or ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    return f"/proc/self/fd/{directory}/{os.path.basename(path)}", directory


def _socket_path(state_dir: str | os.PathLike[str]) -> str:
    return os.path.normpath(os.path.join(os.fspath(state_dir), "agent.sock"))


class AgentClient:
    def __init__(
        self, socket_path: str | os.PathLike[str], timeout: float = REQUEST_TIMEOUT
    ) -> None:
        self.socket_path = os.fspath(socket_path)
        self.timeout = timeout

    @classmethod
    def connect(cls, state_dir: str | os.PathLike[str]) -> AgentClient | None:
        """A client when an agent answers on the state directory's socket, else None."""
        path = _socket_path(state_dir)
        if path in _UNANSWERED or not os.path.exists(path):
            return None
        try:
            exchange(path, "GET", "/v1/health/management", timeout=HEALTH_TIMEOUT)
        except _TransportError:
            _UNANSWERED.add(path)
            return None
        return cls(path)

    @classmethod
    def at(
        cls, state_dir: str | os.PathLike[str], timeout: float = REQUEST_TIMEOUT
    ) -> AgentClient | None:
        """A client for the state directory's socket without asking first; None: no socket.

        For requests that are safe to repeat: the fast path sends a read with the
        health check's timeout and hands over to the full CLI when it is not
        answered, saving a round trip when it is.
        """
        path = _socket_path(state_dir)
        if path in _UNANSWERED or not os.path.exists(path):
            return None
        return cls(path, timeout)

    def close(self) -> None:
        """Nothing to release: every request has its own connection."""

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        headers: dict[str, str] | None = None,
        params: QueryParams | None = None,
    ) -> Response:
        target = path
        if params:
            target += "?" + "&".join(
                f"{_quote(k)}={_quote(_primitive(v))}" for k, v in params.items()
            )
        all_headers = dict(headers or {})
        body = None
        if json is not None:
            body = jsonlib.dumps(
                json, ensure_ascii=False, separators=(",", ":"), allow_nan=False
            ).encode("utf-8")
            all_headers["Content-Type"] = "application/json"
        waited = 0.0
        while True:
            try:
                response = exchange(
                    self.socket_path,
                    method,
                    target,
                    body=body,
                    headers=all_headers,
                    timeout=self.timeout,
                )
            except _TransportError as exc:
                raise AgentUnavailable(self.socket_path, str(exc)) from None
            delay = _starting_delay(response)
            if delay is None or waited + delay > STARTING_WAIT:
                return response
            time.sleep(delay)
            waited += delay


def _starting_delay(response: Response) -> float | None:
    """Seconds to wait before asking again when the early responder answered; else None."""
    if response.status_code != 503 or "retry-after" not in response.headers:
        return None
    try:
        if response.json().get("message") != STARTING_MESSAGE:
            return None
        return min(max(float(response.headers["retry-after"]), 0.05), 5.0)
    except (ValueError, AttributeError):
        return None
