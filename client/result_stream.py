"""A job's result stream: one outcome per task, exactly once, acked only once taken for good.

Results come in through the result pipe (merge of brokers → deserialize). One whose task is not
in the journal any more is a duplicate (a task may run twice when a daemon dies after sending its
result, or be sent again after a broker lost its data) and is dropped. An outcome counts as taken
when the consumer asks for the next one: the journal then forgets its task, and its result waits
to be acked with a batch. A batch is acked when :data:`ACK_BATCH` outcomes were taken, when no
more members of a frame are at hand, and when the stream ends; the journal's forget marks are
written first (a crash in between brings the results back as duplicates, which are dropped). A
batch acked because nothing more is at hand is acked from a task of its own
(:meth:`ResultStream._ack_soon`): the wait for the next result, and a task that a submit has
just handed over to be published, go first (one task at a time, submit then its outcome, does
not wait for the last outcome's ack before the task is on its way). The stream's end waits for
that task (:meth:`ResultStream.ack_taken`). A
consumer that raises or stops at an outcome puts it back: its result is requeued and comes again.

A router (:attr:`ResultStream.route`, :mod:`truba.client.dispatch`) sees every outcome first: one
it claims (a ``call``'s or a group's task) is taken there and never yielded. While nobody iterates
the stream and a router waits for outcomes, it runs the stream itself as a *pump*
(``outcomes(pump=...)``): the outcomes it does not claim are parked, not taken, and the next
consumer gets them first. One reader at a time waits on the result pipe (:attr:`_reading`).

The stream ends when the job is closed and every task has its outcome (then the job is finished),
or when it is cancelled (then every task still without an outcome gets a cancelled one). While
every broker is unreachable it waits, and raises :class:`~truba.client.errors.Unavailable` once
that lasted the client's ``unavailable_after`` (the job goes on: resume it later).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Final, final

from truba import trace
from truba.client.framing import FrameSizer
from truba.client.journal import TaskJournal
from truba.client.lifecycle import JobStatus
from truba.client.outcome import Outcome
from truba.client.reach import Reach
from truba.latency import LatencyCounts
from truba.pipes.base import Delivery, Listener
from truba.pipes.errors import PipeClosed, PipeError
from truba.pipes.frame_listener import FrameListener
from truba.pipes.serialize import DeserializeListener

log = logging.getLogger(__name__)

ACK_BATCH: Final = 64
"""Outcomes taken at most before their results are acked (sooner when no more are at hand)."""
STATE_POLL_SECONDS: Final = 2.0
"""Seconds without a result after which the stream asks (``poll``) how the job stands."""
GET_TIMEOUT: Final = 0.5
"""Seconds one wait for a result lasts at most."""


@final
class ResultStream:
    """Yields a job's outcomes; see the module.

    ``on_taken`` is called for every outcome taken (progress), after ``latency`` counted it
    (seconds from its task's ``start`` in the journal, when known); ``poll`` while no result comes
    (the job may have been cancelled elsewhere); ``on_done`` once every outcome is taken.
    """

    def __init__(
        self,
        job_id: str,
        results: Listener[Outcome],
        journal: TaskJournal,
        status: JobStatus,
        *,
        frames: FrameListener | None,
        sizer: FrameSizer | None,
        on_taken: Callable[[], None],
        poll: Callable[[], Awaitable[None]],
        on_done: Callable[[], Awaitable[None]],
        reach: Reach,
        latency: LatencyCounts | None = None,
    ) -> None:
        self._job_id = job_id
        self._reach = reach
        self._latency = latency
        """Counts each outcome taken by its latency (None: not counted)."""
        self._results = results
        self._get_batch = results.get_batch if isinstance(results, DeserializeListener) else None
        """Takes the next result with the rest of its frame at once (the result stack's outer
        layer; None for another listener: one ``get`` per result)."""
        self._batch: collections.deque[Delivery[Outcome]] = collections.deque()
        """Results read with the last one taken from the pipe (the rest of its frame), not handed
        out yet: each is taken from here, with no wait on the pipe of its own."""
        self._journal = journal
        self._status = status
        self._sizer = sizer
        """Sizes task frames by the tasks' handler time (None: frames off for this job)."""
        self._on_taken = on_taken
        self._poll = poll
        self._on_done = on_done
        self._taken: list[Delivery[Outcome]] = []
        """Results whose outcomes were taken (or dropped as duplicates), not acked yet."""
        self._unframe = frames
        """The result listener's unframe layer (its stack's handle): says when members of a frame
        are at hand (None: acks are never held back for them)."""
        self.route: Callable[[Outcome], bool] | None = None
        """Sees every outcome first; True: it took the outcome (a call's, a group's)."""
        self.idle: Callable[[], None] | None = None
        """Called when the last consumer stops iterating (a router may pump again)."""
        self.arrived: Callable[[str], None] | None = None
        """Told every task whose outcome came (a task still in the journal), before the router
        and the consumers (set once the job has keyed tasks: a key's next task goes out then)."""
        self.settled: Callable[[str], None] | None = None
        """Told every task whose outcome was taken, after the journal forgot it (with ``arrived``)."""
        self._consumers = 0
        """Consumers iterating now (the pump not counted)."""
        self._parked: collections.deque[Delivery[Outcome]] = collections.deque()
        """Results the pump read and no router claimed: not taken, the next consumer's first."""
        self._reading = asyncio.Lock()
        """One reader of the result pipe at a time (a consumer and the pump may overlap)."""
        self._acking: asyncio.Task[None] | None = None
        """Acks the batches taken meanwhile (:meth:`_ack_soon`); None when none runs."""

    @property
    def consumers(self) -> int:
        """Consumers iterating now (the pump not counted)."""
        return self._consumers

    def tell(self, arrived: Callable[[str], None], settled: Callable[[str], None]) -> None:
        """From now on, tells ``arrived`` of every outcome that comes and ``settled`` of every
        one taken (a job's keyed tasks: :mod:`truba.client.key_order`)."""
        self.arrived, self.settled = arrived, settled

    async def outcomes(self, *, pump: Callable[[], bool] | None = None) -> AsyncGenerator[Outcome, None]:
        """One outcome per task, in arrival order, until the job is done; see :meth:`Job.results`.

        ``pump``: run for the router only, while ``pump()`` is true and no consumer iterates;
        outcomes the router does not claim are parked for the next consumer (nothing is yielded).
        """
        journal, status = self._journal, self._status
        if pump is None:
            self._consumers += 1
        try:
            last_poll = time.monotonic()
            while not (status.closed and not len(journal)) and not status.cancelled:
                if pump is not None and (self._consumers or not pump()):
                    return  # a consumer took over, or no call or group waits any more
                try:
                    if pump is None and self._parked:
                        delivery: Delivery[Outcome] | None = self._parked.popleft()
                    else:
                        delivery = self._batch.popleft() if self._batch else await self._next_result()
                        if delivery is not None and self._sizer is not None and not delivery.message.gave_up:
                            self._sizer.observe(delivery.message.seconds)
                except PipeClosed:
                    # cancel() closed the pipe under us (cancelled outcomes follow), or another
                    # reader finished the job.
                    if status.cancelled or (status.closed and not len(journal)):
                        break
                    raise
                if delivery is None:
                    self._reach.check_brokers(f"results of job {self._job_id}")
                    if time.monotonic() - last_poll > STATE_POLL_SECONDS:
                        last_poll = time.monotonic()
                        await self._poll()
                    continue
                outcome = delivery.message  # decoded straight into its Outcome (OutcomeCodec)
                if outcome.task_id not in journal:
                    log.info(
                        "client.result.duplicate", extra={"job_id": self._job_id, "task_id": outcome.task_id}
                    )
                    self._taken.append(delivery)
                    continue
                if self.arrived is not None:
                    self.arrived(outcome.task_id)
                if trace.enabled:
                    trace.mark("client.outcome", outcome.task_id)
                if self.route is not None and self.route(outcome):
                    if self._take(delivery):
                        await self.ack_taken()
                    continue
                if pump is not None:
                    self._parked.append(delivery)
                    continue
                taken = False
                try:
                    yield outcome
                    taken = True
                finally:
                    if taken:
                        if self._take(delivery):
                            await self.ack_taken()
                    else:  # the consumer raised or closed us at this outcome: it comes again
                        log.info(
                            "client.result.put_back",
                            extra={"job_id": self._job_id, "task_id": outcome.task_id},
                        )
                        with contextlib.suppress(PipeError):
                            await delivery.reject(requeue=True)
        finally:
            if pump is None:
                self._consumers -= 1
            await self.ack_taken()
            if pump is None and not self._consumers and self.idle is not None:
                self.idle()
        if status.cancelled:
            for task_id in journal.outstanding():
                cancelled = Outcome.cancelled_task(task_id)
                if self.route is not None and self.route(cancelled):
                    journal.settle(task_id)
                elif pump is None and journal.settle(task_id):
                    yield cancelled
            return
        await self._on_done()

    async def _next_result(self) -> Delivery[Outcome] | None:
        """The next result, waiting up to :data:`GET_TIMEOUT`; the rest of its frame, read with
        it, waits in ``_batch``. The results taken are acked first unless more members of a
        frame are at hand (and at most :data:`ACK_BATCH` of them wait)."""
        if self._batch:  # another reader (the pump, a consumer) read a frame meanwhile
            return self._batch.popleft()
        if self._taken and not (self._unframe is not None and self._unframe.held):
            self._ack_soon()
        reading = self._reading  # acquire and release by hand: one coroutine, not three, per result
        await reading.acquire()
        try:
            if self._batch:  # read by the reader we waited for
                return self._batch.popleft()
            if self._get_batch is None:
                return await self._results.get(GET_TIMEOUT)
            batch = await self._get_batch(GET_TIMEOUT)
        finally:
            reading.release()
        if not batch:
            return None
        self._batch.extend(batch)
        return self._batch.popleft()

    def _take(self, delivery: Delivery[Outcome]) -> bool:
        """The application took this outcome: its latency is counted, the journal forgets its
        task; its result is acked with the next batch (:meth:`ack_taken`). True: that batch is
        full, the caller acks it now (a plain call, not a coroutine: it runs once per task)."""
        task_id = delivery.message.task_id
        if self._latency is not None and (start := self._journal.started(task_id)):
            self._latency.observe(time.monotonic() - start)
        self._journal.settle(task_id)
        if self.settled is not None:
            self.settled(task_id)
        self._on_taken()
        self._taken.append(delivery)
        return len(self._taken) >= ACK_BATCH

    def _ack_soon(self) -> None:
        """Acks the outcomes taken from a task of its own, which goes on while more are taken
        (see the module); one runs at a time."""
        if self._acking is None:
            self._acking = asyncio.get_running_loop().create_task(self._ack_batches())

    async def _ack_batches(self) -> None:
        try:
            while self._taken:
                await self._ack_batch()
        finally:
            self._acking = None

    async def _ack_batch(self) -> None:
        """Writes the journal's forget marks of the outcomes taken, then acks their results. A
        crash in between brings those results back as duplicates, which are dropped."""
        self._journal.flush()
        taken, self._taken = self._taken, []
        for delivery in taken:
            await _ack(delivery)

    async def ack_taken(self) -> None:
        """Returns once every outcome taken so far has its result acked (or its ack failed: the
        result then comes again, a duplicate). A cancelled wait leaves the acks under way."""
        if self._acking is not None:
            await asyncio.wait((self._acking,))
        if self._taken:
            await self._ack_batch()

    async def close(self) -> None:
        """Stops consuming (the result pipe closes; deliveries not acked come again)."""
        await self._results.close()


async def _ack(delivery: Delivery[Outcome]) -> None:
    # The result's channel may be gone: the broker then delivers it again, and it is dropped
    # as a duplicate (its task is no longer in the journal).
    try:
        await delivery.ack()
    except PipeError:
        pass
