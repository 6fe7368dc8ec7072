"""A job's submission: every task goes into the journal, out through the task pipe, and is
watched until a broker confirms it.

A task is recorded in the journal (:mod:`truba.client.journal`) before it is sent, so nothing a
caller was told is submitted can be lost. A confirm marks it confirmed in the journal; a failed
confirm (a nack, a broker gone) puts it aside, and :meth:`Submission.confirm_all` (at close)
sends those again, for at most :data:`RESEND_ROUNDS` rounds. A resumed job sends at once what no
broker confirmed before the crash. A broker found to have lost its data (:class:`LossWatch`: the
job's marker queue is gone) may have held any task still without an outcome, its task or its
result: every one is sent again (a key's held tasks excepted: :mod:`truba.client.key_order`),
once however many brokers were found lost together, and not while its last send still waits
for its confirm (the pipes carry that one to a live broker); the result stream drops the
duplicate outcomes.

Waits on the brokers (a send, the confirms at close) end with
:class:`~truba.client.errors.Unavailable` once every broker has been unreachable for the
client's patience (:class:`~truba.client.reach.Reach`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Final, final

from truba import trace
from truba.client.delays import DelayedCount, due_time
from truba.client.encoded import EncodedTask, EncodedTaskCodec
from truba.client.errors import Unavailable
from truba.client.journal import TaskJournal
from truba.client.key_order import KeyOrder
from truba.client.keys import check_key
from truba.client.lifecycle import JobStatus
from truba.client.reach import Reach
from truba.client.watch import LossWatch
from truba.errors import TrubaError
from truba.pipes.base import Confirmation, Sender
from truba.pipes.broker import Broker
from truba.pipes.errors import CodecError, MessageTooLarge, PipeClosed, PipeError
from truba.pipes.outbound import let_out
from truba.queues import MAX_PRIORITY

log = logging.getLogger(__name__)

RESEND_ROUNDS: Final = 5
"""Rounds of sending again what brokers nacked or lost, at close, before giving up."""
RESEND_CHUNK: Final = 1000
"""Tasks read back from the journal at a time when sending many again."""


class SubmitTimeout(TrubaError, TimeoutError):
    """``submit(timeout=...)`` ran out before a broker took the task; it was not submitted."""


@final
class Submission:
    """Submits a job's tasks and sees each one confirmed (or sent again); see the module.

    ``on_change`` is called whenever the journal's count of tasks changed here (progress).
    """

    def __init__(
        self,
        job_id: str,
        tasks: Sender[EncodedTask],
        journal: TaskJournal,
        status: JobStatus,
        *,
        links: Sequence[Broker],
        marker: str,
        resumed: bool,
        priorities: bool,
        max_payload: int,
        on_change: Callable[[], None],
        reach: Reach,
    ) -> None:
        self._job_id = job_id
        self._reach = reach
        self._submitting = f"submit to job {job_id}"
        """What a submit is, in an Unavailable's message (made once: submit is the hot path)."""
        self._tasks = tasks
        self._journal = journal
        self._status = status
        self._priorities = priorities
        self._max_payload = max_payload
        self._on_change = on_change
        self._prefix = secrets.token_hex(3)
        self._next = 0
        self._confirmations: dict[Confirmation, list[str]] = {}
        """Confirms awaited, each with its tasks: the tasks of one frame share a confirmation
        (:attr:`~truba.pipes.frame.FrameSender.share_confirmations`), watched by one callback."""
        self._failed: set[str] = set()
        """Tasks whose confirm failed: sent again at close (or when a broker is lost)."""
        self.delayed = DelayedCount(on_change)
        """Delayed tasks not due yet (the progress reports say how many)."""
        self.keys = KeyOrder(job_id, self._send_task, on_change)
        """Keyed tasks held until their turn (the progress reports count them as delayed)."""
        self.watch = LossWatch(links, marker, self._brokers_lost, job_id=job_id, known=resumed, reach=reach)

    async def start(self) -> None:
        """Starts watching for lost brokers, and sends what no broker confirmed (a resumed job);
        every task without an outcome if a broker lost the job's data meanwhile."""
        unconfirmed = self._journal.unconfirmed()
        keyed = self._journal.take_keyed()
        self.keys.rebuild(keyed, {task_id for task_id, _, _ in keyed} - set(unconfirmed))
        lost = await self.watch.start()
        if len(self._journal):
            self._on_change()  # a resumed job: the scheduler hears from its client again
        if lost:
            await self._brokers_lost(lost)
            return
        # A key's held tasks were never sent, and the older ones had their outcomes: only its head
        # may be sent (again).
        unconfirmed = [task_id for task_id in unconfirmed if not self.keys.holds(task_id)]
        if unconfirmed:
            log.info(
                "client.job.resend_unconfirmed", extra={"job_id": self._job_id, "count": len(unconfirmed)}
            )
            await self._send_again(unconfirmed)

    async def submit(
        self,
        payload: object,
        *,
        priority: int | None = None,
        timeout: float | None = None,
        delay: float | None = None,
        not_before: datetime | None = None,
        key: str | None = None,
        leave_first: bool = True,
    ) -> str:
        """Records one task, sends it, and returns its id once a broker took it; see :meth:`Job.submit`.
        A task with an order ``key`` that is not its key's head is held instead
        (:mod:`truba.client.key_order`): then it returns once the task is recorded.

        A task sent while no other awaits its confirm (one at a time) returns once it is on the
        broker's socket (:func:`~truba.pipes.outbound.let_out`), so the caller's next step runs
        while it travels. ``leave_first=False``: at once, for a caller that must register for
        the task's outcome first (a call, a group member): over in-process fakes an outcome
        could come within those loop turns."""
        # One path for every task, inline: it is the hot path (a key costs its tests only).
        due = 0.0 if delay is None and not_before is None else due_time(delay, not_before, time.time())
        if key is not None:
            check_key(key)
        if self._status.closed:
            raise PipeClosed(f"job {self._job_id} is closed: no more tasks")
        if priority is not None:
            if not self._priorities:
                raise ValueError(f"priority: job {self._job_id} was created without priorities=True")
            if not 0 <= priority <= MAX_PRIORITY:
                raise ValueError(f"priority: must be 0..{MAX_PRIORITY}, got {priority}")
        task_id = f"{self._prefix}-{self._next}"
        if trace.enabled:
            trace.mark("client.submit", task_id)
        task = EncodedTask.new(task_id, payload, priority or 0, due)
        if len(task.data) > self._max_payload:
            raise MessageTooLarge(
                f"task {task_id}: {len(task.data)} bytes encoded, over max_payload={self._max_payload}: "
                "pass large data by reference (a path or a URL); nothing was sent"
            )
        self._next += 1
        # Its outcome latency counts from now, or from its due time (on the monotonic clock).
        start = time.monotonic() + (max(0.0, due - time.time()) if due else 0.0)
        await self._journal.record(task_id, task.data, key, start)
        if key is not None and not self.keys.add(key, task):
            self._on_change()
            log.debug("client.task.held", extra={"job_id": self._job_id, "task_id": task_id})
            return task_id
        try:
            with self._reach.bounded(self._submitting):  # sync: no coroutine to enter or leave
                if timeout is None:  # the common case: no timer to arm
                    confirmation = await self._tasks.send(task)
                else:
                    async with asyncio.timeout(timeout):
                        confirmation = await self._tasks.send(task)
        except TimeoutError:
            self._withdraw(task_id, key)
            raise SubmitTimeout(
                f"task {task_id}: no broker took it within {timeout} s; it was not submitted"
            ) from None
        except (PipeError, CodecError, Unavailable):
            self._withdraw(task_id, key)
            raise
        alone = not self._confirmations  # no other task of ours on its way to a broker
        self._watch_confirm(task_id, confirmation)
        if due:
            self.delayed.add(task_id, due)
        self._on_change()
        if log.isEnabledFor(logging.DEBUG):
            log.debug("client.task.submitted", extra={"job_id": self._job_id, "task_id": task_id})
        if alone and leave_first:  # one task at a time: it leaves before the caller's next step
            await let_out()
        return task_id

    def _withdraw(self, task_id: str, key: str | None) -> None:
        """No broker took the task: it was not submitted (a key's next task, if any, goes out)."""
        self._journal.withdraw(task_id)
        if key is not None:
            self.keys.withdrawn(task_id)

    def _watch_confirm(self, task_id: str, confirmation: Confirmation) -> None:
        tasks = self._confirmations.get(confirmation)
        if tasks is None:
            self._confirmations[confirmation] = [task_id]
            confirmation.add_done_callback(self._on_confirm)
        else:
            tasks.append(task_id)  # another task of the same frame

    def _on_confirm(self, confirmation: Confirmation) -> None:
        """A confirmation came (or failed): for every task it carries, once."""
        tasks = self._confirmations.pop(confirmation, None)
        if tasks is None:  # seen already (settle_confirms)
            return
        if not confirmation.cancelled() and confirmation.exception() is None:
            if self._failed:
                self._failed.difference_update(tasks)
            self._journal.confirmed_many(tasks)
            return
        error = repr(_error_of(confirmation))
        for task_id in tasks:
            log.warning(
                "client.task.unconfirmed", extra={"job_id": self._job_id, "task_id": task_id, "error": error}
            )
        self._failed.update(tasks)

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
                await self._send_task(codec.decode(data))

    async def _send_task(self, task: EncodedTask) -> None:
        """Sends a task of the journal (again, or a key's next) and watches its confirm."""
        async with self._reach.bounded(f"send job {self._job_id}'s tasks"):
            confirmation = await self._tasks.send(task)
        self._watch_confirm(task.task_id, confirmation)
        if task.not_before:  # it waits only what is left of its delay
            self.delayed.add(task.task_id, task.not_before)

    async def _brokers_lost(self, brokers: Sequence[Broker]) -> None:
        """Brokers lost their data: every task without an outcome may have been there (its task
        or its result), so each is sent again once, unless its last send still awaits a confirm
        (the pipes see that one through); duplicate outcomes are dropped."""
        awaiting = {task_id for tasks in self._confirmations.values() for task_id in tasks}
        again = [
            task_id
            for task_id in self._journal.outstanding()
            if task_id not in awaiting and not self.keys.holds(task_id)
        ]
        log.warning(
            "client.job.resubmit",
            extra={"job_id": self._job_id, "brokers": [b.name for b in brokers], "count": len(again)},
        )
        self._journal.unmark(again)
        await self._send_again(again)

    async def settle_confirms(self) -> None:
        """Waits until every confirm now awaited has come (or failed: then put aside).

        Raises:
            Unavailable: every broker stayed unreachable for the client's patience.
        """
        async with self._reach.bounded(f"confirms of job {self._job_id}"):
            while self._confirmations:
                # wait, not gather: a wait cut short must not cancel the confirmations.
                await asyncio.wait(list(self._confirmations))
                for confirmation in list(self._confirmations):
                    if confirmation.done():  # its callback, if it has not run yet, finds it seen
                        self._on_confirm(confirmation)

    async def confirm_all(self) -> None:
        """Waits for every confirm, sending again (bounded) what a broker nacked or lost.

        Raises:
            TrubaError: tasks still unconfirmed after :data:`RESEND_ROUNDS` rounds.
        """
        for round_ in range(RESEND_ROUNDS + 1):
            await self.settle_confirms()
            if not self._failed:
                return
            if round_ == RESEND_ROUNDS:
                break
            failed = [task_id for task_id in self._journal.unconfirmed() if task_id in self._failed]
            self._tasks.drop_unconfirmed()
            log.warning(
                "client.task.resend", extra={"job_id": self._job_id, "count": len(failed), "round": round_}
            )
            await self._send_again(failed)
        unconfirmed = len(self._failed)
        raise TrubaError(f"job {self._job_id}: {unconfirmed} tasks could not be confirmed by any broker")

    async def close(self) -> None:
        """Closes the task pipe (a broken one too); idempotent. Stop :attr:`watch` first."""
        self.delayed.stop()
        await self.keys.stop()
        with contextlib.suppress(PipeError):
            await self._tasks.close()


def _error_of(confirmation: Confirmation) -> BaseException:
    return asyncio.CancelledError() if confirmation.cancelled() else confirmation.exception() or Exception()
