"""Job events for WatchJob: who watches which job, and what changed since each watcher last looked.

Publishers (the lifecycle, the assigner, the counters) call :meth:`JobEvents.publish` with a
job id and a kind; a watcher's :meth:`Watch.changes` yields the kinds that happened since it last
asked. A slow watcher is never a memory problem: repeated kinds are coalesced (it sees one
PROGRESS for any number of progress reports in between), and it reads the job's current state,
not a history.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import AsyncIterator
from typing import final


class EventKind(enum.Enum):
    SNAPSHOT = "snapshot"
    STATE = "state"
    SLOTS = "slots"
    IMPORTANCE = "importance"
    PROGRESS = "progress"
    DRAINED = "drained"


@final
class Watch:
    """One watcher of one job."""

    def __init__(self, hub: JobEvents, job_id: str) -> None:
        self._hub = hub
        self.job_id = job_id
        self._kinds: dict[EventKind, None] = {}  # an ordered set
        self._wake = asyncio.Event()
        self._closed = False

    def notify(self, kind: EventKind) -> None:
        self._kinds[kind] = None
        self._wake.set()

    async def changes(self) -> AsyncIterator[list[EventKind]]:
        """Batches of kinds, in first-happened order, until :meth:`close`."""
        while not self._closed:
            await self._wake.wait()
            self._wake.clear()
            if self._kinds:
                kinds, self._kinds = list(self._kinds), {}
                yield kinds

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._hub._remove(self)
            self._wake.set()


@final
class JobEvents:
    """The watchers of every job."""

    def __init__(self) -> None:
        self._watches: dict[str, set[Watch]] = {}

    def watch(self, job_id: str) -> Watch:
        watch = Watch(self, job_id)
        self._watches.setdefault(job_id, set()).add(watch)
        return watch

    def publish(self, job_id: str, kind: EventKind) -> None:
        for watch in self._watches.get(job_id, ()):
            watch.notify(kind)

    def watched(self, job_id: str) -> bool:
        return job_id in self._watches

    def _remove(self, watch: Watch) -> None:
        watches = self._watches.get(watch.job_id)
        if watches is not None:
            watches.discard(watch)
            if not watches:
                del self._watches[watch.job_id]

    def close(self) -> None:
        """Ends every watch (the scheduler is stopping)."""
        for watches in list(self._watches.values()):
            for watch in list(watches):
                watch.close()
