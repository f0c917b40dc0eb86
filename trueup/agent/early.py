"""The early listener: the agent's sockets bound and answering before the agent is imported.

Who calls this: `trueup.agent.fastboot` binds the listeners and starts the
responder; `trueup.agent.process.Agent` binds its listeners with the same
functions (`bind_unix`, `bind_tcp`) and takes the early ones over by their
`listener_key`. The responder answers `GET /v1/health/management` from a
netlink dump (`early_health`, the same fields as the agent's, with `"phase":
"early"`) and everything else with 503 `agent starting; retry` and
`Retry-After: 1`, until each listener is released to the agent.

Standard library only (besides `trueup.journal.management` and
`trueup.system.rawnl`, both stdlib-only): it runs before anything heavy is
imported.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import json
import os
import select
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from trueup.agent.bodies import EarlyAnswer, ListenerRecord, ManagementHealth
from trueup.journal.management import BootFacts, api_bind_address
from trueup.system.rawnl import IFF_UP, RawNetlink
from trueup.system.sockets import unix_address

__all__ = [
    "EarlyResponder",
    "bind_listeners",
    "bind_tcp",
    "bind_unix",
    "early_health",
    "listener_key",
    "same_address",
    "warn",
]

_MAX_HEAD = 16 * 1024
_MAX_BODY = 1 << 20


def warn(message: str) -> None:
    """To stderr, where the agent's log goes: `logging` (with `traceback` and
    `tokenize` behind it) costs the fast path more than everything it does."""
    print(f"trueup: fast path: {message}", file=sys.stderr, flush=True)


def same_address(a: str, b: str) -> bool:
    try:
        return ipaddress.ip_interface(a) == ipaddress.ip_interface(b)
    except ValueError:
        return a == b


def early_health(facts: BootFacts, listeners: dict[str, ListenerRecord]) -> ManagementHealth:
    """`/v1/health/management` before the agent runs: the same fields, from a netlink dump."""
    ifname = facts["interface"]
    wanted = list(facts["addresses"])
    present: list[str] = []
    missing = wanted
    link = "absent"
    try:
        index = socket.if_nametoindex(ifname)
    except OSError:
        index = 0
    if index:
        try:
            with RawNetlink() as netlink:
                flags = netlink.link_flags(index)
                have = netlink.addresses(index)
            link = "up" if flags is not None and flags & IFF_UP else "down"
            present = [a for a in wanted if any(same_address(a, h) for h in have)]
            missing = [a for a in wanted if a not in present]
        except OSError as exc:  # reported, never raised to the probe
            link = "unknown"
            missing = [f"(observe failed: {exc})"]
    ready = link == "up" and not missing
    reason = None
    if link != "up":
        reason = f"management interface {ifname} is {link}"
    elif missing:
        reason = "missing " + ", ".join(missing)
    return {
        "ready": ready,
        "reason": reason,
        "phase": "early",
        "interface": ifname,
        "link": link,
        "addresses": present,
        "missing": missing,
        "listeners": listeners,
        "version": facts.get("version"),
        "error": None,
    }


# -- listeners ----------------------------------------------------------------------
def listener_key(address: str, port: int) -> str:
    """How a bound TCP listener is named in the handover (`Agent._tcp_socket` looks it up)."""
    return f"tcp {address} {port}"


def bind_unix(path: Path) -> socket.socket:
    """The agent's unix socket at `path`, mode 0600 from the start (a stale one is replaced)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        # A state directory too long for sun_path (107 bytes) is bound through its descriptor.
        with unix_address(path) as address:
            sock.bind(address)
        sock.listen(64)
    except OSError:
        sock.close()
        raise
    finally:
        os.umask(old)
    sock.setblocking(False)
    return sock


def bind_tcp(address: str, port: int) -> socket.socket:
    """A listening TCP socket; "::" is dual-stack. Raises OSError."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # A named address and the wildcard fallback share the port while the
        # named bind takes over.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0 if address == "::" else 1)
        sock.bind((address, port))
        sock.listen(128)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def bind_listeners(
    root: Path, facts: BootFacts, listen_port: int | None
) -> tuple[dict[str, socket.socket], dict[str, ListenerRecord]]:
    """The sockets by handover key, and `listeners` as `Agent` reports them."""
    sockets: dict[str, socket.socket] = {}
    listeners: dict[str, ListenerRecord] = {}
    path = root / "agent.sock"
    try:
        sockets["unix"] = bind_unix(path)
        listeners["unix"] = {"path": str(path), "state": "serving"}
    except OSError as exc:  # a read-only state directory: the full path decides
        warn(f"cannot bind {path}: {exc}")
    port = listen_port or int(facts["api"]["port"])
    named = api_bind_address(facts)
    candidates = [("bind", named), ("tcp", "::")] if named else [("tcp", "::")]
    for name, address in candidates:
        try:
            sockets[listener_key(address, port)] = bind_tcp(address, port)
        except OSError as exc:
            warn(f"cannot bind {address} port {port}: {exc}")
            continue
        listeners[name] = {"address": address, "port": port, "state": "serving"}
        break
    return sockets, listeners


# -- the responder ------------------------------------------------------------------
_REASONS = {200: "OK", 400: "Bad Request", 503: "Service Unavailable"}


def _response(status: int, body: EarlyAnswer, *, head_only: bool = False) -> bytes:
    payload = json.dumps(body).encode()
    lines = [
        f"HTTP/1.1 {status} {_REASONS[status]}",
        "content-type: application/json",
        f"content-length: {len(payload)}",
        "connection: close",
    ]
    if status == 503 and "ready" not in body:
        lines.append("retry-after: 1")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (b"" if head_only else payload)


def _read_request(conn: socket.socket) -> tuple[str, str] | None:
    """(method, path) of one HTTP/1.1 request, its body read and dropped; None if malformed."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk or len(data) > _MAX_HEAD:
            return None
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split()
    if len(parts) != 3:
        return None
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            with contextlib.suppress(ValueError):
                length = int(value.strip())
    # Read the body, so closing does not reset the connection before the
    # client has read the answer.
    remaining = min(length, _MAX_BODY) - len(rest)
    while remaining > 0:
        chunk = conn.recv(min(remaining, 65536))
        if not chunk:
            break
        remaining -= len(chunk)
    return parts[0].upper(), parts[1].split("?", 1)[0]


class EarlyResponder:
    """Answers on the early listeners until each is released to the full API.

    It runs in a child process forked before the heavy imports begin (with
    a thread as the fallback when fork fails): the imports hold the
    interpreter lock for most of a second, and on a loaded router a thread
    waiting for it answers a health probe hundreds of milliseconds late. The
    child shares the listening sockets (the same open sockets, not copies)
    and nothing else: it closes every other descriptor it inherited (the
    agent lock among them). It polls the listeners and a control pipe, and
    answers each connection on a short-lived thread, with `connection:
    close`, so no connection outlives the handover.

    `release(sock)` writes the socket's descriptor number on the control
    pipe; the child stops polling that listener and acknowledges, and from
    then on the backlog is the agent's. When every listener is released, or
    the agent is gone (end of file on the pipe), the child finishes the
    connections it holds and exits.
    """

    def __init__(
        self,
        answer: Callable[[str, str], tuple[int, EarlyAnswer]],
        sockets: list[socket.socket],
    ) -> None:
        self._answer = answer
        self._sockets = {sock.fileno(): sock for sock in sockets}
        self._serving = set(self._sockets)
        self._lock = threading.Lock()
        self._control_w: int | None = None
        self._reply_r: int | None = None
        self.pid: int | None = None  # the child's, when it runs in one

    def start(self, *, fork: bool = True) -> None:
        control_r, control_w = os.pipe()
        reply_r, reply_w = os.pipe()
        for sock in self._sockets.values():
            sock.setblocking(False)
        pid = None
        if fork:
            try:
                pid = os.fork()
            except OSError as exc:
                warn(f"cannot fork the early responder ({exc}); it runs on a thread")
        if pid == 0:  # the child
            status = 0
            try:
                os.close(control_w)
                os.close(reply_r)
                _close_all_but({0, 1, 2, control_r, reply_w, *self._sockets})
                self._run(control_r, reply_w)
            except BaseException:  # never back into the agent's code from here
                status = 1
            os._exit(status)
        if pid is None:
            thread = threading.Thread(
                target=self._run, args=(control_r, reply_w), name="trueup-early", daemon=True
            )
            thread.start()
        else:
            self.pid = pid
            os.close(control_r)
            os.close(reply_w)
            threading.Thread(
                target=_reap, args=(pid,), name="trueup-early-reaper", daemon=True
            ).start()
        self._control_w, self._reply_r = control_w, reply_r

    def release(self, sock: socket.socket) -> None:
        """Stop accepting on `sock`; returns once no accept on it can happen any more."""
        with self._lock:
            fd = sock.fileno()
            if self._control_w is None or self._reply_r is None or fd not in self._serving:
                return
            self._serving.discard(fd)
            try:
                os.write(self._control_w, b"%d\n" % fd)
                _read_line(self._reply_r, timeout=5.0)
            except OSError:
                pass  # the responder is gone: nothing accepts on it any more
            if not self._serving:  # the child finishes its connections and exits
                os.close(self._control_w)
                os.close(self._reply_r)
                self._control_w = self._reply_r = None

    def _run(self, control_r: int, reply_w: int) -> None:
        poller = select.poll()
        poller.register(control_r, select.POLLIN)
        serving = dict(self._sockets)
        for fd in serving:
            poller.register(fd, select.POLLIN)
        handlers: list[threading.Thread] = []
        pending = b""
        try:
            while serving:
                for fd, _events in poller.poll():
                    if fd == control_r:
                        data = os.read(control_r, 4096)
                        if not data:  # the agent is gone
                            serving.clear()
                            break
                        pending += data
                        while b"\n" in pending:
                            line, pending = pending.split(b"\n", 1)
                            if serving.pop(int(line), None) is not None:
                                poller.unregister(int(line))
                            os.write(reply_w, line + b"\n")
                    elif fd in serving:
                        handlers += self._accept(serving[fd])
                handlers = [h for h in handlers if h.is_alive()]
        finally:
            for handler in handlers:
                handler.join(2.5)
            os.close(control_r)
            os.close(reply_w)

    def _accept(self, sock: socket.socket) -> list[threading.Thread]:
        started: list[threading.Thread] = []
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:  # nothing more waiting (BlockingIOError), or the socket is gone
                return started
            handler = threading.Thread(target=self._handle, args=(conn,), daemon=True)
            handler.start()
            started.append(handler)

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.settimeout(2.0)
                request = _read_request(conn)
                if request is None:
                    conn.sendall(_response(400, {"message": "malformed request"}))
                    return
                method, path = request
                status, body = self._answer(method, path)
                conn.sendall(_response(status, body, head_only=method == "HEAD"))
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_WR)
            except OSError:
                pass  # the client went away: nothing to tell it


def _close_all_but(keep: set[int]) -> None:
    """Close every descriptor of this process but `keep` (the forked responder's)."""
    low = 0
    for fd in sorted(keep):
        if fd > low:
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX"))


def _read_line(fd: int, *, timeout: float) -> bytes:
    """One acknowledgement line from the responder; raises OSError on timeout or end of file."""
    data = b""
    deadline = time.monotonic() + timeout
    while not data.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            raise OSError(errno.ETIMEDOUT, "the early responder did not acknowledge")
        chunk = os.read(fd, 64)
        if not chunk:
            raise OSError(errno.EPIPE, "the early responder is gone")
        data += chunk
    return data


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
