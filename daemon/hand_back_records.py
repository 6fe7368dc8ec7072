"""Hand-back records on one daemon: one sender per job into its result log, shared by its runners.

A frame member the daemon puts back into its queue (a hand-back, a preemption, a retry, a
recount) gets a record in the job's result log once its copy is confirmed (see
:mod:`truba.daemon.task_endings`): a redelivered frame then skips it, its copy runs. Records are
rare (only frame members that go back) but come in bursts (a preempted runner puts back all it
holds), and runners of a job open and close often (every preemption, every resize to zero): so
the sender is one per job and daemon, not per runner, opened on the job's first record and closed
:data:`LINGER` seconds after the job left the daemon (a runner closing puts back what it holds:
those records go out after it closed). A job that comes back within that keeps its sender.

Records are sent in the background, in order, and never awaited by an ack: a record that fails
(or a daemon that dies before it is confirmed) is only logged, and leaves its member to run twice
if its frame comes back redelivered (the at-least-once case, as before records existed). The pump
waits :data:`SETTLE_WAIT` before sending, and drops a record whose frame was settled meanwhile (a
frame acked is never redelivered; its members are done): a runner that closes hands back every
member it holds, whole frames, and those need no record. A frame acked whose ack is lost with
its channel runs such a member twice, never zero times.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import deque
from collections.abc import Callable, Sequence
from typing import Final, final

from truba.pipes.base import Confirmation, Sender
from truba.pipes.broker import Broker, QueueSpec
from truba.pipes.errors import PipeError
from truba.pipes.frame import FrameLimits
from truba.pipes.stacks import send_stack
from truba.wire import HandedBack, HandedBackCodec

__all__ = ["LINGER", "HandBackRecords", "JobRecords"]

log = logging.getLogger(__name__)

LINGER: Final = 60.0
"""Seconds a job's record sender stays open after the job left the daemon."""
SETTLE_WAIT: Final = 0.05
"""Seconds the pump lets the acks of members just put back go out before it sends their records."""
CLOSE_WITHIN: Final = 5.0
"""Seconds closing a job's records waits for those still queued or unconfirmed."""


@final
class JobRecords:
    """A job's hand-back records on this daemon: :meth:`record` queues one (it never waits); a
    background pump sends them in order through a sender opened on the first record."""

    def __init__(
        self, job_id: str, open_sender: Callable[[], Sender[HandedBack]], settle_wait: float = SETTLE_WAIT
    ) -> None:
        self.job_id = job_id
        self._open_sender = open_sender
        self._settle_wait = settle_wait
        self._sender: Sender[HandedBack] | None = None
        self._queue: deque[tuple[HandedBack, Callable[[], bool]]] = deque()
        self._unconfirmed: set[Confirmation] = set()
        self._pump: asyncio.Task[None] | None = None
        self._pumping = False
        self._idle = asyncio.Event()
        self._idle.set()
        self._closed = False
        self.sent = 0
        """Records confirmed so far."""
        self.unneeded = 0
        """Records dropped because their frame was settled before their turn."""

    @property
    def opened(self) -> bool:
        """True once a record made it open its sender."""
        return self._sender is not None

    def record(self, record: HandedBack, needed: Callable[[], bool] = lambda: True) -> None:
        """Queues ``record`` to be sent unless ``needed()`` is False by its turn (its frame was
        settled); dropped, and logged, once closed."""
        if self._closed:
            self._unrecorded(record, "closed")
            return
        self._queue.append((record, needed))
        self._idle.clear()
        if not self._pumping:
            self._pumping = True
            self._pump = asyncio.create_task(self._send_queued())

    async def _send_queued(self) -> None:
        try:
            if self._sender is None:
                self._sender = self._open_sender()
                log.info("daemon.hand_back.records_opened", extra={"job_id": self.job_id})
            if self._settle_wait > 0:
                await asyncio.sleep(self._settle_wait)
            while self._queue:
                record, needed = self._queue.popleft()
                if not needed():
                    self.unneeded += 1
                    continue
                try:
                    confirmation = await self._sender.send(record)
                except PipeError as exc:
                    self._unrecorded(record, repr(exc))
                    continue
                self._unconfirmed.add(confirmation)
                confirmation.add_done_callback(functools.partial(self._confirmed, record))
        finally:
            self._pumping = False
            self._check_idle()

    def _confirmed(self, record: HandedBack, confirmation: Confirmation) -> None:
        self._unconfirmed.discard(confirmation)
        if confirmation.cancelled():
            self._unrecorded(record, "cancelled")
        elif (error := confirmation.exception()) is not None:
            self._unrecorded(record, repr(error))
        else:
            self.sent += 1
        self._check_idle()

    def _check_idle(self) -> None:
        if not self._queue and not self._unconfirmed and not self._pumping:
            self._idle.set()

    def _unrecorded(self, record: HandedBack, error: str) -> None:
        log.warning(
            "daemon.task.hand_back_unrecorded",
            extra={"job_id": self.job_id, "task_id": record.task_id, "error": error},
        )

    async def flush(self, timeout: float) -> bool:
        """Waits until every queued record is confirmed (or failed); False if ``timeout`` passed."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        return False

    async def close(self, timeout: float = CLOSE_WITHIN) -> None:
        """Sends what is queued (bounded by ``timeout``), then closes the sender; idempotent."""
        if self._closed:
            return
        self._closed = True
        if not await self.flush(timeout):
            log.warning(
                "daemon.hand_back.close_timeout",
                extra={
                    "job_id": self.job_id,
                    "queued": len(self._queue),
                    "unconfirmed": len(self._unconfirmed),
                },
            )
        if self._pump is not None and not self._pump.done():
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump
        for record, _ in self._queue:
            self._unrecorded(record, "closed")
        self._queue.clear()
        if self._sender is not None:
            with contextlib.suppress(PipeError):
                await self._sender.close()


def records_sender(brokers: Sequence[Broker], result_log: QueueSpec) -> Callable[[], Sender[HandedBack]]:
    """Opens a job's record sender over ``brokers`` (framed under load: a preempted runner puts
    many tasks back at once)."""
    return lambda: (
        send_stack(HandedBackCodec(), brokers, result_log, role="handed-back", frames=FrameLimits()).sender
    )


@final
class HandBackRecords:
    """The daemon's :class:`JobRecords`, one per job, closed :data:`LINGER` s after it left."""

    def __init__(self, linger: float = LINGER) -> None:
        self._linger = linger
        self._jobs: dict[str, tuple[JobRecords, tuple[Broker, ...], QueueSpec]] = {}
        self._leaving: dict[str, asyncio.TimerHandle] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def for_job(
        self, job_id: str, brokers: Sequence[Broker], result_log: QueueSpec | None
    ) -> JobRecords | None:
        """The job's records (None: the job has no result log); kept if the job left and came back
        within the linger, made anew if its brokers or its log changed."""
        self._stay(job_id)
        if result_log is None:
            self._close_later(job_id)
            return None
        links = tuple(brokers)
        kept = self._jobs.get(job_id)
        if kept is not None:
            records, kept_links, kept_log = kept
            if kept_links == links and kept_log == result_log:
                return records
            self._close_later(job_id)
        records = JobRecords(job_id, records_sender(links, result_log))
        self._jobs[job_id] = (records, links, result_log)
        return records

    def left(self, job_id: str) -> None:
        """The job has no runner on this daemon any more: its records close after the linger."""
        if job_id in self._jobs and job_id not in self._leaving:
            self._leaving[job_id] = asyncio.get_running_loop().call_later(
                self._linger, self._close_later, job_id
            )

    def _stay(self, job_id: str) -> None:
        handle = self._leaving.pop(job_id, None)
        if handle is not None:
            handle.cancel()

    def _close_later(self, job_id: str) -> None:
        self._leaving.pop(job_id, None)
        kept = self._jobs.pop(job_id, None)
        if kept is not None:
            task = asyncio.create_task(kept[0].close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        """Closes every job's records (each bounded by :data:`CLOSE_WITHIN`)."""
        for job_id in list(self._jobs):
            self._stay(job_id)
            self._close_later(job_id)
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
