"""Tells when a broker has lost a job's data, so the client can send the job's tasks again.

A confirm means one broker has a task, not that it survives that broker's disk. Each job has a
*marker* queue on every broker (:attr:`JobQueues.marker`) that only its client declares and
only the scheduler deletes (when the job ends). A broker whose data was wiped, or that was
replaced by an empty one, comes back without it, even though the pipes have declared the job's
task and result queues on it again: the client then treats every task without an outcome as
possibly lost (its task, or its result, may have been there) and sends it again. Duplicates are
dropped by task id.

The watch checks every broker every :data:`CHECK_INTERVAL` seconds over the client's shared link
(a passive declare on a fresh channel), all at once, and reports the brokers found lost in one
round together (brokers restarted empty are found in the same round: their tasks are sent again
once, not once per broker). A broker it cannot reach is checked again later; each check is
told to the client's :class:`~truba.client.reach.Reach`, which bounds waits on a cluster whose
every broker is unreachable.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Final, final

from truba.client.reach import Reach
from truba.pipes.broker import Broker, QueueSpec

log = logging.getLogger(__name__)

CHECK_INTERVAL: Final = 2.0
"""Seconds between checks of one broker's marker."""


@final
class LossWatch:
    """Declares a job's marker on its brokers and calls ``on_lost(brokers)`` with the brokers
    found lost in one round.

    ``known`` says whether the markers were declared before (a resumed job): a marker missing at
    the first check is then a loss too. For a new job, a missing marker is just not made yet.
    ``interval`` defaults to :data:`CHECK_INTERVAL` as it is when the watch is made.
    """

    def __init__(
        self,
        links: Sequence[Broker],
        marker: str,
        on_lost: Callable[[Sequence[Broker]], Awaitable[None]],
        *,
        job_id: str,
        known: bool,
        reach: Reach | None = None,
        interval: float | None = None,
    ) -> None:
        self._links = list(links)
        self._spec = QueueSpec(marker, kind="classic")
        self._on_lost = on_lost
        self._job_id = job_id
        self._marked = {link.url: known for link in self._links}
        self._reach = reach
        self._interval = CHECK_INTERVAL if interval is None else interval
        self._task: asyncio.Task[None] | None = None
        self._watching = False
        """Counted among the reach's watchers of these brokers."""
        self.losses = 0
        """Broker losses seen."""

    async def start(self) -> list[Broker]:
        """Checks every broker once (bounded), then keeps checking in the background; returns
        the brokers found lost by the first check (``on_lost`` is not called for them)."""
        if self._reach is not None and not self._watching:
            self._reach.watch(self._marked)
            self._watching = True
        lost = await self._round()
        self._task = asyncio.create_task(self._run(), name=f"loss-watch-{self._job_id}")
        return lost

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._reach is not None and self._watching:
            self._reach.unwatch(self._marked)
            self._watching = False

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            lost = await self._round()
            if not lost:
                continue
            try:
                await self._on_lost(lost)
            except Exception as exc:
                log.error(
                    "client.broker.lost_unhandled",
                    extra={"job_id": self._job_id, "brokers": [b.name for b in lost], "error": repr(exc)},
                )
                log.debug("client.broker.lost_unhandled", exc_info=True)

    async def _round(self) -> list[Broker]:
        """Checks every broker at once; the ones found lost."""
        checks = await asyncio.gather(*(self._check(link) for link in self._links))
        return [link for link, lost in zip(self._links, checks, strict=True) if lost]

    async def _check(self, link: Broker) -> bool:
        """Whether ``link``'s broker lost the job's data (its marker is gone)."""
        began = time.monotonic() if self._reach is None else self._reach.clock()
        try:
            async with asyncio.timeout(self._interval * 5):
                if await link.has_queue(self._spec.name):
                    self._marked[link.url] = True
                    self._reached(link)
                    return False
                await link.declare(self._spec)
        except Exception as exc:  # unreachable or refusing: checked again next round
            log.debug("client.broker.unchecked", extra={"job_id": self._job_id, "error": repr(exc)})
            if self._reach is not None:
                self._reach.broker_down(link.url, exc, since=began)
            return False
        self._reached(link)
        lost, self._marked[link.url] = self._marked[link.url], True
        if not lost:
            log.info("client.broker.marked", extra={"job_id": self._job_id, "broker": link.name})
            return False
        self.losses += 1
        log.error(
            "client.broker.lost",
            extra={"job_id": self._job_id, "broker": link.name, "marker": self._spec.name},
        )
        return True

    def _reached(self, link: Broker) -> None:
        if self._reach is not None:
            self._reach.broker_up(link.url)
