"""One job on one daemon: workers that follow the task life on the daemon's slots.

The runner composes the parts, each in its own module:

- :mod:`truba.daemon.crew`: the workers, how many stay (``target``, the slots the scheduler
  assigned), which leave and which are interrupted (preemption), and why they all stop;
- :mod:`truba.daemon.intake`: how workers get deliveries (one, chunks of short tasks from a
  frame, batches), the prefetch window, frame members handed back when held too long;
- :mod:`truba.daemon.execution`: the task life on a slot, one path for single tasks, chunks and
  batches (:mod:`truba.daemon.handover`): admit, run one attempt, end each task, recycle the slot;
- :mod:`truba.daemon.returns`: tasks that leave without a result (put back, given up), and
  consuming stopped before anything goes back when the job leaves this daemon;
- :mod:`truba.daemon.task_endings`: each end published, confirmed, then acked, in the background (at
  most ``target`` times :data:`ENDS_PER_SLOT` ends wait per runner).

A batch handler (:mod:`truba.handlers`) gets up to ``max_size`` tasks per call on one slot
(:mod:`truba.daemon.batching`): the runner learns it by asking a slot to describe the handler
before its first task, and then holds up to ``slots * max_size`` deliveries (the window).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable

from truba import trace
from truba.daemon.crew import Crew, Worker
from truba.daemon.execution import Execution
from truba.daemon.intake import HOLD_LIMIT, Intake
from truba.daemon.job_pipes import JobPipes
from truba.daemon.metrics import JobMeter
from truba.daemon.returns import CANCEL_QUIET, Returns
from truba.daemon.settings import JobSettings
from truba.daemon.shutdown import pending_stacks
from truba.daemon.slot_process import SlotProcess
from truba.daemon.spans import JobSpans
from truba.daemon.stats import JobStats
from truba.daemon.supervise import Ending, Limits, supervised
from truba.daemon.task_endings import TaskEndings
from truba.daemon.task_events import TaskEvents
from truba.daemon.terms import JobTerms, SlotPolicy
from truba.handlers import BatchSpec
from truba.logs import bind
from truba.pipes.errors import PipeClosed, PipeError
from truba.pipes.prefetch import Window

__all__ = ["ENDS_PER_SLOT", "JobRunner", "SlotPolicy"]

log = logging.getLogger(__name__)
ENDS_PER_SLOT = 64
"""Ends (results, requeues) a worker may leave awaiting their confirm before it waits: enough for
a frame of results to form while the previous one is confirmed. Without frames the prefetch
window bounds them anyway (an unacked delivery holds its place in it)."""


class JobRunner:
    """Runs one job's tasks on some of the daemon's slots; see the module docstring.

    ``release`` gives a slot back to the daemon's pool when its worker leaves. ``failure`` holds
    the pipe error that stopped the runner (its owner reopens it).
    """

    def __init__(
        self,
        job_id: str,
        handler: str,
        daemon_id: str,
        pipes: JobPipes,
        release: Callable[[SlotProcess], None],
        *,
        target: int = 0,
        settings: JobSettings | None = None,
        stats: JobStats | None = None,
        policy: SlotPolicy | None = None,
        window: Window | None = None,
        stop_timeout: float = 5.0,
        cancel_quiet: float = CANCEL_QUIET,
        hold_limit: float = HOLD_LIMIT,
        spans: JobSpans | None = None,
        meter: JobMeter | None = None,
    ) -> None:
        """``meter``: the job's metrics on this daemon (None: none)."""
        self.job_id = job_id
        self.daemon_id = daemon_id
        self.pipes = pipes
        self.release = release
        self.stats = stats or JobStats()
        self.window = window or Window(1)
        self.stop_timeout = stop_timeout
        self.terms = JobTerms(handler, settings or JobSettings(), policy or SlotPolicy())
        self.crew = Crew(target, job_id)
        self.events = TaskEvents(meter)
        self.ends = TaskEndings(pipes, daemon_id, self.stats, self.crew.broke, self.events)
        self.returns = Returns(
            job_id,
            pipes.tasks,
            self.ends,
            self.terms,
            self.crew.broke,
            stop_timeout=stop_timeout,
            cancel_quiet=cancel_quiet,
        )
        self.returns.window = self.window  # widened while tasks wait out a retry backoff
        self.intake = Intake(
            job_id,
            pipes.tasks,
            pipes.task_frames,
            self.window,
            self.crew,
            self.returns,
            hold_limit=hold_limit,
        )
        self.execution = Execution(
            self.terms,
            self.crew,
            self.stats,
            self.ends,
            self.returns,
            daemon_id,
            spans,
            self.events,
        )
        self._specs: dict[str, BatchSpec | None] = {}
        """What a slot said about each handler this runner ran (None: one task at a time)."""

    # -- what the daemon steers -----------------------------------------------------------------

    @property
    def handler(self) -> str:
        return self.terms.handler

    @handler.setter
    def handler(self, handler: str) -> None:
        self.terms.handler = handler

    @property
    def settings(self) -> JobSettings:
        return self.terms.settings

    @property
    def policy(self) -> SlotPolicy:
        return self.terms.policy

    @property
    def target(self) -> int:
        return self.crew.target

    @property
    def failure(self) -> PipeError | None:
        """The pipe error that stopped the runner (its owner reopens it)."""
        return self.crew.failure

    @property
    def active(self) -> int:
        """Workers holding a slot (leaving ones included until they let go)."""
        return len(self.crew.workers)

    @property
    def per_slot(self) -> int:
        """Deliveries one slot needs at hand: a batch handler's ``max_size``, else 1 (also while
        no slot has described the handler yet)."""
        spec = self._specs.get(self.terms.handler)
        return spec.max_size if spec is not None else 1

    @property
    def staying(self) -> int:
        return self.crew.staying

    def add_worker(self, slot: SlotProcess) -> None:
        self.intake.watch_held()
        worker = Worker(slot)
        task = asyncio.create_task(self._work(worker), name=f"worker-{self.job_id}-{slot.index}")
        self.crew.workers[worker] = task

    def resize(
        self, target: int, settings: JobSettings | None = None, *, immediate: bool | None = None
    ) -> None:
        """Follows a new slot count: idle workers over it leave now, busy ones per preemption.

        ``immediate`` overrides the job's preemption setting and its grace (a drain never
        interrupts; its own timeout bounds it).
        """
        if settings is not None:
            self.terms.settings = settings
        if target == 0:
            self.returns.stop_taking()  # the job leaves this daemon: before anything goes back to its queue
        if immediate is None:
            self.crew.resize(target, self.terms.settings.immediate, self.terms.settings.preemption_grace)
        else:
            self.crew.resize(target, immediate)

    def stop_now(self) -> None:
        """Interrupts every running task (they go back to their queue unspent) and closes."""
        self.crew.stop_now()
        self.returns.stop_taking()

    async def close(self) -> None:
        """Lets workers leave (after their task unless :meth:`stop_now`), then closes the pipes.

        Every end already published is confirmed and acked first; after :meth:`stop_now` that
        wait is bounded by ``stop_timeout`` (what is left unacked goes back to the broker).
        """
        self.crew.closing = True
        self.returns.stop_taking()
        await self.intake.stop_watching()
        self.crew.wake_idle()
        if self.crew.workers:
            await self._unless_stuck(
                "workers", asyncio.gather(*self.crew.workers.values(), return_exceptions=True)
            )
        await self._unless_stuck("put_back", self.returns.put_back_done())
        await self._unless_stuck("hand_back", self.returns.hand_back_unstarted())
        await self._unless_stuck("confirms", self.ends.wait(0))  # every end in flight
        await self.pipes.close()
        log.info("daemon.job.closed", extra={"job_id": self.job_id, "stats": dataclasses.asdict(self.stats)})

    async def _unless_stuck(self, step: str, awaitable: Awaitable[object]) -> None:
        """Awaits a step of :meth:`close`; once stopping now, for at most ``stop_timeout`` more.

        A step still waiting then (a result or a put-back retried while every broker is down)
        is cancelled and logged with where every task waits: its deliveries stay unacked, so
        the broker redelivers them, and the daemon exits instead of waiting for brokers that
        may not come back.
        """
        task = asyncio.ensure_future(awaitable)
        stopping_since: float | None = None
        try:
            while not (await asyncio.wait({task}, timeout=0.25))[0]:
                if not self.crew.now:
                    continue
                stopping_since = stopping_since or time.monotonic()
                if time.monotonic() - stopping_since > self.stop_timeout:
                    log.warning(
                        "daemon.job.stuck_on_close",
                        extra={
                            "job_id": self.job_id,
                            "step": step,
                            "stop_timeout": self.stop_timeout,
                            "pending": pending_stacks(exclude=task),
                        },
                    )
                    task.cancel()
                    await asyncio.wait({task}, timeout=1.0)
                    if task.done() and not task.cancelled():
                        task.exception()  # retrieved (a cancelled gather ends with one): not logged
                    return
        except asyncio.CancelledError:
            task.cancel()
            raise
        await task

    # -- the workers ----------------------------------------------------------------------------

    async def _work(self, worker: Worker) -> None:
        """A worker's life: take deliveries and run them on its slot until it leaves."""
        crew, intake, execution = self.crew, self.intake, self.execution
        with bind(job_id=self.job_id, slot=worker.slot.index, daemon_id=self.daemon_id):
            log.debug("daemon.worker.started", extra={"handler": self.terms.handler})
            try:
                await worker.slot.prepare(self.terms.handler)
                while not crew.leaves(worker):
                    if self.terms.handler not in self._specs and not await self._describe(worker):
                        continue
                    spec = self._specs[self.terms.handler]
                    delivery = await intake.take(worker)
                    if delivery is None:
                        continue
                    if trace.enabled:
                        trace.mark("daemon.taken", delivery.message.task_id)
                    if spec is None:
                        more = await intake.take_more(worker, execution.task_seconds)
                        if more:
                            self._hold_results(worker, True)
                            await execution.run_chunk(worker, [delivery, *more])
                        else:
                            await execution.run_one(worker, delivery)
                        self._hold_results(worker, bool(more) and intake.holds_members)
                        limit = max(1, crew.target) * ENDS_PER_SLOT
                    else:
                        batch = await intake.collect(worker, delivery, spec)
                        await execution.run_batch(worker, batch)
                        limit = max(1, crew.target) * max(spec.max_size, ENDS_PER_SLOT)
                    if not crew.going(worker):  # a leaving worker frees its slot at once
                        await self.ends.wait(limit)  # backpressure on confirms
            except PipeClosed:
                pass
            except PipeError as exc:
                crew.broke(exc)
                log.warning("daemon.worker.pipe_failed", extra={"error": repr(exc)})
            except Exception:
                log.exception("daemon.worker.crashed")
                raise
            finally:
                log.debug("daemon.worker.left")
                if crew.failure is None:  # the slot leaves the job (a broken pipe reopens it instead)
                    execution.spans.slot_taken(worker.slot.index)
                self._hold_results(worker, False)
                del crew.workers[worker]
                self.release(worker.slot)

    def _hold_results(self, worker: Worker, hold: bool) -> None:
        """A worker running chunks of short tasks, with more in hand, holds results back from
        going out alone: the chunks' results then share frames (up to the frames' max_delay).
        Released when its chunks run out, so a lone task's result goes at once."""
        frames = self.pipes.result_frames
        if frames is None or worker.holds_results == hold:
            return
        worker.holds_results = hold
        if hold:
            frames.hold()
        else:
            frames.release()

    async def _describe(self, worker: Worker) -> bool:
        """Asks the worker's slot whether the handler is a batch handler; False if interrupted.

        This imports the handler, as its first task would, under the same limits. A slot that
        dies or hangs on it makes the handler a one-task one: its tasks then meet the same fate
        one by one and spend attempts as usual.
        """
        handler = self.terms.handler
        limits = Limits(self.terms.settings.task_timeout, self.terms.policy.memory_hard)
        worker.interrupt.clear()
        describing = worker.slot.describe(handler)
        end, spec = await supervised(worker.slot, describing, limits, worker.interrupt, what="batch")
        if end.ending is Ending.INTERRUPTED:
            return False
        self._specs[handler] = spec
        log.info(
            "daemon.job.described",
            extra={"max_size": spec.max_size if spec else None, "how": end.ending.value},
        )
        if spec is not None:
            with contextlib.suppress(PipeError):  # a leaf gone under the resize applies it on reopen
                await self.window.resize(max(self.window.size, max(1, self.crew.target) * spec.max_size))
        return True
