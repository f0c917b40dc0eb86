"""Wakes the agents' long polls when a device gets a new desired revision.

A revision made by this process wakes its waiters at once (`wake`); one made by
another server process sharing the database is noticed by polling for new
revision ids every `poll_seconds`, only while someone is waiting.
"""

from __future__ import annotations

import asyncio
from contextlib import suppress

from starlette.concurrency import run_in_threadpool

from trueup.server.service.revisions import DesiredRevisions

__all__ = ["RevisionWatcher"]


class RevisionWatcher:
    """Wakes long polls: at once for revisions made here, within a poll interval otherwise."""

    def __init__(self, revisions: DesiredRevisions, poll_seconds: float) -> None:
        self.revisions = revisions
        self.poll_seconds = poll_seconds
        self._events: dict[int, asyncio.Event] = {}
        self._waiters: dict[int, int] = {}
        self._task: asyncio.Task[None] | None = None
        self._seen_id = 0

    async def start(self) -> None:
        self._seen_id = await run_in_threadpool(self.revisions.max_revision_id)
        self._task = asyncio.create_task(self._poll())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task

    def wake(self, device_id: int) -> None:
        event = self._events.get(device_id)
        if event is not None:
            event.set()

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_seconds)
            if not self._events:
                continue
            try:
                newest = await run_in_threadpool(self._newer_devices)
            except Exception:
                continue
            for device_id in newest:
                self.wake(device_id)

    def _newer_devices(self) -> set[int]:
        rows = self.revisions.revisions_since(self._seen_id)
        if rows:
            self._seen_id = max(self._seen_id, *(revision_id for revision_id, _ in rows))
        return {device_id for _, device_id in rows}

    async def wait(self, device_id: int, timeout: float) -> None:
        event = self._events.setdefault(device_id, asyncio.Event())
        self._waiters[device_id] = self._waiters.get(device_id, 0) + 1
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            pass
        finally:
            self._waiters[device_id] -= 1
            if self._waiters[device_id] == 0:
                del self._waiters[device_id]
                self._events.pop(device_id, None)
            else:
                event.clear()
