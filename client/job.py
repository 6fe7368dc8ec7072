"""A job seen from the client: submit tasks, close, and take one outcome per task.

Every task goes first into the job's journal (:mod:`truba.client.journal`: on disk unless the
client was made with ``journal=False``), then out through the job's task pipe (balance over
brokers), and stays in the journal until the application has taken its outcome. Outcomes come
in through the result pipe (merge of brokers → deserialize); one whose task is not in the journal
any more is a duplicate (a task may run twice when a daemon dies after sending its result) and
is dropped. A result message is acked only after the application has taken its outcome and the
journal has forgotten the task, so a crash anywhere loses nothing: :meth:`Client.resume` sends
what no broker confirmed and waits for the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import secrets
import shutil
import sys
import time
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Sized
from typing import TYPE_CHECKING, NoReturn

from tqdm import tqdm

from truba.client.encoded import EncodedTask, EncodedTaskCodec
from truba.client.errors import SchedulerError, Unavailable, map_rpc_errors
from truba.client.framing import FrameSizer
from truba.client.journal import TaskJournal
from truba.client.outcome import Outcome
from truba.client.watch import LossWatch
from truba.errors import TrubaError
from truba.pipes.base import Confirmation, Delivery, Listener, Sender
from truba.pipes.broker import Broker
from truba.pipes.errors import CodecError, MessageTooLarge, PipeClosed, PipeError
from truba.pipes.frame import unframing
from truba.proto.v1 import jobs_pb2
from truba.queues import MAX_PRIORITY
from truba.wire import ResultMessage, TaskMessage

if TYPE_CHECKING:
    from truba.client.client import Client

log = logging.getLogger(__name__)
RESEND_ROUNDS = 5
STATE_POLL_SECONDS = 2.0
FINISH_PATIENCE = 120.0
"""Seconds a finished job keeps asking an unreachable scheduler to delete its queues."""
PROGRESS_INTERVAL = 0.25
"""Seconds between progress reports to the scheduler at most (they feed the job's demand)."""
PROGRESS_KEEPALIVE = 5.0
"""Seconds after which an unchanged progress is reported again: the scheduler counts a client's
report towards the job's demand only while it is recent."""
RESEND_CHUNK = 1000
"""Tasks read back from the journal at a time when sending many again."""
ACK_BATCH = 64
"""Outcomes taken at most before their results are acked (sooner when no more are at hand)."""
MAP_WINDOW = 1000
"""Tasks :meth:`Job.map` keeps submitted and not yet yielded, by default."""


class SubmitTimeout(TrubaError, TimeoutError):
    """``submit(timeout=...)`` ran out before a broker took the task; it was not submitted."""


class CallbackFailed(TrubaError):
    """An ``on_result`` callback raised; its outcome was not taken and comes again."""

    def __init__(self, task_id: str) -> None:
        super().__init__(f"the on_result callback raised for task {task_id}; its outcome was put back")
        self.task_id = task_id


class Job:
    """One job: ``submit`` tasks, ``close`` it, iterate its ``results()``.

    Not safe to share between event loops; use one ``results()``/``on_result`` consumer.
    """

    def __init__(
        self,
        client: Client,
        info: jobs_pb2.Job,
        tasks: Sender[EncodedTask],
        results: Listener[ResultMessage],
        journal: TaskJournal,
        *,
        links: list[Broker],
        marker: str,
        max_payload: int,
        resumed: bool = False,
        sizer: FrameSizer | None = None,
    ) -> None:
        self._client = client
        self._info = info
        self._tasks = tasks
        self._results = results
        self._journal = journal
        self._max_payload = max_payload
        self._sizer = sizer
        """Sizes task frames by the tasks' handler time (None: frames off for this job)."""
        self._prefix = secrets.token_hex(3)
        self._next = 0
        self._confirmations: dict[str, Confirmation] = {}
        """Confirms awaited, by task."""
        self._failed: set[str] = set()
        """Tasks whose confirm failed: sent again at close (or when a broker is lost)."""
        self._closed = info.state not in (jobs_pb2.JOB_STATE_UNSPECIFIED, jobs_pb2.JOB_STATE_OPEN)
        self._finished = False
        self._cancelled = False
        self._detached = False
        self._consumer: asyncio.Task[None] | None = None
        self._taken: list[Delivery[ResultMessage]] = []
        """Results whose outcomes were taken (or dropped as duplicates), not acked yet."""
        self._unframe = unframing(results)
        """The result listener's unframe layer: says when members of a frame are at hand."""
        self._progress_wake = asyncio.Event()
        self._progress: asyncio.Task[None] | None = None
        self._watch = LossWatch(links, marker, self._broker_lost, job_id=info.id, known=resumed)

    async def _start(self) -> None:
        """Sends what no broker confirmed (a resumed job), and starts watching for lost brokers."""
        await self._watch.start()
        if len(self._journal):
            self._progressed()  # a resumed job: the scheduler hears from its client again
        unconfirmed = self._journal.unconfirmed()
        if unconfirmed:
            log.info("client.job.resend_unconfirmed", extra={"job_id": self.id, "count": len(unconfirmed)})
            await self._send_again(unconfirmed)

    @property
    def id(self) -> str:
        """The job's id, as the scheduler knows it."""
        return self._info.id

    @property
    def handler(self) -> str:
        """The job's handler, ``"package.module:function"``."""
        return self._info.handler

    @property
    def submitted(self) -> int:
        """Tasks submitted so far (by every run of this client on the job's journal)."""
        return self._journal.recorded

    @property
    def received(self) -> int:
        """Outcomes taken so far (by every run on this journal)."""
        return self._journal.recorded - len(self._journal)

    @property
    def outstanding(self) -> int:
        """Tasks submitted whose outcome has not been taken yet."""
        return len(self._journal)

    @property
    def done(self) -> bool:
        """Closed, and every submitted task has its outcome."""
        return self._closed and len(self._journal) == 0

    @property
    def ended(self) -> bool:
        """Finished, cancelled or detached: this object has no more work to do."""
        return self._finished or self._cancelled or self._detached

    @property
    def journal_path(self) -> str | None:
        """Where the job's tasks wait for their outcomes on disk (None: memory only)."""
        return None if self._journal.directory is None else str(self._journal.directory)

    async def submit(
        self, payload: object, *, priority: int | None = None, timeout: float | None = None
    ) -> str:
        """Sends one task; returns its id once a broker accepted it for sending.

        The task is in the journal before it is sent and stays there until its outcome is
        taken. ``submit`` waits while the brokers are slow or blocked (each broker takes at
        most the client's ``max_unconfirmed`` unconfirmed tasks), so memory stays bounded.

        Args:
            priority: 0 (the default) to 9, higher taken first; only for a job created with
                ``priorities=True``.
            timeout: seconds to wait for a broker to take the task (None: as long as it takes).

        Raises:
            ValueError: a priority on a job without priorities, or out of range (nothing sent).
            PipeClosed: the job was closed.
            CodecError: ``payload`` is not msgpack-serializable (nothing sent).
            MessageTooLarge: ``payload`` is over the client's ``max_payload`` (nothing sent).
            SubmitTimeout: no broker took it within ``timeout`` (it was not submitted).
            SpoolFull, SpoolError: the journal could not write it (nothing sent).
            PipeBroken: no broker can take the task (it was not submitted).
        """
        if self._closed:
            raise PipeClosed(f"job {self.id} is closed: no more tasks")
        if priority is not None:
            if not self._info.settings.priorities:
                raise ValueError(f"priority: job {self.id} was created without priorities=True")
            if not 0 <= priority <= MAX_PRIORITY:
                raise ValueError(f"priority: must be 0..{MAX_PRIORITY}, got {priority}")
        task_id = f"{self._prefix}-{self._next}"
        task = EncodedTask.of(TaskMessage(task_id, payload, priority=priority or 0))
        if len(task.data) > self._max_payload:
            raise MessageTooLarge(
                f"task {task_id}: {len(task.data)} bytes encoded, over max_payload={self._max_payload}: "
                "pass large data by reference (a path or a URL); nothing was sent"
            )
        self._next += 1
        await self._journal.record(task_id, task.data)
        try:
            if timeout is None:  # the common case: no timer to arm
                confirmation = await self._tasks.send(task)
            else:
                async with asyncio.timeout(timeout):
                    confirmation = await self._tasks.send(task)
        except TimeoutError:
            self._journal.withdraw(task_id)
            raise SubmitTimeout(
                f"task {task_id}: no broker took it within {timeout} s; it was not submitted"
            ) from None
        except (PipeError, CodecError):
            self._journal.withdraw(task_id)
            raise
        self._watch_confirm(task_id, confirmation)
        self._progressed()
        log.debug("client.task.submitted", extra={"job_id": self.id, "task_id": task_id})
        return task_id

    def _watch_confirm(self, task_id: str, confirmation: Confirmation) -> None:
        self._confirmations[task_id] = confirmation
        confirmation.add_done_callback(functools.partial(self._on_confirm, task_id))

    def _on_confirm(self, task_id: str, confirmation: Confirmation) -> None:
        if self._confirmations.get(task_id) is confirmation:
            del self._confirmations[task_id]
        if not confirmation.cancelled() and confirmation.exception() is None:
            self._failed.discard(task_id)
            self._journal.confirmed(task_id)
        else:
            log.warning(
                "client.task.unconfirmed",
                extra={"job_id": self.id, "task_id": task_id, "error": repr(_error_of(confirmation))},
            )
            self._failed.add(task_id)

    async def _send_again(self, task_ids: list[str]) -> None:
        """Sends tasks of the journal again (read back from disk), in chunks."""
        for start in range(0, len(task_ids), RESEND_CHUNK):
            chunk = task_ids[start : start + RESEND_CHUNK]
            loaded = self._journal.load(chunk)
            codec = EncodedTaskCodec()
            for task_id in chunk:
                data = loaded.get(task_id)
                if data is None:  # its outcome came meanwhile
                    continue
                self._failed.discard(task_id)
                self._watch_confirm(task_id, await self._tasks.send(codec.decode(data)))

    async def _broker_lost(self, broker: Broker) -> None:
        """A broker lost its data: every task without an outcome may have been there (its task
        or its result), so every one is sent again; duplicate outcomes are dropped."""
        outstanding = self._journal.outstanding()
        log.warning(
            "client.job.resubmit", extra={"job_id": self.id, "broker": broker.name, "count": len(outstanding)}
        )
        self._journal.unmark(outstanding)
        await self._send_again(outstanding)

    def _progressed(self) -> None:
        """Submitted or received changed: the reporter tells the scheduler soon (coalesced)."""
        self._progress_wake.set()
        if self._progress is None:
            self._progress = asyncio.create_task(self._report_progress(), name=f"progress-{self.id}")

    async def _report_progress(self) -> None:
        """Reports (submitted, received) at most every :data:`PROGRESS_INTERVAL` seconds, and at
        least every :data:`PROGRESS_KEEPALIVE` seconds.

        The scheduler sizes the job's share by these counts; an unreachable scheduler only
        delays the report (the data plane does not need it), an ended job stops the reporter.
        """
        last = (-1, -1)
        while True:
            keepalive = False
            try:
                async with asyncio.timeout(PROGRESS_KEEPALIVE):
                    await self._progress_wake.wait()
            except TimeoutError:
                keepalive = True  # unchanged, but said again: the scheduler trusts recent reports
            self._progress_wake.clear()
            now = (self.submitted, self.received)
            if now != last or keepalive:
                request = jobs_pb2.ReportProgressRequest(job_id=self.id, submitted=now[0], received=now[1])
                try:
                    with map_rpc_errors():
                        await self._client.jobs.ReportProgress(request)
                    last = now
                except Unavailable as exc:
                    log.info("client.progress.unreachable", extra={"job_id": self.id, "error": str(exc)})
                    self._progress_wake.set()
                except SchedulerError as exc:  # the job ended: nothing left to report
                    log.debug("client.progress.stopped", extra={"job_id": self.id, "error": str(exc)})
                    return
            await asyncio.sleep(PROGRESS_INTERVAL)

    async def _stop_progress(self) -> None:
        if self._progress is not None:
            self._progress.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._progress

    async def _settle_confirms(self) -> None:
        """Waits until every confirm now awaited has come (or failed: then in ``_failed``)."""
        while self._confirmations:
            waiting = list(self._confirmations.values())
            await asyncio.gather(*waiting, return_exceptions=True)
            for task_id, confirmation in list(self._confirmations.items()):
                if confirmation.done():
                    del self._confirmations[task_id]

    async def _confirm_all(self) -> None:
        """Waits for every confirm, sending again (bounded) what a broker nacked or lost."""
        for round_ in range(RESEND_ROUNDS + 1):
            await self._settle_confirms()
            if not self._failed:
                return
            if round_ == RESEND_ROUNDS:
                break
            failed = [task_id for task_id in self._journal.unconfirmed() if task_id in self._failed]
            self._tasks.drop_unconfirmed()
            log.warning(
                "client.task.resend", extra={"job_id": self.id, "count": len(failed), "round": round_}
            )
            await self._send_again(failed)
        raise TrubaError(f"job {self.id}: {len(self._failed)} tasks could not be confirmed by any broker")

    async def close(self) -> None:
        """No more tasks: waits until brokers confirmed every task, then tells the scheduler."""
        if self._closed:
            return
        await self._confirm_all()
        self._closed = True
        with map_rpc_errors():
            self._info = await self._client.jobs.CloseJob(
                jobs_pb2.CloseJobRequest(job_id=self.id, submitted=self.submitted)
            )
        log.info("client.job.closed", extra={"job_id": self.id, "submitted": self.submitted})
        # The task pipe stays open: a broker found lost later gets its tasks sent again.

    async def results(self) -> AsyncGenerator[Outcome, None]:
        """Yields one outcome per task, in arrival order, until the job is done.

        An outcome counts as taken when the consumer asks for the next one (or ends the loop
        normally): only then does the journal forget its task. Results are acked in batches
        once their outcomes are taken and forgotten on disk: when no more are at hand, after
        :data:`ACK_BATCH` of them, and when the iteration ends.
        A consumer that stops at an outcome by raising, or by closing the iterator, puts that
        outcome back: it comes again, here or after :meth:`Client.resume`. Ends when the job is
        closed and every submitted task has its outcome; the scheduler then deletes the job's
        queues.

        If the job is cancelled (here or by another client), every task without an outcome
        gets a cancelled one (:attr:`Outcome.cancelled`) and the iteration ends.
        """
        try:
            last_poll = time.monotonic()
            while not self.done and not self._cancelled:
                try:
                    delivery = await self._next_result()
                except PipeClosed:
                    if self._cancelled:  # cancel() closed the pipe under us: cancelled outcomes follow
                        break
                    raise
                if delivery is None:
                    if time.monotonic() - last_poll > STATE_POLL_SECONDS:
                        last_poll = time.monotonic()
                        await self._check_state()
                    continue
                message = delivery.message
                if message.task_id not in self._journal:
                    log.info("client.result.duplicate", extra={"job_id": self.id, "task_id": message.task_id})
                    self._taken.append(delivery)
                    continue
                if self._sizer is not None and not message.gave_up:
                    self._sizer.observe(message.seconds)
                taken = False
                try:
                    yield Outcome.from_message(message)
                    taken = True
                finally:
                    if taken:
                        await self._take(delivery)
                    else:  # the consumer raised or closed us at this outcome: it comes again
                        log.info(
                            "client.result.put_back", extra={"job_id": self.id, "task_id": message.task_id}
                        )
                        with contextlib.suppress(PipeError):
                            await delivery.reject(requeue=True)
        finally:
            await self._ack_taken()
        if self._cancelled:
            for task_id in self._journal.outstanding():
                self._journal.settle(task_id)
                yield Outcome.cancelled_task(task_id)
            return
        await self._finish()

    async def _next_result(self) -> Delivery[ResultMessage] | None:
        """The next result, waiting up to half a second. The results taken are acked first
        unless more members of a frame are at hand (and at most :data:`ACK_BATCH` of them wait)."""
        if self._taken and not (self._unframe is not None and self._unframe.held):
            await self._ack_taken()
        return await self._results.get(0.5)

    async def _take(self, delivery: Delivery[ResultMessage]) -> None:
        """The application took this outcome: the journal forgets its task; its result is
        acked with the next batch (:meth:`_ack_taken`)."""
        self._journal.settle(delivery.message.task_id)
        self._progressed()
        self._taken.append(delivery)
        if len(self._taken) >= ACK_BATCH:
            await self._ack_taken()

    async def _ack_taken(self) -> None:
        """Writes the journal's forget marks of the outcomes taken, then acks their results. A
        crash in between brings those results back as duplicates, which are dropped."""
        if not self._taken:
            return
        self._journal.flush()
        taken, self._taken = self._taken, []
        for delivery in taken:
            await _ack(delivery)

    async def _check_state(self) -> None:
        try:
            info = await self._client.get_job_info(self.id)
        except Unavailable as exc:
            # The data plane does not need the scheduler: keep taking outcomes while it is away.
            log.warning("client.scheduler.unreachable", extra={"job_id": self.id, "error": str(exc)})
            return
        if info.state == jobs_pb2.JOB_STATE_CANCELLED:
            log.info("client.job.cancelled_elsewhere", extra={"job_id": self.id})
            await self._cancelled_locally()
        if info.problem:
            log.warning("client.job.problem", extra={"job_id": self.id, "problem": info.problem})

    async def _finish(self) -> None:
        if self._finished:
            return
        self._finished = True
        await self._stop_progress()
        await self._watch.stop()  # before FinishJob deletes the marker: it must not come back
        # Stop consuming first: the scheduler is about to delete the queue under the consumer.
        await self._results.close()
        with contextlib.suppress(PipeError):
            await self._tasks.close()
        self._info = await self._finish_job()
        await self._drop_journal()
        log.info("client.job.finished", extra={"job_id": self.id, "outcomes": self.received})

    async def _drop_journal(self) -> None:
        """Every task has its outcome (or the job is cancelled): the journal has no more use."""
        await self._journal.close()
        if self._journal.directory is not None:
            shutil.rmtree(self._journal.directory, ignore_errors=True)

    async def _finish_job(self) -> jobs_pb2.Job:
        """FinishJob, retried while the scheduler is unreachable (it may be restarting), for at
        most :data:`FINISH_PATIENCE` seconds; only then does the error reach the caller."""
        deadline = time.monotonic() + FINISH_PATIENCE
        delay = 0.2
        while True:
            try:
                with map_rpc_errors():
                    return await self._client.jobs.FinishJob(jobs_pb2.FinishJobRequest(job_id=self.id))
            except Unavailable as exc:
                if time.monotonic() + delay > deadline:
                    raise
                log.warning(
                    "client.finish.retry", extra={"job_id": self.id, "error": str(exc), "retry_in": delay}
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    def on_result(self, callback: Callable[[Outcome], Awaitable[None] | None]) -> asyncio.Task[None]:
        """Calls ``callback`` for every outcome in the background; returns that task.

        If the callback raises, its outcome is not taken: it is put back (it comes again to the
        next consumer, or after :meth:`Client.resume`), the consumer stops and :meth:`wait`
        raises :class:`CallbackFailed` (with the callback's error as its cause). Call
        ``on_result`` again to go on.
        """

        async def consume() -> None:
            stream = self.results()
            try:
                async for outcome in stream:
                    try:
                        maybe = callback(outcome)
                        if maybe is not None:
                            await maybe
                    except Exception as exc:
                        log.exception(
                            "client.callback_failed", extra={"job_id": self.id, "task_id": outcome.task_id}
                        )
                        raise CallbackFailed(outcome.task_id) from exc
            finally:
                await stream.aclose()

        self._consumer = asyncio.create_task(consume(), name=f"on-result-{self.id}")
        return self._consumer

    async def wait(self) -> None:
        """Waits until the ``on_result`` consumer has delivered every outcome.

        Raises:
            CallbackFailed: the callback raised (its outcome was put back).
        """
        if self._consumer is None:
            raise RuntimeError("wait() needs on_result(); iterate results() otherwise")
        await self._consumer

    async def map(
        self,
        payloads: Iterable[object] | AsyncIterable[object],
        *,
        ordered: bool = True,
        window: int = MAP_WINDOW,
        progress: bool | None = None,
    ) -> AsyncGenerator[Outcome, None]:
        """Submits every payload, closes the job, and yields one outcome per payload.

        Payloads are taken lazily: at most ``window`` tasks are submitted and not yet yielded,
        so memory stays bounded however many there are. With ``ordered`` (the default) outcomes
        come in the order of ``payloads``; otherwise as they arrive. ``progress`` shows a
        progress bar (tqdm, on stderr); by default when stderr is a terminal.

        Raises whatever :meth:`submit` raises for a payload (the tasks submitted before it
        still run; their outcomes are not yielded).
        """
        if window < 1:
            raise ValueError(f"window: must be at least 1, got {window}")
        if progress is None:
            progress = sys.stderr.isatty()
        room = asyncio.Semaphore(window)
        index_of: dict[str, int] = {}
        count: list[int] = []  # set once every payload is submitted

        async def produce() -> None:
            n = 0
            async for payload in _aiter(payloads):
                await room.acquire()
                index_of[await self.submit(payload)] = n
                n += 1
            count.append(n)
            await self.close()

        producer = asyncio.create_task(produce(), name=f"map-{self.id}")
        bar = _progress_bar(progress, self.id, len(payloads) if isinstance(payloads, Sized) else None)
        waiting: dict[int, Outcome] = {}
        next_index = 0
        try:
            async for outcome in _until_done(self.results(), producer):
                index = index_of.pop(outcome.task_id, None)
                if index is None:
                    continue  # a task of an earlier run of this job, not of this map
                if bar is not None:
                    bar.update(1)
                if not ordered:
                    room.release()
                    yield outcome
                    continue
                waiting[index] = outcome
                while next_index in waiting:
                    room.release()
                    yield waiting.pop(next_index)
                    next_index += 1
            await producer  # raises what a submit raised
        finally:
            if not producer.done():
                producer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await producer
            if bar is not None:
                bar.close()

    async def cancel(self) -> None:
        """Cancels the job: the scheduler deletes its queues, and every task without an outcome
        yet gets a cancelled one (``results()`` yields them, then ends).

        This client stops using the job's queues first, so that none of its pipes declares
        them again after the scheduler deleted them. If the scheduler cannot be told (the
        error is raised), the journal is kept: call ``cancel()`` again.
        """
        await self._stop_local()
        with map_rpc_errors():
            self._info = await self._client.jobs.CancelJob(jobs_pb2.CancelJobRequest(job_id=self.id))
        await self._drop_journal()
        log.info("client.job.cancelled", extra={"job_id": self.id, "pending": self.outstanding})

    async def _cancelled_locally(self) -> None:
        """Another client cancelled the job."""
        await self._stop_local()
        await self._drop_journal()

    async def _stop_local(self) -> None:
        """No more work on the job here: reporter, loss watch and pipes stop; outcomes still
        missing become cancelled ones."""
        self._cancelled = True
        self._closed = True
        await self._stop_progress()
        await self._watch.stop()
        with contextlib.suppress(PipeError):
            await self._tasks.close()
        with contextlib.suppress(PipeError):
            await self._results.close()

    async def detach(self) -> None:
        """Stops this client's work on the job and leaves it to :meth:`Client.resume`: the
        journal keeps every task without an outcome; the job goes on in the cluster. Idempotent."""
        if self._detached:
            return
        self._detached = True
        await self._stop_progress()
        await self._watch.stop()
        await self._ack_taken()
        await self._settle_confirms()
        with contextlib.suppress(PipeError):
            await self._tasks.close()
        with contextlib.suppress(PipeError):
            await self._results.close()
        await self._journal.close()

    async def set_importance(self, importance: float) -> None:
        """Changes the job's weight in the fair share; slots move at once.

        Raises:
            InvalidArgument: not a number > 0.
            FailedPrecondition: the job ended.
        """
        with map_rpc_errors():
            self._info = await self._client.jobs.SetImportance(
                jobs_pb2.SetImportanceRequest(job_id=self.id, importance=importance)
            )

    async def watch(self) -> AsyncIterator[jobs_pb2.JobEvent]:
        """The job as the scheduler sees it now, then on every change (state, slots,
        importance, progress) until it ends. Slow readers see changes coalesced, never stale."""
        call = self._client.jobs.WatchJob(jobs_pb2.WatchJobRequest(job_id=self.id))
        try:
            with map_rpc_errors():
                async for event in call:
                    self._info = event.job
                    yield event
        finally:
            call.cancel()

    async def info(self) -> jobs_pb2.Job:
        """The scheduler's current view of the job."""
        self._info = await self._client.get_job_info(self.id)
        return self._info


async def _ack(delivery: Delivery[ResultMessage]) -> None:
    # The result's channel may be gone: the broker then delivers it again, and it is dropped
    # as a duplicate (its task is no longer in the journal).
    with contextlib.suppress(PipeError):
        await delivery.ack()


async def _aiter(items: Iterable[object] | AsyncIterable[object]) -> AsyncIterator[object]:
    if isinstance(items, AsyncIterable):
        async for item in items:
            yield item
    else:
        for item in items:
            yield item


async def _until_done(
    outcomes: AsyncGenerator[Outcome, None], producer: asyncio.Task[None]
) -> AsyncGenerator[Outcome, None]:
    """``outcomes``, but raises the producer's error as soon as it fails (the job then never
    gets closed, so ``outcomes`` alone would not end)."""
    try:
        while True:
            step = asyncio.ensure_future(anext(outcomes))
            if not producer.done():
                await asyncio.wait([step, producer], return_when=asyncio.FIRST_COMPLETED)
                if not step.done() and producer.exception() is not None:
                    step.cancel()
                    with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                        await step
                    raise producer.exception()  # type: ignore[misc]
            try:
                outcome = await step
            except StopAsyncIteration:
                return
            yield outcome
    finally:
        await outcomes.aclose()


def _error_of(confirmation: Confirmation) -> BaseException:
    return asyncio.CancelledError() if confirmation.cancelled() else confirmation.exception() or Exception()


def _progress_bar(show: bool, job_id: str, total: int | None) -> tqdm[NoReturn] | None:
    return tqdm(desc=f"job {job_id}", total=total, unit="task", file=sys.stderr) if show else None
