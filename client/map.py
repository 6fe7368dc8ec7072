"""``map``: submit every payload of an iterable, close the job, and yield one outcome per payload.

A window bounds the tasks submitted and not yet yielded, so memory stays bounded however many
payloads there are; payloads are read lazily, by a producer task beside the outcome loop. A
submit that fails (a payload that cannot be encoded or is too large, or the payloads' iterable
raising) stops the map with its error at once and cancels the job the map was driving, so that
it does not stay open, holding slots, half submitted. A map stopped by its consumer (a ``break``,
Ctrl-C) or by an unreachable cluster (Unavailable) leaves the job running and resumable; a map
on a job closed before raises PipeClosed and leaves the job as it was.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Iterable, Sized
from typing import Final, NoReturn, Protocol

from tqdm import tqdm

from truba.client.errors import Unavailable
from truba.client.outcome import Outcome
from truba.pipes.errors import PipeClosed

MAP_WINDOW: Final = 1000
"""Tasks :func:`map_outcomes` keeps submitted and not yet yielded, by default."""


class Mappable(Protocol):
    """What :func:`map_outcomes` needs of a job (:class:`~truba.client.job.Job` has it)."""

    @property
    def id(self) -> str: ...

    async def submit(self, payload: object) -> str: ...

    async def close(self) -> None: ...

    async def cancel_quietly(self, cause: BaseException | None) -> None: ...

    def results(self) -> AsyncGenerator[Outcome, None]: ...


async def map_outcomes(
    job: Mappable,
    payloads: Iterable[object] | AsyncIterable[object],
    *,
    ordered: bool = True,
    window: int = MAP_WINDOW,
    progress: bool | None = None,
) -> AsyncGenerator[Outcome, None]:
    """Submits every payload to ``job``, closes it, and yields one outcome per payload.

    At most ``window`` tasks are submitted and not yet yielded. With ``ordered`` (the default)
    outcomes come in the order of ``payloads``; otherwise as they arrive. Outcomes of tasks
    submitted before (an earlier run on a resumed job) are taken but not yielded. ``progress``
    shows a progress bar (tqdm, on stderr); by default when stderr is a terminal.

    Raises whatever ``submit`` raises for a payload, or ``payloads`` raises, after cancelling
    the job (the tasks submitted before get cancelled outcomes, which are not yielded).
    """
    if window < 1:
        raise ValueError(f"window: must be at least 1, got {window}")
    if progress is None:
        progress = sys.stderr.isatty()
    room = asyncio.Semaphore(window)
    index_of: dict[str, int] = {}

    async def produce() -> None:
        n = 0
        async for payload in _aiter(payloads):
            await room.acquire()
            index_of[await job.submit(payload)] = n
            n += 1
        await job.close()

    producer = asyncio.create_task(produce(), name=f"map-{job.id}")
    bar = _progress_bar(progress, job.id, len(payloads) if isinstance(payloads, Sized) else None)
    waiting: dict[int, Outcome] = {}
    next_index = 0
    try:
        async for outcome in _until_done(job.results(), producer):
            index = index_of.pop(outcome.task_id, None)
            if index is None:
                continue  # a task of an earlier run of this job, not of this map
            if bar is not None:
                bar.update(1)
            if not ordered:
                room.release()
                yield outcome
                continue
            waiting[index] = outcome
            while next_index in waiting:
                room.release()
                yield waiting.pop(next_index)
                next_index += 1
        await producer  # raises what a submit raised
    except Exception as exc:
        if producer.done() and not producer.cancelled() and producer.exception() is exc:
            # Not for a cluster out of reach (resume later) or a job closed before (not ours).
            if not isinstance(exc, Unavailable | PipeClosed):
                await job.cancel_quietly(exc)
        raise
    finally:
        if not producer.done():
            producer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await producer
        if bar is not None:
            bar.close()


async def _aiter(items: Iterable[object] | AsyncIterable[object]) -> AsyncIterator[object]:
    if isinstance(items, AsyncIterable):
        async for item in items:
            yield item
    else:
        for item in items:
            yield item


async def _until_done(
    outcomes: AsyncGenerator[Outcome, None], producer: asyncio.Task[None]
) -> AsyncGenerator[Outcome, None]:
    """``outcomes``, but raises the producer's error as soon as it fails (the job then never
    gets closed, so ``outcomes`` alone would not end)."""
    step: asyncio.Future[Outcome] | None = None
    try:
        while True:
            step = asyncio.ensure_future(anext(outcomes))
            if not producer.done():
                await asyncio.wait([step, producer], return_when=asyncio.FIRST_COMPLETED)
                if not step.done() and producer.exception() is not None:
                    raise producer.exception()  # type: ignore[misc]
            try:
                outcome = await step
            except StopAsyncIteration:
                return
            yield outcome
    finally:
        # A step still running (we were cancelled, or the producer failed) is stopped first:
        # the outcomes' generator cannot be closed while it runs.
        if step is not None and not step.done():
            step.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await step
        await outcomes.aclose()


def _progress_bar(show: bool, job_id: str, total: int | None) -> tqdm[NoReturn] | None:
    return tqdm(desc=f"job {job_id}", total=total, unit="task", file=sys.stderr) if show else None
