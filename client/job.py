"""A job seen from the client: submit tasks, close, and take one outcome per task.

Tasks go out through the job's task pipe (serialize → balance over brokers); each stays in memory
until its outcome arrives, and one whose confirm failed is sent again at ``close``. Outcomes come
in through the result pipe (merge of brokers → deserialize), are deduplicated by task id (a task
may run twice when a daemon dies after sending its result), and each result message is acked only
after the application has taken its outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import secrets
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import TYPE_CHECKING

from truba.client.errors import SchedulerError, Unavailable, map_rpc_errors
from truba.client.outcome import Outcome
from truba.pipes.base import Confirmation, Listener, Sender
from truba.pipes.errors import PipeClosed, PipeError, TrubaError
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


class Job:
    """One job: ``submit`` tasks, ``close`` it, iterate its ``results()``.

    Not safe to share between event loops; use one ``results()``/``on_result`` consumer.
    """

    def __init__(
        self,
        client: Client,
        info: jobs_pb2.Job,
        tasks: Sender[TaskMessage],
        results: Listener[ResultMessage],
    ) -> None:
        self._client = client
        self._info = info
        self._tasks = tasks
        self._results = results
        self._prefix = secrets.token_hex(3)
        self._counter = itertools.count()
        self._pending: dict[str, TaskMessage] = {}
        self._confirmations: dict[str, Confirmation] = {}
        self._seen: set[str] = set()
        self._submitted = 0
        self._closed = False
        self._finished = False
        self._cancelled = False
        self._consumer: asyncio.Task[None] | None = None
        self._progress_wake = asyncio.Event()
        self._progress: asyncio.Task[None] | None = None

    @property
    def id(self) -> str:
        """The job's id, as the scheduler knows it."""
        return self._info.id

    @property
    def handler(self) -> str:
        return self._info.handler

    @property
    def submitted(self) -> int:
        """Tasks submitted so far."""
        return self._submitted

    @property
    def received(self) -> int:
        """Distinct outcomes received so far."""
        return len(self._seen)

    @property
    def done(self) -> bool:
        """Closed, and every submitted task has its outcome."""
        return self._closed and len(self._seen) >= self._submitted

    async def submit(self, payload: object, *, priority: int | None = None) -> str:
        """Sends one task; returns its id once a broker accepted it for sending.

        Args:
            priority: 0 (the default) to 9, higher taken first; only for a job created with
                ``priorities=True``.

        Raises:
            ValueError: a priority on a job without priorities, or out of range (nothing sent).
            PipeClosed: the job was closed.
            CodecError: ``payload`` is not msgpack-serializable.
            MessageTooLarge: ``payload`` is over the client's ``max_payload`` (nothing was sent).
            PipeBroken: no broker can take the task.
        """
        if self._closed:
            raise PipeClosed(f"job {self.id} is closed: no more tasks")
        if priority is not None:
            if not self._info.settings.priorities:
                raise ValueError(f"priority: job {self.id} was created without priorities=True")
            if not 0 <= priority <= MAX_PRIORITY:
                raise ValueError(f"priority: must be 0..{MAX_PRIORITY}, got {priority}")
        task_id = f"{self._prefix}-{next(self._counter)}"
        message = TaskMessage(task_id, payload, priority=priority or 0)
        confirmation = await self._tasks.send(message)
        self._confirmations[task_id] = confirmation
        confirmation.add_done_callback(functools.partial(self._on_confirm, task_id))
        self._pending[task_id] = message
        self._submitted += 1
        self._progressed()
        log.debug("client.task.submitted", extra={"job_id": self.id, "task_id": task_id})
        return task_id

    def _progressed(self) -> None:
        """Submitted or received changed: the reporter tells the scheduler soon (coalesced)."""
        self._progress_wake.set()
        if self._progress is None:
            self._progress = asyncio.create_task(self._report_progress(), name=f"progress-{self.id}")

    async def _report_progress(self) -> None:
        """Reports (submitted, received) at most every :data:`PROGRESS_INTERVAL` seconds.

        The scheduler sizes the job's share by these counts; an unreachable scheduler only
        delays the report (the data plane does not need it), an ended job stops the reporter.
        """
        last = (-1, -1)
        while True:
            await self._progress_wake.wait()
            self._progress_wake.clear()
            now = (self._submitted, len(self._seen))
            if now != last:
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

    def _on_confirm(self, task_id: str, confirmation: Confirmation) -> None:
        # Confirmed tasks need no more watching; failed ones stay for _confirm_all to resend.
        if not confirmation.cancelled() and confirmation.exception() is None:
            if self._confirmations.get(task_id) is confirmation:
                del self._confirmations[task_id]

    async def _confirm_all(self) -> None:
        """Waits for every confirm, sending again (bounded) what a broker nacked or lost."""
        for round_ in range(RESEND_ROUNDS):
            waiting = dict(self._confirmations)
            self._confirmations.clear()
            failed: list[str] = []
            for task_id, confirmation in waiting.items():
                try:
                    await confirmation
                except PipeError as exc:
                    log.warning("client.task.unconfirmed", extra={"task_id": task_id, "error": repr(exc)})
                    failed.append(task_id)
            if not failed:
                return
            self._tasks.drop_unconfirmed()
            log.warning(
                "client.task.resend", extra={"job_id": self.id, "count": len(failed), "round": round_}
            )
            for task_id in failed:
                confirmation = await self._tasks.send(self._pending[task_id])
                self._confirmations[task_id] = confirmation
                confirmation.add_done_callback(functools.partial(self._on_confirm, task_id))
        raise TrubaError(
            f"job {self.id}: {len(self._confirmations)} tasks could not be confirmed by any broker"
        )

    async def close(self) -> None:
        """No more tasks: waits until brokers confirmed every task, then tells the scheduler."""
        if self._closed:
            return
        await self._confirm_all()
        self._closed = True
        with map_rpc_errors():
            self._info = await self._client.jobs.CloseJob(
                jobs_pb2.CloseJobRequest(job_id=self.id, submitted=self._submitted)
            )
        log.info("client.job.closed", extra={"job_id": self.id, "submitted": self._submitted})
        await self._tasks.close()

    async def results(self) -> AsyncIterator[Outcome]:
        """Yields one outcome per task, in arrival order, until the job is done.

        The result message is acked when the consumer asks for the next outcome, so an outcome
        the application has not taken is never lost. Ends when the job is closed and every
        submitted task has its outcome; the scheduler then deletes the job's queues.

        If the job is cancelled (here or by another client), every task without an outcome
        gets a cancelled one (:attr:`Outcome.cancelled`) and the iteration ends.
        """
        last_poll = time.monotonic()
        while not self.done and not self._cancelled:
            try:
                delivery = await self._results.get(0.5)
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
            if message.task_id in self._seen:
                log.info("client.result.duplicate", extra={"job_id": self.id, "task_id": message.task_id})
                await delivery.ack()
                continue
            self._seen.add(message.task_id)
            self._pending.pop(message.task_id, None)
            self._progressed()
            yield Outcome.from_message(message)
            await delivery.ack()
        if self._cancelled:
            for task_id in list(self._pending):
                if task_id not in self._seen:
                    self._seen.add(task_id)
                    del self._pending[task_id]
                    yield Outcome.cancelled_task(task_id)
            return
        await self._finish()

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
        # Stop consuming first: the scheduler is about to delete the queue under the consumer.
        await self._results.close()
        self._info = await self._finish_job()
        # Every task has its outcome: nothing in the spool can matter any more.
        shutil.rmtree(self._client.spool_path(self.id), ignore_errors=True)
        log.info("client.job.finished", extra={"job_id": self.id, "outcomes": len(self._seen)})

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

        A callback that raises is logged with its traceback; the outcome counts as taken.
        """

        async def consume() -> None:
            async for outcome in self.results():
                try:
                    maybe = callback(outcome)
                    if maybe is not None:
                        await maybe
                except Exception:
                    log.exception(
                        "client.callback_failed", extra={"job_id": self.id, "task_id": outcome.task_id}
                    )

        self._consumer = asyncio.create_task(consume())
        return self._consumer

    async def wait(self) -> None:
        """Waits until the ``on_result`` consumer has delivered every outcome."""
        if self._consumer is None:
            raise RuntimeError("wait() needs on_result(); iterate results() otherwise")
        await self._consumer

    async def map(self, payloads: Iterable[object]) -> list[Outcome]:
        """Submits every payload, closes the job and returns outcomes in submission order."""
        order = {await self.submit(p): i for i, p in enumerate(payloads)}
        await self.close()
        outcomes: list[Outcome | None] = [None] * len(order)
        async for outcome in self.results():
            index = order.get(outcome.task_id)
            if index is not None:
                outcomes[index] = outcome
        return [o for o in outcomes if o is not None]

    async def cancel(self) -> None:
        """Cancels the job: the scheduler deletes its queues, and every task without an outcome
        yet gets a cancelled one (``results()`` yields them, then ends)."""
        await self._stop_progress()
        with map_rpc_errors():
            self._info = await self._client.jobs.CancelJob(jobs_pb2.CancelJobRequest(job_id=self.id))
        await self._cancelled_locally()
        log.info("client.job.cancelled", extra={"job_id": self.id, "pending": len(self._pending)})

    async def _cancelled_locally(self) -> None:
        self._cancelled = True
        self._closed = True
        await self._stop_progress()
        with contextlib.suppress(PipeError):
            await self._tasks.close()
        with contextlib.suppress(PipeError):
            await self._results.close()
        shutil.rmtree(self._client.spool_path(self.id), ignore_errors=True)

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
