"""One job on one daemon: its pipes and the workers that follow the task life.

Task life: get a task → compute it in a slot → send the result → wait for the result's confirm →
ack the task. The last two steps run in the background, so a slot computes the next task while
the broker confirms the previous result (at most ``target`` results wait per runner). A daemon
killed anywhere in between loses nothing: the broker redelivers the unacked task, and the client
deduplicates results by task id.

The number of workers follows ``target`` (slots the scheduler assigned). Shrinking is graceful:
a worker leaves after its current task and gives its slot back to the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from truba.daemon.slots import SlotDied, SlotProcess
from truba.logs import bind
from truba.pipes.base import Confirmation, Delivery, Listener, Sender
from truba.pipes.errors import PipeBroken, PipeClosed, PipeError
from truba.pipes.prefetch import Window
from truba.wire import ErrorInfo, ResultMessage, TaskMessage

log = logging.getLogger(__name__)
GET_TIMEOUT = 0.5


@dataclass
class JobStats:
    """Counters a daemon reports to the scheduler for one job."""

    done: int = 0
    failed: int = 0
    busy: int = 0


@dataclass
class JobRunner:
    """Runs one job's tasks on some of the daemon's slots.

    ``tasks`` and ``results`` are the job's built pipes; ``release`` gives a slot back to the
    daemon's pool when a worker leaves. ``failure`` holds the pipe error that stopped the runner
    (its owner reopens it).
    """

    job_id: str
    handler: str
    daemon_id: str
    tasks: Listener[TaskMessage]
    results: Sender[ResultMessage]
    release: Callable[[SlotProcess], None]
    target: int = 0
    window: Window = field(default_factory=lambda: Window(1))
    stats: JobStats = field(default_factory=JobStats)
    failure: PipeError | None = None
    _workers: set[asyncio.Task[None]] = field(default_factory=set)
    _settling: set[asyncio.Task[None]] = field(default_factory=set)
    _closing: bool = False

    @property
    def active(self) -> int:
        return len(self._workers)

    @property
    def idle(self) -> bool:
        return not self._workers

    def add_worker(self, slot: SlotProcess) -> None:
        worker = asyncio.create_task(self._work(slot), name=f"worker-{self.job_id}-{slot.index}")
        self._workers.add(worker)
        worker.add_done_callback(self._workers.discard)

    def _should_leave(self) -> bool:
        return self._closing or self.failure is not None or self.active > self.target

    async def _work(self, slot: SlotProcess) -> None:
        with bind(job_id=self.job_id, slot=slot.index):
            log.info("daemon.worker.started", extra={"handler": self.handler})
            try:
                while not self._should_leave():
                    delivery = await self.tasks.get(GET_TIMEOUT)
                    if delivery is None:
                        continue
                    await self._run_task(slot, delivery.message, delivery)
            except PipeClosed:
                pass
            except PipeError as exc:
                if self.failure is None:
                    self.failure = exc
                log.warning("daemon.worker.pipe_failed", extra={"error": repr(exc)})
            finally:
                log.info("daemon.worker.left")
                self.release(slot)

    async def _run_task(self, slot: SlotProcess, task: TaskMessage, delivery: Delivery[TaskMessage]) -> None:
        with bind(task_id=task.task_id):
            log.debug("daemon.task.received", extra={"redelivered": delivery.redelivered})
            self.stats.busy += 1
            try:
                reply = await slot.run(self.handler, task.task_id, task.payload)
            except SlotDied as exc:
                log.warning("daemon.task.slot_died", extra={"error": str(exc)})
                await _settle(delivery.reject(requeue=True))
                return
            finally:
                self.stats.busy -= 1
            result = ResultMessage(
                task.task_id, reply.ok, reply.value, reply.error, self.daemon_id, reply.seconds
            )
            try:
                confirmation = await self.results.send(result)
            except PipeError as exc:
                if exc.retryable or isinstance(exc, PipeClosed):
                    raise
                # The result itself cannot be sent (e.g. too large): report that as the outcome.
                error = ErrorInfo(type(exc).__name__, f"result could not be sent: {exc}")
                result = ResultMessage(task.task_id, False, None, error, self.daemon_id, reply.seconds)
                confirmation = await self.results.send(result)
            # The slot is free now: the confirm is awaited, and the task acked, in the background.
            settling = asyncio.create_task(self._ack_when_confirmed(confirmation, delivery, reply.ok))
            self._settling.add(settling)
            settling.add_done_callback(self._settling.discard)
            while len(self._settling) > max(1, self.target):
                await asyncio.wait(set(self._settling), return_when=asyncio.FIRST_COMPLETED)

    async def _ack_when_confirmed(
        self, confirmation: Confirmation, delivery: Delivery[TaskMessage], ok: bool
    ) -> None:
        """The end of a task's life: its result is confirmed, then the task is acked."""
        started = time.perf_counter()
        try:
            await confirmation
        except PipeError as exc:
            log.warning("daemon.result.unconfirmed", extra={"error": repr(exc)})
            await _settle(delivery.reject(requeue=True))
            if isinstance(exc, PipeBroken) and self.failure is None:
                self.failure = exc
            return
        log.debug("daemon.result.confirmed", extra={"confirm_seconds": time.perf_counter() - started})
        if ok:
            self.stats.done += 1
        else:
            self.stats.failed += 1
        await _settle(delivery.ack())
        log.debug("daemon.task.acked", extra={"ok": ok})

    async def close(self) -> None:
        """Stops the workers (after their current task) and closes the pipes."""
        self._closing = True
        if self._workers:
            await asyncio.gather(*self._workers, return_exceptions=True)
        if self._settling:
            await asyncio.gather(*self._settling, return_exceptions=True)
        with contextlib.suppress(PipeError):
            await self.tasks.close()
        with contextlib.suppress(PipeError):
            await self.results.close()


async def _settle(action: Awaitable[None]) -> None:
    """Acks/rejects; a dead channel means the broker has already requeued the task."""
    try:
        await action
    except PipeError as exc:
        log.info("daemon.task.settle_dropped", extra={"error": repr(exc)})
