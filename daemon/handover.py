"""The ways admitted tasks reach a slot, and how each task's attempt ended from the slot's answer.

- :data:`ONE_TASK`: one request, one reply.
- :data:`CHUNKED`: several short tasks handed over in one write (one wake-up of the slot process
  for them all, see :meth:`~truba.daemon.slot_process.SlotProcess.send`). The slot runs them in order
  and replies to each as it ends; each reply is read under its own watch (timeout, memory,
  interrupt) from the previous one's (:func:`next_reply`). When one ends without a reply, the
  slot is gone: the ones after it never started.
- :data:`BATCHED`: one call of a batch handler over all of them (:mod:`truba.daemon.batching`):
  the whole batch is one attempt for each of its tasks; a reply gives each task its own outcome.

:meth:`truba.daemon.execution.Execution.execute` runs any of them and ends each task.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, Final, Protocol, TypeVar, final

from truba.daemon.slot_process import SlotProcess, SlotReply
from truba.daemon.supervise import AttemptEnd, Ending, Interrupt, Limits, supervised
from truba.pipes.base import Delivery
from truba.wire import TaskMessage

T = TypeVar("T")
Admitted = tuple[Delivery[TaskMessage], int]
"""A delivery to run now, with the attempts its task has spent."""


class Handover(Protocol[T]):
    """How admitted tasks reach a slot (``hand_over``, run under watch), and how each one's
    attempt ended (``end``)."""

    @property
    def what(self) -> str:
        """Names the request in a timeout error."""
        ...

    @property
    def streams(self) -> bool:
        """The slot replies task by task, running the next ones meanwhile (a chunk): it is busy
        until the last reply, and the first task to end without one leaves the rest unstarted."""
        ...

    def hand_over(self, slot: SlotProcess, handler: str, admitted: list[Admitted]) -> Coroutine[Any, Any, T]:
        """The request that hands the tasks to ``slot``."""
        ...

    def end(self, index: int, count: int, handed: AttemptEnd, value: T | None) -> AttemptEnd | None:
        """How task ``index`` (of ``count``) ended, from how the request ended and what it
        returned (``value``, None unless it replied); None: its reply is still to come (read
        it with :func:`next_reply`)."""
        ...


@final
class OneTask:
    """One task, one request, one reply."""

    what: Final = "attempt"
    streams: Final = False

    def hand_over(
        self, slot: SlotProcess, handler: str, admitted: list[Admitted]
    ) -> Coroutine[Any, Any, SlotReply]:
        task = admitted[0][0].message
        return slot.run(handler, task.task_id, task.payload)

    def end(self, index: int, count: int, handed: AttemptEnd, value: SlotReply | None) -> AttemptEnd:
        return handed if value is None else AttemptEnd(handed.ending, handed.seconds, reply=value)


@final
class Chunk:
    """Short tasks in one write, a reply each as it ends (see the module docstring)."""

    what: Final = "attempt"
    streams: Final = True

    def hand_over(
        self, slot: SlotProcess, handler: str, admitted: list[Admitted]
    ) -> Coroutine[Any, Any, None]:
        return slot.send(handler, [(d.message.task_id, d.message.payload) for d, _ in admitted])

    def end(self, index: int, count: int, handed: AttemptEnd, value: None) -> AttemptEnd | None:
        # Handed over: each task's reply comes on its own. Else the hand-over itself failed,
        # and that is how the first task ended.
        return None if handed.ending is Ending.REPLIED else handed


async def next_reply(
    slot: SlotProcess, task: TaskMessage, spent: int, limits: Limits, interrupt: Interrupt
) -> AttemptEnd:
    """How the next task of a chunk ended: its reply if the slot sent it already (taken at
    once, even if an interrupt came meanwhile: finished work is kept), else what the watch
    over the wait for it says."""
    end = reply_at_hand(slot)
    if end is not None:
        return end
    end, reply = await supervised(slot, slot.reply(task.task_id), limits, interrupt)
    return AttemptEnd(end.ending, end.seconds, reply, end.error)


def reply_at_hand(slot: SlotProcess) -> AttemptEnd | None:
    """How the next task of a chunk ended if its reply is here already (else None: wait for it
    with :func:`next_reply`)."""
    reply = slot.reply_at_hand()
    return None if reply is None else AttemptEnd(Ending.REPLIED, reply.seconds, reply)


@final
class Batch:
    """One call of a batch handler for all the tasks (see the module docstring)."""

    what: Final = "batch"
    streams: Final = False

    def hand_over(
        self, slot: SlotProcess, handler: str, admitted: list[Admitted]
    ) -> Coroutine[Any, Any, list[SlotReply]]:
        return slot.run_batch(handler, [(d.message.task_id, d.message.payload) for d, _ in admitted])

    def end(self, index: int, count: int, handed: AttemptEnd, value: list[SlotReply] | None) -> AttemptEnd:
        if value is None:  # the whole batch timed out, died, ... or was interrupted
            return handed
        return AttemptEnd(Ending.REPLIED, handed.seconds / count, reply=value[index])


ONE_TASK: Final = OneTask()
CHUNKED: Final = Chunk()
BATCHED: Final = Batch()
