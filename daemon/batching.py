"""Batch handlers on the daemon side: collecting a batch, and running it in a slot under watch.

A batch handler (see :mod:`truba.handlers`) takes up to ``max_size`` tasks per call. A worker
that got its first delivery keeps taking more, without waiting past ``max_wait`` after the first,
then runs them as one call on its slot; every task still ends on its own (result, requeue or
give-up through :mod:`truba.daemon.ends`).

The whole batch is one attempt for each of its tasks: a timeout, the memory limit or a crash
spends an attempt of every task in it; an interrupt (preemption) puts all back unspent; a reply
gives each task its own outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from truba.daemon.slots import SlotDied, SlotProcess
from truba.daemon.supervise import MEMORY_POLL, MIB, AttemptEnd, Ending, Limits
from truba.handlers import BatchSpec
from truba.pipes.base import Delivery, Listener
from truba.wire import ErrorInfo, TaskMessage

T = TypeVar("T")


async def collect(
    tasks: Listener[TaskMessage],
    first: Delivery[TaskMessage],
    spec: BatchSpec,
    stop: Callable[[], bool] = lambda: False,
) -> list[Delivery[TaskMessage]]:
    """``first`` and whatever else arrives, up to ``spec.max_size`` and for at most
    ``spec.max_wait`` seconds after the call; earlier once ``stop()`` is true."""
    batch = [first]
    deadline = time.monotonic() + spec.max_wait
    while len(batch) < spec.max_size and not stop():
        delivery = await tasks.get(max(0.0, deadline - time.monotonic()))
        if delivery is None:
            break
        batch.append(delivery)
    return batch


async def supervised(
    slot: SlotProcess, call: Coroutine[Any, Any, T], limits: Limits, interrupt: asyncio.Event
) -> tuple[AttemptEnd, T | None]:
    """Runs ``call`` (a request to ``slot``) like :func:`~truba.daemon.supervise.run_attempt` runs a
    task: the reply, the slot's death, the timeout, the memory limit or the interrupt ends it, and
    the slot is restarted after the last three. The value is returned next to a REPLIED end."""
    started = time.perf_counter()
    running = asyncio.ensure_future(call)
    interrupted = asyncio.ensure_future(interrupt.wait())
    watching = asyncio.ensure_future(_watch_memory(slot, limits.memory)) if limits.memory else None
    waits: set[asyncio.Future[Any]] = {running, interrupted}
    if watching is not None:
        waits.add(watching)
    try:
        done, _ = await asyncio.wait(waits, timeout=limits.timeout, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        running.cancel()  # kills the slot
        raise
    finally:
        interrupted.cancel()
        if watching is not None:
            watching.cancel()
    if running in done:
        return _finished(running, time.perf_counter() - started)
    running.cancel()  # kills the slot; a reply that arrived meanwhile still wins
    with contextlib.suppress(asyncio.CancelledError, SlotDied):
        await running
    seconds = time.perf_counter() - started
    if not running.cancelled():
        return _finished(running, seconds)
    await slot.start()
    if watching is not None and watching in done:
        error = ErrorInfo(
            "MemoryLimitExceeded",
            f"the slot's private memory reached {watching.result() / MIB:.0f} MiB, over the limit of "
            f"{(limits.memory or 0) / MIB:.0f} MiB; the slot was killed",
        )
        return AttemptEnd(Ending.OUT_OF_MEMORY, seconds, error=error), None
    if interrupted in done:
        return AttemptEnd(Ending.INTERRUPTED, seconds), None
    error = ErrorInfo("TaskTimeout", f"the batch ran longer than {limits.timeout:g} s; the slot was killed")
    return AttemptEnd(Ending.TIMED_OUT, seconds, error=error), None


def _finished(running: asyncio.Future[T], seconds: float) -> tuple[AttemptEnd, T | None]:
    exc = running.exception()
    if isinstance(exc, SlotDied):
        return AttemptEnd(Ending.DIED, seconds, error=ErrorInfo("SlotDied", str(exc))), None
    if exc is not None:
        raise exc
    return AttemptEnd(Ending.REPLIED, seconds), running.result()


async def _watch_memory(slot: SlotProcess, limit: int | None) -> int:
    assert limit is not None
    while True:
        await asyncio.sleep(MEMORY_POLL)
        used = slot.private_memory()
        if used is not None and used > limit:
            return used
