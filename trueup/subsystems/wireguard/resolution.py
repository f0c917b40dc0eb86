"""Endpoint names resolved by trueup: a cache filled in preparation and refreshed on a schedule.

The subsystem's `prepare()` resolves every peer endpoint given by name that
the cache lacks (or whose last lookup failed), each lookup bounded by
`resolve_timeout` and all of them by the subsystem's deadline; `desired()`
then reads the cache, so the facts hold addresses and stay pure. A daemon
thread re-resolves the names every `resolve_interval` (and a failed name at
its next wake, every few seconds); when an answer changes, the desired
endpoint changes and the reconcile loop's next look sees the difference and
heals it. A name that never resolved is desired as `unresolved NAME:PORT`,
which no live endpoint equals: the subsystem stays failed and is retried.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypedDict

from trueup.system.resolve import ResolveError, resolve_endpoint

__all__ = ["Resolution", "ResolutionJSON", "Resolver"]

log = logging.getLogger("trueup.wireguard")

ResolveFn = Callable[[str, int, float], list[str]]
# How often the refresher wakes to look for names due (the interval itself is per document).
_WAKE = 5.0


class ResolutionJSON(TypedDict):
    """One endpoint name's resolution as status shows it."""

    endpoint: str | None
    addresses: list[str]
    resolved_at: float | None
    error: str | None


@dataclass
class Resolution:
    name: str  # HOST:PORT as the document gives it
    endpoints: list[str]
    resolved_at: float | None
    error: str = ""
    attempted_at: float = 0.0

    def to_json(self) -> ResolutionJSON:
        return {
            "endpoint": self.endpoints[0] if self.endpoints else None,
            "addresses": list(self.endpoints),
            "resolved_at": self.resolved_at,
            "error": self.error or None,
        }


class Resolver:
    """The cache of resolved endpoint names, shared by preparation, desired() and the refresher."""

    def __init__(self, resolve: ResolveFn = resolve_endpoint, *, refresh: bool = True) -> None:
        self._resolve = resolve
        self._refresh = refresh
        self._lock = threading.Lock()
        self._entries: dict[str, Resolution] = {}
        self.interval = 300.0
        self.timeout = 5.0
        self._thread: threading.Thread | None = None

    def endpoint(self, name: str) -> str | None:
        """The address `name` (HOST:PORT) resolved to, or None when it never did."""
        with self._lock:
            entry = self._entries.get(name)
            return entry.endpoints[0] if entry and entry.endpoints else None

    def snapshot(self) -> dict[str, ResolutionJSON]:
        with self._lock:
            return {name: entry.to_json() for name, entry in sorted(self._entries.items())}

    def prepare(self, names: list[tuple[str, str]], interval: float, timeout: float) -> None:
        """Resolve each (path, HOST:PORT) not resolved yet or failed last time; raise on failure.

        Lookups run in parallel (each bounded by `timeout`); the error names
        every path that did not resolve.
        """
        self.interval, self.timeout = interval, timeout
        with self._lock:
            for _path, name in names:
                self._entries.setdefault(name, Resolution(name, [], None))
            due = [
                (path, name)
                for path, name in names
                if not self._entries[name].endpoints or self._entries[name].error
            ]
        problems: dict[str, str] = {}
        threads = []
        for path, name in due:
            thread = threading.Thread(
                target=lambda p=path, n=name: self._lookup(n, problems, p), daemon=True
            )
            thread.start()
            threads.append(thread)
        for thread in threads:
            thread.join(timeout + 1.0)
        self._start()
        # A name that resolved before keeps its last address while a new lookup fails.
        failed = [(p, n) for p, n in due if self.endpoint(n) is None]
        if failed:
            raise ResolveError(
                "; ".join(
                    f"{p}: cannot resolve {n}: {problems.get(p, 'no answer')}" for p, n in failed
                )
            )

    def _lookup(self, name: str, problems: dict[str, str], path: str = "") -> bool:
        host, _, port = name.rpartition(":")
        now = time.time()
        try:
            answers = self._resolve(host, int(port), self.timeout)
        except (ResolveError, OSError, ValueError) as exc:
            with self._lock:
                entry = self._entries.setdefault(name, Resolution(name, [], None))
                entry.error, entry.attempted_at = str(exc), now
            problems[path] = str(exc)
            return False
        with self._lock:
            entry = self._entries.setdefault(name, Resolution(name, [], None))
            changed = entry.endpoints[:1] != answers[:1]
            entry.endpoints, entry.resolved_at, entry.error = list(answers), now, ""
            entry.attempted_at = now
        if changed:
            log.info("%s resolves to %s", name, answers[0])
        return True

    def refresh_due(self, now: float | None = None) -> list[str]:
        """Re-resolve the names whose interval passed or whose last lookup failed; those done."""
        now = time.time() if now is None else now
        with self._lock:
            due = [
                name
                for name, entry in self._entries.items()
                if (entry.error and now - entry.attempted_at >= _WAKE)
                or (entry.resolved_at is not None and now - entry.resolved_at >= self.interval)
            ]
        for name in due:
            self._lookup(name, {})
        return due

    def _start(self) -> None:
        if not self._refresh or (self._thread is not None and self._thread.is_alive()):
            return
        self._thread = threading.Thread(target=self._run, name="wireguard-resolve", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(_WAKE)
            try:
                self.refresh_due()
            except Exception:  # the refresher never dies of one bad name
                log.exception("re-resolving endpoint names")
