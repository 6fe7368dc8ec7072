"""The task life on a worker's slot, one path for every way tasks reach it.

Get a delivery → admit it (attempts spent so far, :mod:`truba.daemon.attempts`) → run one
attempt in a slot under its limits (:mod:`truba.daemon.supervise`), handed over one task at a
time, as a chunk of short tasks or as a batch (:mod:`truba.daemon.handover`) → end each task on its
own (:mod:`truba.daemon.task_endings`): a reply is its result (or, for an error the job retries
on with attempts left, a retry after a backoff: :mod:`truba.daemon.retries`); an interrupt puts
it back unspent; a timeout, the memory limit or the slot's death spends an attempt (requeue,
or give up after the last). Results are published and confirmed, then acked; the confirm and
the ack run in the background while the slot takes the next task.

After its tasks all replied, a slot is recycled (replaced by a fresh process) when it ran
``max_tasks`` tasks or its private memory passed the soft limit; a slot passing the hard limit
during a task is killed and the attempt spent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Final, TypeVar

from truba.daemon.attempts import Admission, Verdict, admit, after_failure, with_attempts
from truba.daemon.crew import Crew, Worker
from truba.daemon.handover import BATCHED, CHUNKED, ONE_TASK, Admitted, Handover, next_reply, reply_at_hand
from truba.daemon.retries import retries_on, retry_delay
from truba.daemon.returns import Returns
from truba.daemon.slot_process import SlotProcess
from truba.daemon.spans import (
    CRASHED,
    ERROR,
    GAVE_UP,
    OK,
    PREEMPTED,
    RETRIED,
    TIMEOUT,
    JobSpans,
    Outcome,
    unrecorded,
)
from truba.daemon.stats import JobStats
from truba.daemon.supervise import MIB, AttemptEnd, Ending, Limits, supervised
from truba.daemon.task_endings import TaskEndings
from truba.daemon.task_events import TaskEvents
from truba.daemon.terms import JobTerms
from truba.logs import bind
from truba.pipes.base import Delivery
from truba.wire import ErrorInfo, ResultMessage, TaskMessage

log = logging.getLogger(__name__)
T = TypeVar("T")
FAILED_HOW: Final = {
    Ending.TIMED_OUT: "timeout",
    Ending.OUT_OF_MEMORY: "out_of_memory",
    Ending.DIED: "crashed",
}
"""The outcome of an attempt that ended without a reply and was not interrupted."""
_UNBOUND: Final = contextlib.nullcontext()
"""The log context of a lone task: its caller bound it already, for the task's whole life."""


class Execution:
    """Admits deliveries, runs them on a worker's slot and ends each; see the module docstring."""

    def __init__(
        self,
        terms: JobTerms,
        crew: Crew,
        stats: JobStats,
        ends: TaskEndings,
        returns: Returns,
        daemon_id: str,
        spans: JobSpans | None = None,
        events: TaskEvents | None = None,
    ) -> None:
        self.terms = terms
        self.crew = crew
        self.stats = stats
        self.ends = ends
        self.returns = returns
        self.daemon_id = daemon_id
        self.spans = spans or unrecorded()
        """Each attempt's span, for the scheduler's timeline (:mod:`truba.daemon.spans`)."""
        self.events = events or TaskEvents()
        """Each task's life told: log events and the job's metrics."""
        self.task_seconds: float | None = None
        """Recent handler seconds per task (an EWMA; None until a task ended)."""

    async def run_one(self, worker: Worker, delivery: Delivery[TaskMessage]) -> None:
        """One delivery, as one task (the common case: its log context is bound once)."""
        with bind(task_id=delivery.message.task_id):
            spent = await self._admit(worker, delivery)
            if spent is not None:
                await self.execute(worker, [(delivery, spent)], ONE_TASK)

    async def run_chunk(self, worker: Worker, deliveries: list[Delivery[TaskMessage]]) -> None:
        """Several deliveries of short tasks, handed to the slot in one write (one admitted
        alone runs as one task)."""
        admitted = await self._admit_all(worker, deliveries)
        if len(admitted) > 1:
            await self._run_admitted(worker, admitted, CHUNKED)
        else:
            await self._run_admitted(worker, admitted, ONE_TASK)

    async def run_batch(self, worker: Worker, deliveries: list[Delivery[TaskMessage]]) -> None:
        """Deliveries for one call of a batch handler."""
        await self._run_admitted(worker, await self._admit_all(worker, deliveries), BATCHED)

    async def _run_admitted(self, worker: Worker, admitted: list[Admitted], way: Handover[T]) -> None:
        if len(admitted) > 1:
            await self.execute(worker, admitted, way)
        elif admitted:
            with bind(task_id=admitted[0][0].message.task_id):
                await self.execute(worker, admitted, way)

    async def execute(self, worker: Worker, admitted: list[Admitted], way: Handover[T]) -> None:
        """One attempt of each admitted task on the worker's slot, handed over ``way``; then
        each task's end, in order.

        A lone task runs in its caller's log context (bound to it already); of several, each is
        bound only where something may log without naming it (see the loop).
        """
        terms = self.terms
        limits = Limits(terms.settings.task_timeout, terms.policy.memory_hard)
        slot, spans = worker.slot, self.spans
        count = len(admitted)
        worker.busy, worker.started_at = True, time.monotonic()
        began = time.time()  # wall clock, for spans: when the next task to end started
        worker.interrupt.clear()
        self.stats.busy += 1
        ended = 0  # tasks whose attempt ended (replied or not)
        replied = True  # so far every one did
        back: list[tuple[Delivery[TaskMessage], TaskMessage]] | None = None  # interrupted ones
        results: list[tuple[Delivery[TaskMessage], ResultMessage]] = []
        """Results of replies taken at hand, published together before anything waits."""
        try:
            self.events.started(slot, admitted)
            for delivery, spent in admitted[:1] if way.streams else admitted:  # a chunk's: one by one
                spans.started(delivery.message.task_id, slot.index, began, spent + 1)
            handing = way.hand_over(slot, terms.entry, admitted)
            handed, value = await supervised(slot, handing, limits, worker.interrupt, what=way.what)
            if not way.streams:  # the slot is done with them all
                worker.busy = False
                self.stats.busy -= 1
            for delivery, spent in admitted:
                task = delivery.message
                # A chunk's task is bound to its log context only for what may log with it: a
                # wait for its reply, an end other than a reply (a reply's events name their
                # task; binding each of a chunk's tasks cost W1 about 1 µs per task).
                if ended and way.streams:  # a chunk's next task began when the one before ended
                    spans.started(task.task_id, slot.index, began, spent + 1)
                end = way.end(ended, count, handed, value)
                if end is None:
                    end = reply_at_hand(slot)
                    if end is None:
                        if results:  # they do not wait for the next reply
                            await self._publish(results)
                        with _UNBOUND if count == 1 else bind(task_id=task.task_id):
                            end = await next_reply(slot, task, spent, limits, worker.interrupt)
                ended += 1
                spans.ended(task.task_id, slot.index)
                start, ended_at = began, time.time()
                if way.streams:  # a chunk's tasks run one after the other
                    began = ended_at
                if end.ending is Ending.REPLIED:
                    outcome = self._complete(delivery, task, end, spent + 1, results)
                    fault = end.reply.error if end.reply else None
                    kind, message = (fault.type, fault.message) if fault else ("", "")
                    spans.attempt(
                        task.task_id, slot.index, start, ended_at, outcome, spent + 1, kind, message
                    )
                    continue
                if results:  # published before this task's end, in order
                    await self._publish(results)
                with _UNBOUND if count == 1 else bind(task_id=task.task_id):
                    if replied:  # the slot is started afresh (one process, whatever it held)
                        self.events.slot_restarted(end.ending)
                    replied = False
                    if end.ending is Ending.INTERRUPTED:  # back, unspent
                        spans.attempt(task.task_id, slot.index, start, ended_at, PREEMPTED, spent + 1)
                        self.events.ended(task.task_id, "preempted", end.seconds, spent + 1)
                        self.stats.preempted += 1
                        if back is None:
                            back = []
                        back.append((delivery, with_attempts(task, spent)))
                        fields = {"attempt": spent + 1, "seconds": round(end.seconds, 3)}
                        log.info("daemon.task.preempted", extra=fields)
                    else:
                        outcome = await self._failed(delivery, task, end, spent)
                        kind, message = (end.error.type, end.error.message) if end.error else ("", "")
                        spans.attempt(
                            task.task_id, slot.index, start, ended_at, outcome, spent + 1, kind, message
                        )
                if way.streams:  # the slot is gone (and started afresh)
                    break
            if results:
                await self._publish(results)
        except BaseException:
            if way.streams and replied and ended < count:  # replies still due: no one else may read them
                await asyncio.shield(slot.kill())
            raise
        finally:
            if worker.busy:
                worker.busy = False
                self.stats.busy -= 1
            for delivery, _ in admitted[ended:]:  # not in progress any more (cancelled or unstarted)
                spans.ended(delivery.message.task_id, slot.index)
        if back is not None:
            self.returns.put_back_later(back)
        if ended < count:  # never started: back, unspent
            unstarted = [(d, with_attempts(d.message, spent)) for d, spent in admitted[ended:]]
            self.returns.put_back_later(unstarted, "unstarted")
        elif replied:
            await self._recycle(slot)

    async def _admit_all(self, worker: Worker, deliveries: list[Delivery[TaskMessage]]) -> list[Admitted]:
        """The deliveries to run now, each with the attempts it has spent (see _admit)."""
        admitted: list[Admitted] = []
        for delivery in deliveries:
            spent = await self._admit(worker, delivery)
            if spent is not None:
                admitted.append((delivery, spent))
        return admitted

    async def _admit(self, worker: Worker, delivery: Delivery[TaskMessage]) -> int | None:
        """The attempts the task has spent if it is to run now; None once it was ended otherwise."""
        task = delivery.message
        redelivered = delivery.redelivered  # read once: a property through every layer of the stack
        self.events.received(task.task_id, redelivered, task.attempts)
        settings = self.terms.settings
        admission = admit(task, redelivered, delivery.headers, settings.max_attempts)
        if (
            admission.verdict is Verdict.RUN
            and not (task.expires and time.time() > task.expires)
            and self.terms.refusal is None
            and not (self.crew.now or (worker.leaving and settings.immediate))
        ):
            return admission.spent  # runs now: the common case (nothing logged, no ids bound)
        with bind(task_id=task.task_id):
            return await self._turn_away(worker, delivery, admission)

    async def _turn_away(
        self, worker: Worker, delivery: Delivery[TaskMessage], admission: Admission
    ) -> int | None:
        """A task not to run now (see _admit), ended otherwise: given up (its attempts spent),
        expired, refused, recounted or put back; None once ended."""
        task = delivery.message
        settings = self.terms.settings
        self.stats.waiting += 1
        try:
            if admission.verdict is Verdict.GIVE_UP:
                await self.returns.give_up(delivery, task, admission.spent, admission.error)
                now = time.time()
                fault = admission.error
                kind, message = (fault.type, fault.message) if fault else ("", "")
                self.spans.attempt(
                    task.task_id, worker.slot.index, now, now, GAVE_UP, admission.spent, kind, message
                )
                return None
            if task.expires and time.time() > task.expires:  # a schedule's run come too late: not run
                error = ErrorInfo(
                    "RunExpired", f"delivered {time.time() - task.expires:.3f} s after it expired"
                )
                result = ResultMessage(
                    task.task_id, False, None, error, self.daemon_id, 0.0, admission.spent, gave_up=True
                )
                await self.ends.complete(delivery, result)
                log.info("daemon.task.expired", extra={"error": error.message})
                return None
            refusal = self.terms.refusal
            if refusal is not None:  # an outcome at once: never a task that waits for nothing
                attempt = admission.spent + 1
                result = ResultMessage(task.task_id, False, None, refusal, self.daemon_id, 0.0, attempt)
                await self.ends.complete(delivery, result)
                log.warning("daemon.task.refused", extra={"error": refusal.type})
                return None
            taken_away = self.crew.now or (worker.leaving and settings.immediate)
            if admission.verdict is Verdict.RECOUNT or taken_away:
                # Recount (classic queue: a death to write into the task), or this worker is
                # being taken away right now: back to the queue, nothing spent by us.
                reason = "recount" if admission.verdict is Verdict.RECOUNT else "released"
                await self.returns.requeue(delivery, with_attempts(task, admission.spent), reason)
                return None
            return admission.spent
        finally:
            self.stats.waiting -= 1

    async def _publish(self, results: list[tuple[Delivery[TaskMessage], ResultMessage]]) -> None:
        """Publishes the results gathered (see :meth:`_complete`), in one batch when several."""
        if len(results) == 1:
            await self.ends.complete(*results[0])
        else:
            await self.ends.complete_many(results)
        results.clear()

    def _complete(
        self,
        delivery: Delivery[TaskMessage],
        task: TaskMessage,
        end: AttemptEnd,
        attempt: int,
        results: list[tuple[Delivery[TaskMessage], ResultMessage]],
    ) -> Outcome:
        """Takes the reply as the task's outcome (its result added to ``results``, which the
        caller publishes before it waits for anything: a chunk's replies at hand go out in one
        batch), or retries it; returns the span's outcome."""
        reply = end.reply
        assert reply is not None
        self.stats.ran(end.seconds)
        seconds = self.task_seconds
        self.task_seconds = reply.seconds if seconds is None else seconds + (reply.seconds - seconds) / 8
        settings = self.terms.settings
        retried = not reply.ok and retries_on(reply.kinds, settings, attempt)
        how = "retried" if retried else "ok" if reply.ok else "failed"
        self.events.ended(task.task_id, how, end.seconds, attempt)
        if retried:
            delay = retry_delay(attempt, settings.backoff)
            error = reply.error.type if reply.error is not None else ""
            fields = {"task_id": task.task_id, "attempt": attempt, "error": error, "delay": round(delay, 3)}
            log.info("daemon.task.retrying", extra=fields)
            self.stats.retried += 1
            self.returns.requeue_after(delay, delivery, with_attempts(task, attempt))
            return RETRIED
        result = ResultMessage(
            task.task_id, reply.ok, reply.value, reply.error, self.daemon_id, reply.seconds, attempt
        )
        results.append((delivery, result))
        return OK if reply.ok else ERROR

    async def _failed(
        self, delivery: Delivery[TaskMessage], task: TaskMessage, end: AttemptEnd, spent: int
    ) -> Outcome:
        """The attempt ended without an outcome (timeout, memory, crash): requeue or give up;
        returns the span's outcome."""
        assert end.error is not None
        gives_up, spent = after_failure(spent, self.terms.settings.max_attempts)
        fields = {"attempt": spent, "seconds": round(end.seconds, 3), "error": end.error.message}
        self.events.ended(task.task_id, FAILED_HOW[end.ending], end.seconds, spent)
        if end.ending is Ending.TIMED_OUT:
            self.stats.timed_out += 1
            log.info("daemon.task.timed_out", extra=fields)
        elif end.ending is Ending.OUT_OF_MEMORY:
            log.info("daemon.task.out_of_memory", extra=fields)
        else:
            log.warning("daemon.task.slot_died", extra=fields)
        if gives_up:
            await self.returns.give_up(delivery, task, spent, end.error)
            return GAVE_UP
        await self.returns.requeue(delivery, with_attempts(task, spent), end.ending.value)
        return TIMEOUT if end.ending is Ending.TIMED_OUT else CRASHED

    async def _recycle(self, slot: SlotProcess) -> None:
        """Replaces the slot's process after too many tasks or over the soft memory limit."""
        policy = self.terms.policy
        reason = None
        if policy.max_tasks and slot.tasks_run >= policy.max_tasks:
            reason = {"reason": "max_tasks", "tasks": slot.tasks_run}
            self.events.slot_recycled("max_tasks")
        elif policy.memory_soft:
            used = slot.private_memory()
            if used is not None and used > policy.memory_soft:
                reason = {"reason": "memory", "private_mib": round(used / MIB, 1)}
                self.events.slot_recycled("soft_memory")
        if reason is None:
            return
        log.info("daemon.slot.recycled", extra={**reason, "pid": slot.pid})
        await slot.stop()
        await slot.start()
