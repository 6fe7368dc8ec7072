"""One attempt of a task in a slot, under watch: a hard timeout, a hard memory limit, an interrupt.

Whichever comes first ends the attempt: the slot's reply, the slot's death, the timeout, the
memory limit (sampled every :data:`MEMORY_POLL` seconds) or the interrupt (preemption, stop).
In the last three cases the slot is killed and started afresh, so it is ready for the next task
as soon as this returns. A reply that races with an interrupt wins: finished work is kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from truba.daemon.slot_process import SlotDied, SlotProcess, SlotReply
from truba.wire import ErrorInfo

log = logging.getLogger(__name__)
MEMORY_POLL: Final = 0.2
MIB: Final = 1024 * 1024
T = TypeVar("T")


class Ending(enum.Enum):
    REPLIED = "replied"
    """The handler returned or raised: the reply is the task's outcome."""
    DIED = "died"
    """The slot process exited (the handler crashed it, or something killed it): spent."""
    TIMED_OUT = "timed_out"
    """It ran longer than the task timeout: spent."""
    OUT_OF_MEMORY = "out_of_memory"
    """The slot's private memory passed the hard limit: spent."""
    INTERRUPTED = "interrupted"
    """Stopped on purpose (preemption, stop): not spent."""


@dataclass(slots=True)
class AttemptEnd:
    """How an attempt ended; ``reply`` for REPLIED, ``error`` for the endings that spend it."""

    ending: Ending
    seconds: float
    reply: SlotReply | None = None
    error: ErrorInfo | None = None


class Interrupt:
    """A flag a runner raises to stop a worker's attempt now (preemption, stop).

    Like an ``asyncio.Event``, but it calls back on ``set`` instead of waking waiting tasks: an
    attempt under watch then costs no task of its own (at thousands of tasks a second, that
    counts).
    """

    def __init__(self) -> None:
        self._set = False
        self._callbacks: list[Callable[[], None]] = []

    def set(self) -> None:
        if self._set:
            return
        self._set = True
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def clear(self) -> None:
        self._set = False

    def is_set(self) -> bool:
        return self._set

    def on_set(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Calls ``callback`` at the next ``set`` (at once if set); returns what unregisters it."""
        if self._set:
            callback()
            return _nothing
        self._callbacks.append(callback)
        return functools.partial(_discard, self._callbacks, callback)


def _discard(callbacks: list[Callable[[], None]], callback: Callable[[], None]) -> None:
    with contextlib.suppress(ValueError):
        callbacks.remove(callback)


def _nothing() -> None:
    pass


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-attempt limits: ``timeout`` seconds, ``memory`` bytes of private memory (None: none)."""

    timeout: float | None = None
    memory: int | None = None


async def run_attempt(
    slot: SlotProcess,
    handler: str,
    task_id: str,
    payload: object,
    limits: Limits,
    interrupt: Interrupt,
) -> AttemptEnd:
    """Runs one attempt on ``slot``; see the module docstring. Never raises SlotDied."""
    end, reply = await supervised(slot, slot.run(handler, task_id, payload), limits, interrupt)
    return end if reply is None else AttemptEnd(end.ending, end.seconds, reply=reply)


async def supervised(
    slot: SlotProcess,
    call: Coroutine[Any, Any, T],
    limits: Limits,
    interrupt: Interrupt,
    *,
    what: str = "attempt",
) -> tuple[AttemptEnd, T | None]:
    """Runs ``call`` (a request to ``slot``: a task, a batch, a describe) under watch; see the
    module docstring. The call's value comes next to a REPLIED end; ``what`` names it in the
    timeout error. Never raises SlotDied.

    The call runs in the caller's own task (no task, future or done callback of its own: at
    thousands of tasks a second, each costs a turn of the event loop): the watch ends it by
    cancelling that task, and tells its own cancellation from a real one by the task's count of
    cancel requests (:meth:`asyncio.Task.uncancel`); a real one propagates.
    """
    if slot.cold or not slot.alive:  # its start is not the attempt's: the clock starts once it is up
        try:
            await slot.warm()
        except BaseException:
            call.close()
            raise
    started = time.perf_counter()
    if interrupt.is_set():  # before it began; a chunk's replies may still be due: a fresh slot
        call.close()
        await slot.kill()
        await slot.start()
        return AttemptEnd(Ending.INTERRUPTED, time.perf_counter() - started), None
    watch = _Watch(slot, limits, interrupt)
    try:
        value = await call
    except asyncio.CancelledError:
        watch.stop()
        if not watch.cancelled or watch.task.uncancel() > 0:  # a real cancellation (too)
            raise
    except SlotDied as exc:
        watch.stop()
        watch.settle()
        died = ErrorInfo("SlotDied", str(exc))
        return AttemptEnd(Ending.DIED, time.perf_counter() - started, error=died), None
    except BaseException:
        watch.stop()
        watch.settle()
        raise
    else:  # replied: a reply that raced with the others wins (see _Watch.end)
        watch.stop()
        watch.settle()
        return AttemptEnd(Ending.REPLIED, time.perf_counter() - started), value
    # Stopped by the watch: the call killed the slot as it was cancelled (or it is dead already).
    await slot.kill()
    seconds = time.perf_counter() - started
    await slot.start()
    why = watch.why
    if why is Ending.OUT_OF_MEMORY:
        error = ErrorInfo(
            "MemoryLimitExceeded",
            f"the slot's private memory reached {watch.used / MIB:.0f} MiB, over the limit of "
            f"{(limits.memory or 0) / MIB:.0f} MiB; the slot was killed",
        )
        return AttemptEnd(Ending.OUT_OF_MEMORY, seconds, error=error), None
    if why is Ending.INTERRUPTED:
        return AttemptEnd(Ending.INTERRUPTED, seconds), None
    error = ErrorInfo("TaskTimeout", f"the {what} ran longer than {limits.timeout:g} s; the slot was killed")
    return AttemptEnd(Ending.TIMED_OUT, seconds, error=error), None


class _Watch:
    """The timeout, the memory limit (a timer every :data:`MEMORY_POLL` s) and the interrupt over
    a call awaited by the current task: the first one to come cancels the task (``why`` says
    which), unless the slot's reply is here already (the task is about to take it): then the
    reply wins, and the call returns it."""

    __slots__ = ("task", "why", "cancelled", "used", "_slot", "_limit", "_loop", "_timer", "_poll", "_forget")

    def __init__(self, slot: SlotProcess, limits: Limits, interrupt: Interrupt) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.task = task
        self.why: Ending | None = None
        self.cancelled = False
        """True once it cancelled the task (one cancel request of the task's count is its own)."""
        self.used = 0
        """The slot's private memory when it passed the limit."""
        self._slot, self._limit = slot, limits.memory
        self._loop = loop = asyncio.get_running_loop()
        self._timer = loop.call_later(limits.timeout, self.end, Ending.TIMED_OUT) if limits.timeout else None
        self._poll = loop.call_later(MEMORY_POLL, self._check_memory) if limits.memory else None
        self._forget = interrupt.on_set(functools.partial(self.end, Ending.INTERRUPTED))

    def end(self, why: Ending) -> None:
        if self.why is not None:
            return
        self.why = why
        self.stop()
        if not self._slot.reply_here:
            self.cancelled = True
            self.task.cancel()

    def stop(self) -> None:
        """Disarms it (idempotent)."""
        self._forget()
        if self._timer is not None:
            self._timer.cancel()
        if self._poll is not None:
            self._poll.cancel()

    def settle(self) -> None:
        """After a call that ended on its own although this cancelled it: its cancel request is
        taken back; a real one still pending is raised."""
        if self.cancelled and self.task.uncancel() > 0:
            raise asyncio.CancelledError

    def _check_memory(self) -> None:
        used = self._slot.private_memory()
        if used is not None and self._limit is not None and used > self._limit:
            self.used = used
            self.end(Ending.OUT_OF_MEMORY)
        elif self.why is None:
            self._poll = self._loop.call_later(MEMORY_POLL, self._check_memory)
