"""Tasks that leave a runner without a result: put back into their queue, or given up.

A task goes back by being published again with its attempt count and the original acked once
that is confirmed (:mod:`truba.daemon.task_endings`), never by ``reject(requeue=True)``, which its next
daemon would count as a death (:mod:`truba.daemon.attempts`). It goes back unspent when it never
ran to an end here: interrupted (preemption, stop), handed over to a slot that died before
starting it, delivered and never started when the runner closes, or held in a frame too long
(see :mod:`truba.daemon.intake`); with one attempt more after a failed attempt, or after a
handler error the job retries on, once its backoff is over (:mod:`truba.daemon.retries`). A
task whose attempts are all spent is given up instead.

Once the job is leaving this daemon, the runner stops consuming first (:meth:`Returns.stop_taking`,
with :data:`CANCEL_QUIET`) and a put-back waits for that, so the copy cannot land in this
runner's own listener and come back as redelivered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from truba.daemon.attempts import LOST, Verdict, admit, with_attempts
from truba.daemon.task_endings import TaskEndings
from truba.daemon.terms import JobTerms
from truba.logs import bind
from truba.pipes.base import Delivery, Listener
from truba.pipes.errors import PipeClosed, PipeError
from truba.pipes.prefetch import Window
from truba.wire import ErrorInfo, TaskMessage

log = logging.getLogger(__name__)
CANCEL_QUIET = 0.03
"""Seconds without acks before basic.cancel. A quorum queue returns what it had already sent
towards a consumer that is cancelled (not yet on the wire to us): such a task comes back marked
redelivered with ``x-delivery-count`` raised, so its next daemon counts an attempt it never
ran. Each ack gives the consumer credit for one more delivery; with acks held back, what is on
its way arrives (and is handed back unspent) and nothing more is sent before the cancel. A
round trip to the broker must fit in it (local network)."""


class Returns:
    """Puts one runner's tasks back into their queue or gives them up; see the module docstring.

    ``on_broken`` hears of a pipe error that stops the runner (a put-back in the background
    failed).
    """

    def __init__(
        self,
        job_id: str,
        tasks: Listener[TaskMessage],
        ends: TaskEndings,
        terms: JobTerms,
        on_broken: Callable[[PipeError], None],
        *,
        stop_timeout: float,
        cancel_quiet: float,
    ) -> None:
        self.job_id = job_id
        self.tasks = tasks
        self.ends = ends
        self.terms = terms
        self.on_broken = on_broken
        self.stop_timeout = stop_timeout
        self.cancel_quiet = cancel_quiet
        self._stopping: asyncio.Future[None] | None = None
        self._putting_back: set[asyncio.Task[None]] = set()
        """Interrupted tasks on their way back to the queue (their slot is free already)."""
        self._hurry = asyncio.Event()
        """Set once consuming stops: tasks waiting to be retried go back at once."""
        self.retrying = 0
        """Tasks waiting out their retry backoff here (their deliveries unacked, their slots free)."""
        self.window: Window | None = None
        """The job's prefetch window, widened by one per task waiting to be retried (see
        requeue_after); None: not widened."""

    def stop_taking(self) -> asyncio.Future[None]:
        """Stops new deliveries (once); tasks waiting to be retried go back now."""
        self._hurry.set()
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._cancel_listener())
        return self._stopping

    async def _cancel_listener(self) -> None:
        """Stops consuming with no delivery on its way to us (see CANCEL_QUIET)."""
        async with self.ends.hold():
            await asyncio.sleep(self.cancel_quiet)
            with contextlib.suppress(PipeError, TimeoutError):
                await asyncio.wait_for(self.tasks.cancel(), self.stop_timeout)
                log.debug("daemon.job.consumer_cancelled", extra={"job_id": self.job_id})

    async def requeue(self, delivery: Delivery[TaskMessage], task: TaskMessage, reason: str) -> None:
        """Puts a task back into its queue; once the job is leaving, only after consuming stopped,
        so the copy cannot land in this runner's own listener and come back as redelivered."""
        if self._stopping is not None:
            await asyncio.shield(self._stopping)
        await self.ends.requeue(delivery, task, reason)

    def put_back_later(
        self, requeues: list[tuple[Delivery[TaskMessage], TaskMessage]], reason: str = "preempted"
    ) -> None:
        """Requeues interrupted (or never started) tasks in the background, so that their slot
        goes to the new job now instead of after consuming stopped (which the requeue waits for,
        see requeue)."""

        async def put_back() -> None:
            for delivery, task in requeues:
                with bind(task_id=task.task_id):
                    await self.requeue(delivery, task, reason)

        self._in_background(put_back())

    def _in_background(self, putting_back: Coroutine[Any, Any, None]) -> None:
        async def guarded() -> None:
            try:
                await putting_back
            except PipeClosed:
                pass
            except PipeError as exc:
                self.on_broken(exc)
                log.warning("daemon.job.requeue_failed", extra={"error": repr(exc)})

        putting = asyncio.create_task(guarded())
        self._putting_back.add(putting)
        putting.add_done_callback(self._putting_back.discard)

    def requeue_after(self, delay: float, delivery: Delivery[TaskMessage], task: TaskMessage) -> None:
        """Puts a task to be retried back into its queue after ``delay`` seconds, in the
        background: its slot runs other tasks meanwhile. Its delivery stays unacked until then
        (a daemon that dies in the wait lets the broker deliver it again, the attempt counted),
        so the prefetch window is widened by one meanwhile, or the wait would idle a slot.
        Once consuming stops (the job leaves this daemon), it goes back at once, the rest of its
        wait dropped."""

        async def wait_then_requeue() -> None:
            try:
                await self._widen(+1)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._hurry.wait(), delay)
            finally:
                self.retrying -= 1
                await self._widen(-1)
            with bind(task_id=task.task_id):
                await self.requeue(delivery, task, "retry")

        self.retrying += 1
        self._in_background(wait_then_requeue())

    async def _widen(self, by: int) -> None:
        window = self.window
        if window is not None:
            with contextlib.suppress(PipeError):  # a leaf gone under the resize applies it on reopen
                await window.resize(max(1, window.size + by))

    async def put_back_done(self) -> None:
        """Waits for the put-backs running in the background."""
        if self._putting_back:
            await asyncio.gather(*self._putting_back, return_exceptions=True)

    async def give_up(
        self, delivery: Delivery[TaskMessage], task: TaskMessage, spent: int, error: ErrorInfo | None
    ) -> None:
        error = error or LOST
        await self.ends.give_up(delivery, with_attempts(task, spent), spent, error)
        log.info("daemon.task.gave_up", extra={"attempts": spent, "error": f"{error.type}: {error.message}"})

    async def hand_back(self, delivery: Delivery[TaskMessage], reason: str) -> None:
        """Puts back a delivery this runner holds but never started: unspent (its redelivery,
        if any, counted in), or given up if that spent its last attempt."""
        task = delivery.message
        with bind(task_id=task.task_id):
            admission = admit(task, delivery.redelivered, delivery.headers, self.terms.settings.max_attempts)
            if admission.verdict is Verdict.GIVE_UP:
                await self.give_up(delivery, task, admission.spent, admission.error)
            else:
                await self.requeue(delivery, with_attempts(task, admission.spent), reason)

    async def hand_back_unstarted(self) -> None:
        """Stops consuming and puts back, unspent, what was delivered but never started.

        Closing the listener instead would return them to the broker, which marks them
        redelivered: their next daemon would count an attempt.
        """
        await self.stop_taking()
        with contextlib.suppress(PipeError):
            while (delivery := await self.tasks.get(0.0)) is not None:
                await self.hand_back(delivery, "released")
