"""One job on one daemon: workers that follow the task life on the daemon's slots.

Task life: get a delivery → admit it (attempts spent so far, :mod:`truba.daemon.attempts`) →
run one attempt in a slot under its limits (:mod:`truba.daemon.supervise`) → end it
(:mod:`truba.daemon.ends`): result, requeue or give-up, published and confirmed, then acked.
The confirm and the ack run in the background while the slot takes the next task (at most
``target`` ends wait per runner).

The number of workers follows ``target`` (slots the scheduler assigned). Idle workers leave at
once when it drops. Busy workers leave after their task (graceful preemption), or, for a job
with immediate preemption, are interrupted: the slot is killed and restarted, the task goes back
to its queue without spending an attempt, and the slot is free within milliseconds.

A batch handler (:mod:`truba.handlers`) gets up to ``max_size`` tasks per call on one slot
(:mod:`truba.daemon.batching`): the runner learns it by asking a slot to describe the handler
before its first task, and then holds up to ``slots * max_size`` deliveries (the window).

Frames (:mod:`truba.pipes.frame`): the members of a task frame are handed to whichever workers
ask, so a frame spreads over the free slots. When members have waited ``hold_limit`` seconds and
no worker has taken a task for as long (every slot is busy with a long one), they are handed
back to the queue, unspent, for another daemon to run (late binding: a frame of long tasks must
not keep one daemon's work from another's idle slots; members of short tasks keep flowing to
this daemon's slots and are not sent around).

After a task a slot is recycled (replaced by a fresh process) when it ran ``max_tasks`` tasks or
its private memory passed the soft limit; a slot passing the hard limit during a task is killed
and the attempt spent.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from truba.daemon.attempts import LOST, Verdict, admit, after_failure
from truba.daemon.batching import collect
from truba.daemon.ends import JobPipes, TaskEnds
from truba.daemon.settings import JobSettings
from truba.daemon.slots import SlotProcess
from truba.daemon.stats import JobStats
from truba.daemon.supervise import MIB, AttemptEnd, Ending, Interrupt, Limits, run_attempt, supervised
from truba.handlers import BatchSpec
from truba.logs import bind
from truba.pipes.base import Delivery
from truba.pipes.errors import PipeClosed, PipeError
from truba.pipes.frame import unframing
from truba.pipes.prefetch import Window
from truba.wire import ErrorInfo, ResultMessage, TaskMessage

log = logging.getLogger(__name__)
GET_TIMEOUT = 0.5
ENDS_PER_SLOT = 64
"""Ends (results, requeues) a worker may leave awaiting their confirm before it waits: enough for
a frame of results to form while the previous one is confirmed. Without frames the prefetch
window bounds them anyway (an unacked delivery holds its place in it)."""
CHUNK = 8
"""Tasks of a frame a worker hands its slot in one write when they are short (see _take_more):
one wake-up of the slot process for several tasks instead of one each."""
CHUNK_BELOW = 0.002
"""Tasks are short when their handler time averages under this (seconds, recent tasks)."""
HOLD_LIMIT = 0.1
"""Seconds members of a frame may wait for a slot of this runner before they go back to the
queue (see the module docstring)."""
CANCEL_QUIET = 0.03
"""Seconds without acks before basic.cancel. A quorum queue returns what it had already sent
towards a consumer that is cancelled (not yet on the wire to us): such a task comes back marked
redelivered with ``x-delivery-count`` raised, so its next daemon counts an attempt it never
ran. Each ack gives the consumer credit for one more delivery; with acks held back, what is on
its way arrives (and is handed back unspent) and nothing more is sent before the cancel. A
round trip to the broker must fit in it (local network)."""


@dataclass(frozen=True)
class SlotPolicy:
    """When a slot is replaced: after ``max_tasks`` tasks, or over ``memory_soft`` bytes after a
    task; ``memory_hard`` bytes kill it during a task (None: no such limit)."""

    max_tasks: int | None = None
    memory_soft: int | None = None
    memory_hard: int | None = None


@runtime_checkable
class StopsConsuming(Protocol):
    """A listener that can stop new deliveries while those it holds stay gettable and settleable.

    With it, a runner that closes hands back the deliveries it holds but never started by
    publishing them again, unspent; without it, closing the listener returns them to the broker,
    which marks them redelivered, and their next daemon counts an attempt.
    """

    async def cancel(self) -> None: ...


@dataclass(eq=False)
class Worker:
    """One slot lent to the job, and the state the runner steers it by."""

    slot: SlotProcess
    busy: bool = False
    leaving: bool = False
    started_at: float = 0.0
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    interrupt: Interrupt = field(default_factory=Interrupt)
    holds_results: bool = False
    """Its results wait for frames instead of going out alone (see :meth:`JobRunner._hold_results`)."""


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
    ) -> None:
        self.job_id = job_id
        self.handler = handler
        self.daemon_id = daemon_id
        self.pipes = pipes
        self.release = release
        self.target = target
        self.settings = settings or JobSettings()
        self.stats = stats or JobStats()
        self.policy = policy or SlotPolicy()
        self.window = window or Window(1)
        self.stop_timeout = stop_timeout
        self.cancel_quiet = cancel_quiet
        self.hold_limit = hold_limit
        self._holding: asyncio.Task[None] | None = None
        """Hands back frame members that wait too long (started with the first worker)."""
        self._took_at = time.monotonic()
        """When a worker last took a task (see _watch_held)."""
        self._frames = unframing(pipes.tasks)
        """The unframe layer of the task listener (None: not a framing stack)."""
        self._quit_holding = asyncio.Event()
        """Stops that watcher between two hand-backs (cancelling it could cut one in half)."""
        self._task_seconds: float | None = None
        """Recent handler seconds per task (an EWMA; None until a task ended)."""
        self.failure: PipeError | None = None
        self.ends = TaskEnds(pipes, daemon_id, self.stats, self._broke)
        self._workers: dict[Worker, asyncio.Task[None]] = {}
        self._idle = 0
        """Workers waiting for a delivery right now."""
        self._closing = False
        self._now = False
        self._stopping: asyncio.Future[None] | None = None
        self._putting_back: set[asyncio.Task[None]] = set()
        """Interrupted tasks on their way back to the queue (their slot is free already)."""
        self._specs: dict[str, BatchSpec | None] = {}
        """What a slot said about each handler this runner ran (None: one task at a time)."""

    # -- what the daemon steers -----------------------------------------------------------------

    @property
    def active(self) -> int:
        """Workers holding a slot (leaving ones included until they let go)."""
        return len(self._workers)

    @property
    def per_slot(self) -> int:
        """Deliveries one slot needs at hand: a batch handler's ``max_size``, else 1 (also while
        no slot has described the handler yet)."""
        spec = self._specs.get(self.handler)
        return spec.max_size if spec is not None else 1

    @property
    def staying(self) -> int:
        return sum(1 for w in self._workers if not w.leaving)

    def add_worker(self, slot: SlotProcess) -> None:
        if self._holding is None and self._frames is not None:
            self._holding = asyncio.create_task(self._watch_held(), name=f"held-{self.job_id}")
        worker = Worker(slot)
        task = asyncio.create_task(self._work(worker), name=f"worker-{self.job_id}-{slot.index}")
        self._workers[worker] = task

    def resize(
        self, target: int, settings: JobSettings | None = None, *, immediate: bool | None = None
    ) -> None:
        """Follows a new slot count: idle workers over it leave now, busy ones per preemption.

        ``immediate`` overrides the job's preemption setting (a drain never interrupts).
        """
        self.target = target
        if settings is not None:
            self.settings = settings
        if target == 0:
            self._stop_taking()  # the job leaves this daemon: before anything goes back to its queue
        interrupt = self.settings.immediate if immediate is None else immediate
        excess = self.staying - target
        if excess <= 0:
            return
        staying = [w for w in self._workers if not w.leaving]
        for worker in [w for w in staying if not w.busy][:excess]:
            worker.leaving = True
            worker.wake.set()
            excess -= 1
        if excess > 0 and interrupt:
            # Interrupt the most recently started tasks: they lose the least work.
            busy = sorted((w for w in staying if w.busy), key=lambda w: w.started_at, reverse=True)
            for worker in busy[:excess]:
                worker.leaving = True
                worker.interrupt.set()
        # Graceful: whichever busy worker finishes first leaves (see _leaves).

    def stop_now(self) -> None:
        """Interrupts every running task (they go back to their queue unspent) and closes."""
        self._closing = True
        self._now = True
        self._stop_taking()
        for worker in self._workers:
            worker.leaving = True
            worker.wake.set()
            worker.interrupt.set()

    async def close(self) -> None:
        """Lets workers leave (after their task unless :meth:`stop_now`), then closes the pipes.

        Every end already published is confirmed and acked first; after :meth:`stop_now` that
        wait is bounded by ``stop_timeout`` (what is left unacked goes back to the broker).
        """
        self._closing = True
        self._stop_taking()
        if self._holding is not None:
            self._quit_holding.set()
            await self._holding
        for worker in self._workers:
            if not worker.busy:
                worker.wake.set()
        if self._workers:
            await asyncio.gather(*self._workers.values(), return_exceptions=True)
        if self._putting_back:
            await asyncio.gather(*self._putting_back, return_exceptions=True)
        await self._hand_back_unstarted()
        if not await self._settled():
            log.warning("daemon.job.unconfirmed_on_close", extra={"job_id": self.job_id})
        await self.pipes.close()
        log.info("daemon.job.closed", extra={"job_id": self.job_id, "stats": dataclasses.asdict(self.stats)})

    async def _settled(self) -> bool:
        """Waits for every end in flight; bounded by ``stop_timeout`` once stopping now."""
        stopping_since: float | None = None
        while not await self.ends.wait(0, 0.25):
            if self._now:
                stopping_since = stopping_since or time.monotonic()
                if time.monotonic() - stopping_since > self.stop_timeout:
                    return False
        return True

    def _stop_taking(self) -> asyncio.Future[None]:
        """Stops new deliveries (once), if the listener can (see StopsConsuming)."""
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._cancel_listener())
        return self._stopping

    async def _cancel_listener(self) -> None:
        """Stops consuming with no delivery on its way to us (see CANCEL_QUIET)."""
        tasks = self.pipes.tasks
        if isinstance(tasks, StopsConsuming):
            async with self.ends.hold():
                await asyncio.sleep(self.cancel_quiet)
                with contextlib.suppress(PipeError, TimeoutError):
                    await asyncio.wait_for(tasks.cancel(), self.stop_timeout)
                    log.debug("daemon.job.consumer_cancelled", extra={"job_id": self.job_id})

    def _put_back_later(
        self, requeues: list[tuple[Delivery[TaskMessage], TaskMessage]], reason: str = "preempted"
    ) -> None:
        """Requeues interrupted (or never started) tasks in the background, so that their slot
        goes to the new job now instead of after consuming stopped (which the requeue waits for,
        see _requeue)."""

        async def put_back() -> None:
            try:
                for delivery, task in requeues:
                    with bind(task_id=task.task_id):
                        await self._requeue(delivery, task, reason)
            except PipeClosed:
                pass
            except PipeError as exc:
                self._broke(exc)
                log.warning("daemon.job.requeue_failed", extra={"error": repr(exc)})

        putting = asyncio.create_task(put_back())
        self._putting_back.add(putting)
        putting.add_done_callback(self._putting_back.discard)

    async def _requeue(self, delivery: Delivery[TaskMessage], task: TaskMessage, reason: str) -> None:
        """Puts a task back into its queue; once the job is leaving, only after consuming stopped,
        so the copy cannot land in this runner's own listener and come back as redelivered."""
        if self._stopping is not None:
            await asyncio.shield(self._stopping)
        await self.ends.requeue(delivery, task, reason)

    # -- the workers ----------------------------------------------------------------------------

    def _broke(self, exc: PipeError) -> None:
        if self.failure is None:
            self.failure = exc

    def _going(self, worker: Worker) -> bool:
        """The worker will leave at its next turn (see _leaves, which also marks it)."""
        return worker.leaving or self._closing or self.failure is not None or self.staying > self.target

    def _leaves(self, worker: Worker) -> bool:
        if worker.leaving or self._closing or self.failure is not None:
            return True
        if self.staying > self.target:
            worker.leaving = True
            return True
        return False

    async def _work(self, worker: Worker) -> None:
        with bind(job_id=self.job_id, slot=worker.slot.index, daemon_id=self.daemon_id):
            log.debug("daemon.worker.started", extra={"handler": self.handler})
            try:
                await worker.slot.prepare(self.handler)
                while not self._leaves(worker):
                    if self.handler not in self._specs and not await self._describe(worker):
                        continue
                    spec = self._specs[self.handler]
                    delivery = await self._take(worker)
                    if delivery is None:
                        continue
                    if spec is None:
                        more = await self._take_more(worker)
                        if more:
                            self._hold_results(worker, True)
                            await self._handle_chunk(worker, [delivery, *more])
                        else:
                            await self._handle(worker, delivery)
                        self._hold_results(
                            worker, bool(more) and self._frames is not None and self._frames.held > 0
                        )
                        limit = max(1, self.target) * ENDS_PER_SLOT
                    else:
                        batch = await collect(self.pipes.tasks, delivery, spec, lambda: self._taken(worker))
                        await self._handle_batch(worker, batch)
                        limit = max(1, self.target) * max(spec.max_size, ENDS_PER_SLOT)
                    if not self._going(worker):  # a leaving worker frees its slot at once
                        await self.ends.wait(limit)  # backpressure on confirms
            except PipeClosed:
                pass
            except PipeError as exc:
                self._broke(exc)
                log.warning("daemon.worker.pipe_failed", extra={"error": repr(exc)})
            except Exception:
                log.exception("daemon.worker.crashed")
                raise
            finally:
                log.debug("daemon.worker.left")
                self._hold_results(worker, False)
                del self._workers[worker]
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

    def _taken(self, worker: Worker) -> bool:
        """The worker should stop collecting a batch: it leaves or is being interrupted."""
        return worker.leaving or self._closing or worker.interrupt.is_set()

    async def _describe(self, worker: Worker) -> bool:
        """Asks the worker's slot whether the handler is a batch handler; False if interrupted.

        This imports the handler, as its first task would, under the same limits. A slot that
        dies or hangs on it makes the handler a one-task one: its tasks then meet the same fate
        one by one and spend attempts as usual.
        """
        handler = self.handler
        limits = Limits(self.settings.task_timeout, self.policy.memory_hard)
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
                await self.window.resize(max(self.window.size, max(1, self.target) * spec.max_size))
        return True

    async def _take_more(self, worker: Worker) -> list[Delivery[TaskMessage]]:
        """More members of a frame at hand, to run on this worker's slot after the one it took
        (up to :data:`CHUNK` in all): only when tasks are short, and no more than this worker's
        share of what is held, so that a frame still spreads over the free slots."""
        short = self._task_seconds is not None and self._task_seconds < CHUNK_BELOW
        if self._frames is None or not short or self._going(worker):
            return []
        more: list[Delivery[TaskMessage]] = []
        for _ in range(min(CHUNK - 1, self._frames.held // (self._idle + 1))):
            delivery = await self.pipes.tasks.get(0.0)
            if delivery is None:
                break
            more.append(delivery)
        return more

    async def _take(self, worker: Worker) -> Delivery[TaskMessage] | None:
        """The next delivery, or None on timeout or when the runner wakes this worker."""
        if worker.wake.is_set():
            worker.wake.clear()
            return None
        if self._frames is not None and self._frames.held:
            # Members of a frame at hand: taken at once, without waiting machinery (the common
            # case under load, worth its own path).
            delivery = await self.pipes.tasks.get(0.0)
            if delivery is not None:
                self._took_at = time.monotonic()
                return delivery
        getting = asyncio.ensure_future(self.pipes.tasks.get(GET_TIMEOUT))
        waking = asyncio.ensure_future(worker.wake.wait())
        self._idle += 1
        try:
            await asyncio.wait({getting, waking}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._idle -= 1
            waking.cancel()
            if not getting.done():
                getting.cancel()
        woken = worker.wake.is_set()
        worker.wake.clear()
        try:
            delivery = await getting  # a delivery that arrived as we were woken is ours all the same
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
            return None
        await self._adapt_window(delivery, woken)
        if delivery is not None:
            self._took_at = time.monotonic()
        return delivery

    async def _adapt_window(self, delivery: Delivery[TaskMessage] | None, woken: bool) -> None:
        """Late binding over several brokers (see :class:`~truba.pipes.prefetch.Window`): with
        every slot busy, split the prefetch so the daemon holds no task it is not running; when
        a slot found nothing, lift the split (the tasks may be on one broker only)."""
        try:
            if delivery is not None and self._idle == 0:
                await self.window.set_split(True)
            elif delivery is None and not woken:
                await self.window.set_split(False)
        except PipeError as exc:  # a leaf went away under the resize: its reopen applies the size
            log.debug("daemon.window.resize_failed", extra={"error": repr(exc)})

    async def _handle(self, worker: Worker, delivery: Delivery[TaskMessage]) -> None:
        task = delivery.message
        with bind(task_id=task.task_id):
            spent = await self._admit(worker, delivery)
            if spent is not None:
                await self._run(worker, delivery, task, spent)

    async def _admit(self, worker: Worker, delivery: Delivery[TaskMessage]) -> int | None:
        """The attempts the task has spent if it is to run now; None once it was ended otherwise."""
        task = delivery.message
        self.stats.waiting += 1
        try:
            log.debug(
                "daemon.task.received",
                extra={"redelivered": delivery.redelivered, "attempts": task.attempts},
            )
            admission = admit(task, delivery.redelivered, delivery.headers, self.settings.max_attempts)
            if admission.verdict is Verdict.GIVE_UP:
                await self._give_up(delivery, task, admission.spent, admission.error)
                return None
            taken_away = self._now or (worker.leaving and self.settings.immediate)
            if admission.verdict is Verdict.RECOUNT or taken_away:
                # Recount (classic queue: a death to write into the task), or this worker is
                # being taken away right now: back to the queue, nothing spent by us.
                reason = "recount" if admission.verdict is Verdict.RECOUNT else "released"
                await self._requeue(delivery, _with(task, admission.spent), reason)
                return None
            return admission.spent
        finally:
            self.stats.waiting -= 1

    async def _admit_all(
        self, worker: Worker, deliveries: list[Delivery[TaskMessage]]
    ) -> list[tuple[Delivery[TaskMessage], int]]:
        """The deliveries to run now, each with the attempts it has spent (see _admit)."""
        runnable: list[tuple[Delivery[TaskMessage], int]] = []
        for delivery in deliveries:
            with bind(task_id=delivery.message.task_id):
                spent = await self._admit(worker, delivery)
            if spent is not None:
                runnable.append((delivery, spent))
        return runnable

    async def _handle_chunk(self, worker: Worker, deliveries: list[Delivery[TaskMessage]]) -> None:
        runnable = await self._admit_all(worker, deliveries)
        if len(runnable) == 1:
            delivery, spent = runnable[0]
            with bind(task_id=delivery.message.task_id):
                await self._run(worker, delivery, delivery.message, spent)
        elif runnable:
            await self._run_chunk(worker, runnable)

    async def _run_chunk(self, worker: Worker, runnable: list[tuple[Delivery[TaskMessage], int]]) -> None:
        """One attempt of each task, the tasks handed to the slot in one write and run in order,
        each under its own watch (timeout, memory, interrupt) from the previous one's reply.
        When one ends without a reply, the slot is gone: the ones after it never started and go
        back to the queue unspent."""
        limits = Limits(self.settings.task_timeout, self.policy.memory_hard)
        worker.busy, worker.started_at = True, time.monotonic()
        worker.interrupt.clear()
        self.stats.busy += 1
        slot = worker.slot
        ended = 0  # tasks whose attempt ended (replied or not)
        replied = True
        try:
            handing = slot.send(self.handler, [(d.message.task_id, d.message.payload) for d, _ in runnable])
            end, _ = await supervised(slot, handing, limits, worker.interrupt)
            for delivery, spent in runnable:
                task = delivery.message
                with bind(task_id=task.task_id):
                    log.debug("daemon.task.started", extra={"attempt": spent + 1, "pid": slot.pid})
                    if end.ending is Ending.REPLIED:  # else the hand-over itself failed
                        end = await self._chunk_reply(worker, task, limits)
                    ended += 1
                    if end.ending is not Ending.REPLIED:  # the slot is gone (and started afresh)
                        replied = False
                        await self._ended(delivery, task, end, spent)
                        break
                    await self._complete(delivery, task, end, spent + 1)
        except BaseException:
            if replied and ended < len(runnable):  # replies still due: no one else may read them
                await asyncio.shield(slot.kill())
            raise
        finally:
            worker.busy = False
            self.stats.busy -= 1
        if ended < len(runnable):
            unstarted = [(d, _with(d.message, spent)) for d, spent in runnable[ended:]]
            self._put_back_later(unstarted, "unstarted")
        else:
            await self._maybe_recycle(slot)

    async def _chunk_reply(self, worker: Worker, task: TaskMessage, limits: Limits) -> AttemptEnd:
        """How the next task of a chunk ended: its reply if the slot sent it already (taken at
        once, even if an interrupt came meanwhile: finished work is kept), else what the watch
        over the wait for it says."""
        slot = worker.slot
        reply = slot.reply_at_hand()
        if reply is not None:
            return AttemptEnd(Ending.REPLIED, reply.seconds, reply)
        end, reply = await supervised(slot, slot.reply(task.task_id), limits, worker.interrupt)
        return AttemptEnd(end.ending, end.seconds, reply, end.error)

    async def _handle_batch(self, worker: Worker, deliveries: list[Delivery[TaskMessage]]) -> None:
        runnable = await self._admit_all(worker, deliveries)
        if runnable:
            await self._run_batch(worker, runnable)

    async def _run_batch(self, worker: Worker, runnable: list[tuple[Delivery[TaskMessage], int]]) -> None:
        """One attempt for every task of the batch (see :mod:`truba.daemon.batching`)."""
        limits = Limits(self.settings.task_timeout, self.policy.memory_hard)
        worker.busy, worker.started_at = True, time.monotonic()
        worker.interrupt.clear()
        self.stats.busy += 1
        log.debug("daemon.batch.started", extra={"size": len(runnable), "pid": worker.slot.pid})
        tasks = [(d.message.task_id, d.message.payload) for d, _ in runnable]
        try:
            running = worker.slot.run_batch(self.handler, tasks)
            end, replies = await supervised(worker.slot, running, limits, worker.interrupt, what="batch")
        finally:
            worker.busy = False
            self.stats.busy -= 1
        if end.ending is Ending.REPLIED:
            assert replies is not None
            share = end.seconds / len(runnable)
            for (delivery, spent), reply in zip(runnable, replies, strict=True):
                with bind(task_id=delivery.message.task_id):
                    one = AttemptEnd(Ending.REPLIED, share, reply=reply)
                    await self._complete(delivery, delivery.message, one, spent + 1)
            await self._maybe_recycle(worker.slot)
        elif end.ending is Ending.INTERRUPTED:
            self.stats.preempted += len(runnable)
            self._put_back_later([(delivery, _with(delivery.message, spent)) for delivery, spent in runnable])
            fields = {"size": len(runnable), "seconds": round(end.seconds, 3)}
            log.info("daemon.batch.preempted", extra=fields)
        else:
            for delivery, spent in runnable:
                with bind(task_id=delivery.message.task_id):
                    await self._failed(delivery, delivery.message, end, spent)

    async def _run(
        self, worker: Worker, delivery: Delivery[TaskMessage], task: TaskMessage, spent: int
    ) -> None:
        attempt = spent + 1
        limits = Limits(self.settings.task_timeout, self.policy.memory_hard)
        worker.busy, worker.started_at = True, time.monotonic()
        worker.interrupt.clear()
        self.stats.busy += 1
        log.debug("daemon.task.started", extra={"attempt": attempt, "pid": worker.slot.pid})
        try:
            end = await run_attempt(
                worker.slot, self.handler, task.task_id, task.payload, limits, worker.interrupt
            )
        finally:
            worker.busy = False
            self.stats.busy -= 1
        if end.ending is Ending.REPLIED:
            await self._complete(delivery, task, end, attempt)
            await self._maybe_recycle(worker.slot)
        else:
            await self._ended(delivery, task, end, spent)

    async def _ended(
        self, delivery: Delivery[TaskMessage], task: TaskMessage, end: AttemptEnd, spent: int
    ) -> None:
        """An attempt that ended without a reply: interrupted (back, unspent) or failed."""
        if end.ending is Ending.INTERRUPTED:
            self.stats.preempted += 1
            self._put_back_later([(delivery, _with(task, spent))])
            log.info("daemon.task.preempted", extra={"attempt": spent + 1, "seconds": round(end.seconds, 3)})
        else:
            await self._failed(delivery, task, end, spent)

    async def _complete(
        self, delivery: Delivery[TaskMessage], task: TaskMessage, end: AttemptEnd, attempt: int
    ) -> None:
        reply = end.reply
        assert reply is not None
        self.stats.ran(end.seconds)
        seconds = self._task_seconds
        self._task_seconds = reply.seconds if seconds is None else seconds + (reply.seconds - seconds) / 8
        log.debug("daemon.task.finished", extra={"ok": reply.ok, "seconds": round(end.seconds, 6)})
        result = ResultMessage(
            task.task_id, reply.ok, reply.value, reply.error, self.daemon_id, reply.seconds, attempt
        )
        await self.ends.complete(delivery, result)

    async def _failed(
        self, delivery: Delivery[TaskMessage], task: TaskMessage, end: AttemptEnd, spent: int
    ) -> None:
        """The attempt ended without an outcome (timeout, memory, crash): requeue or give up."""
        assert end.error is not None
        gives_up, spent = after_failure(spent, self.settings.max_attempts)
        fields = {"attempt": spent, "seconds": round(end.seconds, 3), "error": end.error.message}
        if end.ending is Ending.TIMED_OUT:
            self.stats.timed_out += 1
            log.info("daemon.task.timed_out", extra=fields)
        elif end.ending is Ending.OUT_OF_MEMORY:
            log.info("daemon.task.out_of_memory", extra=fields)
        else:
            log.warning("daemon.task.slot_died", extra=fields)
        if gives_up:
            await self._give_up(delivery, task, spent, end.error)
        else:
            await self._requeue(delivery, _with(task, spent), end.ending.value)

    async def _give_up(
        self, delivery: Delivery[TaskMessage], task: TaskMessage, spent: int, error: ErrorInfo | None
    ) -> None:
        error = error or LOST
        await self.ends.give_up(delivery, _with(task, spent), spent, error)
        log.info("daemon.task.gave_up", extra={"attempts": spent, "error": f"{error.type}: {error.message}"})

    async def _maybe_recycle(self, slot: SlotProcess) -> None:
        """Replaces the slot's process after too many tasks or over the soft memory limit."""
        reason = None
        if self.policy.max_tasks and slot.tasks_run >= self.policy.max_tasks:
            reason = {"reason": "max_tasks", "tasks": slot.tasks_run}
        elif self.policy.memory_soft:
            used = slot.private_memory()
            if used is not None and used > self.policy.memory_soft:
                reason = {"reason": "memory", "private_mib": round(used / MIB, 1)}
        if reason is None:
            return
        log.info("daemon.slot.recycled", extra={**reason, "pid": slot.pid})
        await slot.stop()
        await slot.start()

    async def _hand_back_unstarted(self) -> None:
        """Stops consuming and puts back, unspent, what was delivered but never started."""
        tasks = self.pipes.tasks
        if not isinstance(tasks, StopsConsuming):
            return  # closing the listener returns them to the broker (see StopsConsuming)
        await self._stop_taking()
        with contextlib.suppress(PipeError):
            while (delivery := await tasks.get(0.0)) is not None:
                await self._hand_back(delivery, "released")

    async def _hand_back(self, delivery: Delivery[TaskMessage], reason: str) -> None:
        """Puts back a delivery this runner holds but never started: unspent (its redelivery,
        if any, counted in), or given up if that spent its last attempt."""
        task = delivery.message
        with bind(task_id=task.task_id):
            admission = admit(task, delivery.redelivered, delivery.headers, self.settings.max_attempts)
            if admission.verdict is Verdict.GIVE_UP:
                await self._give_up(delivery, task, admission.spent, admission.error)
            else:
                await self._requeue(delivery, _with(task, admission.spent), reason)

    async def _watch_held(self) -> None:
        """Hands back frame members that waited ``hold_limit`` seconds while no worker took a task."""
        frames = self._frames
        assert frames is not None
        while not self._closing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._quit_holding.wait(), self.hold_limit / 2)
            if self._idle or self._quit_holding.is_set() or any(not w.busy for w in self._workers):
                continue  # a worker is free, or about to be (starting its slot, describing)
            if not frames.held:
                try:  # a frame in the prefetch waits here from now on
                    await frames.take_in()
                except PipeError as exc:  # the listener's own reopen deals with it; a worker sees it too
                    log.debug("daemon.job.take_in_failed", extra={"job_id": self.job_id, "error": repr(exc)})
                continue
            if min(frames.held_for(), time.monotonic() - self._took_at) < self.hold_limit:
                continue  # not waiting long, or the slots take tasks: they flow here
            count = 0
            try:
                while frames.held and not self._idle and not self._closing:
                    delivery = await self.pipes.tasks.get(0.0)
                    if delivery is None:
                        break
                    await self._hand_back(delivery, "held")
                    count += 1
            except PipeClosed:
                return
            except PipeError as exc:
                self._broke(exc)
                log.warning("daemon.job.hand_back_failed", extra={"job_id": self.job_id, "error": repr(exc)})
                return
            if count:
                log.info("daemon.job.handed_back", extra={"job_id": self.job_id, "count": count})


def _with(task: TaskMessage, attempts: int) -> TaskMessage:
    return task if task.attempts == attempts else dataclasses.replace(task, attempts=attempts)
