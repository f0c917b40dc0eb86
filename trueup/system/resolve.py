"""Name resolution with a deadline: `getaddrinfo` on a daemon thread.

Who uses this: the WireGuard subsystem, for peer endpoints given by name
(`peer.example.test:51820`), inside its preparation and its periodic
re-resolution.

Why `getaddrinfo` rather than a DNS query of our own: it answers exactly as
the rest of the router does — `/etc/hosts`, nsswitch, the search domains and
the namespace's own `resolv.conf` (`ip netns exec` binds
`/etc/netns/NAME/resolv.conf` over it) — so an operator's `getent hosts
NAME` predicts what trueup resolves. Its one drawback, that it cannot be
interrupted, is met by running it on a daemon thread that the caller stops
waiting for at its timeout; a lookup still hanging is shared by the next
call for the same name rather than started again, so a resolver that never
answers costs one thread per name, not one per attempt.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

__all__ = ["ResolveError", "format_endpoint", "resolve_endpoint", "split_endpoint"]


class ResolveError(RuntimeError):
    """A name that did not resolve in time, or at all; names it and the cause."""


_inflight: dict[tuple[str, int], Future[list[str]]] = {}
_lock = threading.Lock()


def split_endpoint(text: str) -> tuple[str, int]:
    """`host:port` or `[v6]:port` → (host, port); ValueError when it is neither."""
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
        if not sep:
            raise ValueError(f"{text!r} is not [IPv6]:PORT")
    else:
        host, sep, port = text.rpartition(":")
        if not sep or not host or ":" in host:
            raise ValueError(f"{text!r} is not HOST:PORT or [IPv6]:PORT")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r}: the port must be 1-65535")
    return host, int(port)


def format_endpoint(address: str, port: int) -> str:
    ip = ipaddress.ip_address(address)
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def _lookup(host: str, port: int) -> list[str]:
    answers = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    out: list[str] = []
    for family, _type, _proto, _name, sockaddr in answers:
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        text = format_endpoint(str(sockaddr[0]).split("%", 1)[0], port)
        if text not in out:
            out.append(text)
    return out


def resolve_endpoint(host: str, port: int, timeout: float) -> list[str]:
    """`host`'s addresses as endpoints (`192.0.2.1:51820`, `[2001:db8::1]:51820`), in
    getaddrinfo's order of preference; ResolveError after `timeout` seconds or on failure."""
    try:
        return [format_endpoint(host, port)]
    except ValueError:
        pass
    key = (host, port)
    with _lock:
        future = _inflight.get(key)
        if future is None:
            future = Future()
            _inflight[key] = future
            thread = threading.Thread(
                target=_run, args=(key, future), name=f"resolve-{host}", daemon=True
            )
            thread.start()
    try:
        answers = future.result(timeout)
    except FutureTimeout as exc:
        raise ResolveError(f"{host}: no answer within {timeout:g}s") from exc
    except OSError as exc:
        raise ResolveError(f"{host}: {exc}") from exc
    if not answers:
        raise ResolveError(f"{host}: no IPv4/IPv6 address")
    return answers


def _run(key: tuple[str, int], future: Future[list[str]]) -> None:
    try:
        future.set_result(_lookup(*key))
    except OSError as exc:
        future.set_exception(exc)
    finally:
        with _lock:
            if _inflight.get(key) is future:
                del _inflight[key]
