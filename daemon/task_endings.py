"""The ways a task's life on a daemon ends, each one published, confirmed, then acked.

- **complete**: its result (a value or the handler's error) goes to the results queue (a frame
  member's is copied into the job's result log too, see :meth:`JobPipes.results_for`);
- **requeue**: the task goes back to its own queue, published again with an attempt count
  (the same one after a preemption, one more after a failed attempt), never by
  ``reject(requeue=True)``, which the next daemon would count as a death (see
  :mod:`truba.daemon.attempts`). The copy carries a new random ``copy_id``. If the delivery is a
  frame member (and the job has a result log), a hand-back record naming the delivery's copy goes
  to the log once the new copy is confirmed, sent in the background by the job's records
  (:mod:`truba.daemon.hand_back_records`): the ack waits for the copy's confirm only, never for
  the record. Should the frame come back redelivered, the record keeps the member from running
  a second time next to its copy (:mod:`truba.pipes.result_log`). A lone message needs no
  record: it is acked as soon as its copy is confirmed (a member only with its whole frame), so
  only a daemon dying in that instant runs it twice;
- **give up**: a record goes to the dead-letter queue and a give-up result to the client.

The delivery is acked only once everything published for it is confirmed, so a daemon killed
at any point loses nothing: the broker redelivers the unacked task. The confirm and the ack run
in the background (the slot goes on with the next task meanwhile), in the order the ends were
published, by one task per runner (not one per end: at thousands of tasks a second that is a
cost); :meth:`TaskEndings.wait` waits for them. If a confirm fails (the broker refused the
message), the task is rejected with requeue as a last resort: it runs again, and its next daemon
counts one attempt more.

:meth:`TaskEndings.hold` keeps settles back for a while (they wait, nothing is lost): while the
runner stops consuming, so that the consumer's prefetch credit runs out before basic.cancel
(see :data:`truba.daemon.returns.CANCEL_QUIET`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import functools
import itertools
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from truba.daemon.hand_back_records import JobRecords
from truba.daemon.job_pipes import JobPipes
from truba.daemon.stats import JobStats
from truba.daemon.task_events import TaskEvents
from truba.pipes.base import Confirmation, Delivery
from truba.pipes.batch import ack_many, send_many
from truba.pipes.errors import PipeClosed, PipeError
from truba.pipes.outbound import let_out
from truba.wire import ErrorInfo, GaveUpRecord, HandedBack, ResultMessage, TaskCodec, TaskMessage, new_copy_id

log = logging.getLogger(__name__)
ACK_RUN = 256
"""Confirmed ends acked in one call at most (a bound on one call's work; under W1 a run is a
frame's results or a few frames')."""


@dataclass
class TaskEndings:
    """Publishes how tasks end and acks them once confirmed; see the module docstring."""

    pipes: JobPipes
    daemon_id: str
    stats: JobStats
    on_broken: Callable[[PipeError], None] = lambda exc: None
    events: TaskEvents = field(default_factory=TaskEvents)
    _queue: deque[_End] = field(default_factory=deque)
    """Ends published and not yet acked, oldest first."""
    _acker: asyncio.Task[None] | None = None
    _fewer: asyncio.Event = field(default_factory=asyncio.Event)
    """Set whenever an end is settled (waiters of :meth:`wait` recheck)."""
    _open: asyncio.Event = field(default_factory=asyncio.Event)
    _holds: int = 0

    def __post_init__(self) -> None:
        self._open.set()

    @contextlib.asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        """No ack or reject leaves while inside (nested holds stack); they go out after."""
        self._holds += 1
        self._open.clear()
        try:
            yield
        finally:
            self._holds -= 1
            if self._holds == 0:
                self._open.set()

    @property
    def in_flight(self) -> int:
        """Ends published and not yet acked."""
        return len(self._queue)

    async def complete(self, delivery: Delivery[TaskMessage], result: ResultMessage) -> None:
        """Publishes the task's result; acks once it is confirmed."""
        results = self.pipes.results_for(delivery)
        try:
            confirmation = await results.send(result)
        except PipeError as exc:
            if exc.retryable or isinstance(exc, PipeClosed):
                raise
            # The result itself cannot be sent (e.g. too large): report that as the outcome.
            error = ErrorInfo(type(exc).__name__, f"result could not be sent: {exc}")
            result = ResultMessage(
                result.task_id, False, None, error, result.daemon_id, result.seconds, result.attempts
            )
            confirmation = await results.send(result)
        self._settle_later(delivery, [confirmation], "result", result.ok, gave_up=False)
        if len(self._queue) == 1 and not self._holding_results():
            await let_out()  # the only end on its way: it leaves before the worker goes on

    async def complete_many(self, ends: Sequence[tuple[Delivery[TaskMessage], ResultMessage]]) -> None:
        """Publishes several tasks' results, in order, through the results stack in as few calls
        as it takes (see :mod:`truba.pipes.batch`); acks each once it is confirmed, as
        :meth:`complete` would. A result the stack does not take in a batch (it cannot be sent,
        or must wait) goes through :meth:`complete` on its own, with its error handling."""
        sender = self.pipes.results_for(ends[0][0])
        if any(self.pipes.results_for(delivery) is not sender for delivery, _ in ends):
            for end in ends:  # lone tasks and frame members together (not a chunk's): one by one
                await self.complete(*end)
            return
        results = [result for _, result in ends]
        context = contextvars.copy_context()  # the ends of a chunk share their log context
        queue, done = self._queue, 0
        while done < len(ends):
            try:
                confirmations = await send_many(sender, results[done:])
            except PipeError:
                await self.complete(*ends[done])
                done += 1
                continue
            for (delivery, result), confirmation in zip(ends[done:], confirmations, strict=False):
                queue.append(_End(delivery, [confirmation], "result", result.ok, False, context))
            done += len(confirmations)
            self._start_acker()
        if len(queue) == len(ends) and not self._holding_results():
            await let_out()  # the only ends on their way: they leave before the worker goes on

    def _holding_results(self) -> bool:
        """Results wait for a frame (a worker runs chunks of short tasks): none leaves alone now."""
        frames = self.pipes.result_frames
        return frames is not None and frames.holding

    async def requeue(self, delivery: Delivery[TaskMessage], task: TaskMessage, reason: str) -> None:
        """Publishes ``task`` (with its attempt count) to its queue as a new copy; acks the
        original once the copy is confirmed, and for a frame member records the hand-back after
        that, without waiting for it (see the module docstring)."""
        copy = dataclasses.replace(task, copy_id=new_copy_id())
        confirmation = await self.pipes.requeue.send(copy)
        self.stats.requeued += 1
        log.debug("daemon.task.requeued", extra={"reason": reason, "attempts": task.attempts})
        records = self.pipes.handed_back
        if records is not None and delivery.framed:
            record = HandedBack(task.task_id, delivery.message.copy_id, copy.copy_id)
            confirmation.add_done_callback(functools.partial(_record_once_copied, records, record, delivery))
        self._settle_later(delivery, [confirmation], f"requeue ({reason})", None, gave_up=False)

    async def give_up(
        self, delivery: Delivery[TaskMessage], task: TaskMessage, attempts: int, error: ErrorInfo
    ) -> None:
        """Keeps the task in the dead-letter queue and tells the client; acks once both are confirmed."""
        record = GaveUpRecord(task.task_id, attempts, error, self.daemon_id, TaskCodec().encode(task))
        dead = await self.pipes.dead.send(record)
        result = ResultMessage(task.task_id, False, None, error, self.daemon_id, 0.0, attempts, gave_up=True)
        told = await self.pipes.results_for(delivery).send(result)
        self.events.gave_up()
        self._settle_later(delivery, [dead, told], "give-up", False, gave_up=True)

    def _settle_later(
        self,
        delivery: Delivery[TaskMessage],
        confirmations: Sequence[Confirmation],
        what: str,
        ok: bool | None,
        *,
        gave_up: bool,
    ) -> None:
        # The acker logs each end in the context of the task it belongs to (its ids, its slot):
        # not in that of the task it was started for.
        self._queue.append(_End(delivery, confirmations, what, ok, gave_up, contextvars.copy_context()))
        self._start_acker()

    def _start_acker(self) -> None:
        if self._acker is None or self._acker.done():
            self._acker = asyncio.create_task(self._ack_in_order())

    async def _ack_in_order(self) -> None:
        """Acks (or rejects) each end once its confirms came, oldest first, until none is left.

        Under load most ends are confirmed by their turn (a frame's confirm settles every result
        in it): those are acked here directly, without a coroutine per end for the wait, and a
        run of them in one call (:meth:`_ack_confirmed`)."""
        queue, is_open = self._queue, self._open.is_set
        while queue:
            end = queue[0]
            if is_open() and _confirmed(end.confirmations):
                await self._ack_confirmed(counted=0)
                continue
            try:
                confirmed = await self._confirm_in_turn(end)
            except BaseException:
                queue.popleft()
                self._fewer.set()
                raise
            if confirmed:  # acked with the run of confirmed ends behind it
                await self._ack_confirmed(counted=1)
            else:
                queue.popleft()
                self._fewer.set()

    async def _ack_confirmed(self, counted: int) -> None:
        """Acks the run of ends at the head of the queue whose confirms all came (the first
        ``counted`` of them told and counted already), at most :data:`ACK_RUN`, in one call
        through the task stack (see :mod:`truba.pipes.batch`)."""
        queue, run = self._queue, 0
        deliveries: list[Delivery[TaskMessage]] = []
        for end in queue:
            if run == ACK_RUN or not (run < counted or _confirmed(end.confirmations)):
                break
            if run >= counted:
                self._count_confirmed(end, 0.0)
            run += 1
            deliveries.append(end.delivery)
        try:
            for error in await ack_many(self.pipes.tasks, deliveries):
                _dropped(error)
            settled = self.events.settled
            for end in itertools.islice(queue, run):
                settled(end.delivery.message.task_id, end.what, acked=True, context=end.context)
        finally:
            for _ in range(run):
                queue.popleft()
            self._fewer.set()

    async def _confirm_in_turn(self, end: _End) -> bool:
        """Waits for the confirms of ``end`` (the oldest), then for no hold: True once they all
        came (told and counted; the caller acks it); False if one failed (then the end was
        rejected with requeue here, and told)."""
        delivery, what, context = end.delivery, end.what, end.context
        task_id = delivery.message.task_id
        started = time.perf_counter()
        try:
            for confirmation in end.confirmations:
                await confirmation
        except PipeError as exc:
            fields = {"task_id": task_id, "what": what, "error": repr(exc)}
            context.run(log.warning, "daemon.task.unconfirmed", extra=fields)
            self.events.settled(task_id, what, acked=False, context=context)
            await self._open.wait()
            await settle(delivery.reject(requeue=True))
            if exc.retryable:
                self.on_broken(exc)
            return False
        self._count_confirmed(end, time.perf_counter() - started)
        if not self._open.is_set():  # held (the common case is not: no coroutine for it then)
            await self._open.wait()
        return True

    def _count_confirmed(self, end: _End, waited: float) -> None:
        """Tells and counts an end whose confirms all came, ``waited`` seconds after its turn."""
        self.events.confirmed(end.delivery.message.task_id, end.what, waited, end.context)
        stats, ok = self.stats, end.ok
        if ok is True:
            stats.done += 1
        elif ok is False:
            stats.failed += 1
        if end.gave_up:
            stats.gave_up += 1

    async def wait(self, limit: int = 0, timeout: float | None = None) -> bool:
        """Waits until at most ``limit`` ends are in flight; False if ``timeout`` passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while len(self._queue) > limit:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            self._fewer.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._fewer.wait(), left)
        return True


@dataclass(slots=True)
class _End:
    """One end awaiting its confirms, then its ack."""

    delivery: Delivery[TaskMessage]
    confirmations: Sequence[Confirmation]
    what: str
    ok: bool | None
    gave_up: bool
    context: contextvars.Context
    """The log context it was published in (its task's ids)."""


def _confirmed(confirmations: Sequence[Confirmation]) -> bool:
    """Every one came, and none failed."""
    for confirmation in confirmations:
        if not confirmation.done() or confirmation.cancelled() or confirmation.exception() is not None:
            return False
    return True


def _record_once_copied(
    records: JobRecords, record: HandedBack, delivery: Delivery[TaskMessage], copied: Confirmation
) -> None:
    """Queues the hand-back record once the copy is confirmed: never before (a member is skipped
    only when its copy is in the queue), never if it failed (the put-back's failure, handled by
    the acker); not sent if the member's frame is settled by its turn (see
    :mod:`truba.daemon.hand_back_records`)."""
    if not copied.cancelled() and copied.exception() is None:
        records.record(record, lambda: delivery.framed)


async def settle(action: Awaitable[None]) -> None:
    """Acks/rejects; a dead channel means the broker has already requeued the task."""
    try:
        await action
    except PipeError as exc:
        _dropped(exc)


def _dropped(exc: PipeError) -> None:
    log.info("daemon.task.settle_dropped", extra={"error": repr(exc)})
