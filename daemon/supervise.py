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


@dataclass(frozen=True, slots=True)
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
    timeout error. Never raises SlotDied."""
    started = time.perf_counter()
    loop = asyncio.get_running_loop()
    running = asyncio.ensure_future(call)
    ended: asyncio.Future[Ending] = loop.create_future()

    def end(why: Ending) -> None:
        if not ended.done():
            ended.set_result(why)

    running.add_done_callback(lambda _: end(Ending.REPLIED))
    timer = loop.call_later(limits.timeout, end, Ending.TIMED_OUT) if limits.timeout else None
    forget = interrupt.on_set(functools.partial(end, Ending.INTERRUPTED))
    watching = None
    if limits.memory:
        watching = asyncio.ensure_future(_watch_memory(slot, limits.memory))
        watching.add_done_callback(lambda w: None if w.cancelled() else end(Ending.OUT_OF_MEMORY))
    try:
        why = await ended
    except asyncio.CancelledError:
        running.cancel()  # kills the slot
        raise
    finally:
        forget()
        if timer is not None:
            timer.cancel()
        if watching is not None:
            watching.cancel()
    if running.done():  # a reply that raced with the others wins
        return _finished(running, time.perf_counter() - started)
    # Stop it: cancelling the run kills the slot; a reply that arrived meanwhile still wins.
    running.cancel()
    with contextlib.suppress(asyncio.CancelledError, SlotDied):
        await running
    seconds = time.perf_counter() - started
    if not running.cancelled():  # it ended on its own meanwhile: replied or died
        return _finished(running, seconds)
    await slot.start()
    if why is Ending.OUT_OF_MEMORY:
        assert watching is not None
        used = watching.result()
        error = ErrorInfo(
            "MemoryLimitExceeded",
            f"the slot's private memory reached {used / MIB:.0f} MiB, over the limit of "
            f"{(limits.memory or 0) / MIB:.0f} MiB; the slot was killed",
        )
        return AttemptEnd(Ending.OUT_OF_MEMORY, seconds, error=error), None
    if why is Ending.INTERRUPTED:
        return AttemptEnd(Ending.INTERRUPTED, seconds), None
    error = ErrorInfo("TaskTimeout", f"the {what} ran longer than {limits.timeout:g} s; the slot was killed")
    return AttemptEnd(Ending.TIMED_OUT, seconds, error=error), None


def _finished(running: asyncio.Future[T], seconds: float) -> tuple[AttemptEnd, T | None]:
    exc = running.exception()
    if isinstance(exc, SlotDied):
        return AttemptEnd(Ending.DIED, seconds, error=ErrorInfo("SlotDied", str(exc))), None
    if exc is not None:
        raise exc
    return AttemptEnd(Ending.REPLIED, seconds), running.result()


async def _watch_memory(slot: SlotProcess, limit: int | None) -> int:
    """Returns the slot's private memory once it passes ``limit`` (never, while under it)."""
    assert limit is not None
    while True:
        await asyncio.sleep(MEMORY_POLL)
        used = slot.private_memory()
        if used is not None and used > limit:
            return used
