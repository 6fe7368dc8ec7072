"""Combinator: listen to several listeners (one per broker) as one.

A pump per inner listener moves its deliveries into one local queue; ``get`` takes from it. The
inner listeners' prefetch windows bound how much can wait there. When an inner listener breaks,
its pump keeps trying it with a growing pause (a reopen-wrapped listener comes back), and the
merged listener raises only while every inner listener fails and nothing is queued; deliveries
already taken stay valid on their own channels.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar, final

from truba.pipes.base import Delivery, Listener, close_all
from truba.pipes.errors import PipeClosed, PipeError

T = TypeVar("T")
log = logging.getLogger(__name__)
_POLL = 1.0  # seconds a pump waits on its inner listener before checking for close
_MAX_PAUSE = 2.0  # seconds at most between attempts on a failing inner listener


@final
class MergeListener(Generic[T]):
    """Deliveries of all ``listeners`` through one ``get``.

    Raises (from ``get``):
        PipeClosed: after close(), also waking a blocked get.
        PipeBroken: an inner listener broke and nothing is left to deliver.
    """

    def __init__(self, listeners: Sequence[Listener[T]]) -> None:
        if not listeners:
            raise ValueError("merge needs at least one listener")
        self._listeners = list(listeners)
        self._queue: asyncio.Queue[Delivery[T] | None] = asyncio.Queue()
        self._closed = False
        self._callback: Callable[[Delivery[T]], Awaitable[None]] | None = None
        self._failing: dict[int, PipeError] = {}
        self._pumps = [asyncio.create_task(self._pump(listener)) for listener in self._listeners]
        self._calls: set[asyncio.Task[None]] = set()
        self._cancelled = False
        self._cancelling: asyncio.Future[None] | None = None

    name = "merge"

    @property
    def inners(self) -> list[Listener[T]]:
        return list(self._listeners)

    async def _pump(self, listener: Listener[T]) -> None:
        index = self._listeners.index(listener)
        failures = 0
        while not self._closed:
            try:
                delivery = await listener.get(_POLL)
            except PipeClosed:
                return
            except PipeError as exc:
                # One failing broker must not stop the others: keep trying it (a reopen-wrapped
                # listener comes back); the merged listener fails only while every inner fails.
                self._failing[index] = exc
                log.warning("pipe.merge.inner_failed", extra={"inner": index, "error": repr(exc)})
                self._queue.put_nowait(None)  # wake a waiting get
                if not exc.retryable:
                    return
                failures += 1
                await asyncio.sleep(min(_MAX_PAUSE, 0.05 * 2 ** min(failures, 8)))
                continue
            if failures or index in self._failing:
                failures = 0
                self._failing.pop(index, None)
                log.info("pipe.merge.inner_recovered", extra={"inner": index})
            if delivery is None:
                continue
            if self._callback is not None:
                await self._call(self._callback, delivery)
            else:
                self._queue.put_nowait(delivery)

    def _all_failing(self) -> PipeError | None:
        """The latest error when every inner listener is failing, else None."""
        if len(self._failing) < len(self._listeners):
            return None
        return list(self._failing.values())[-1]

    @staticmethod
    async def _call(callback: Callable[[Delivery[T]], Awaitable[None]], delivery: Delivery[T]) -> None:
        try:
            await callback(delivery)
        except Exception as exc:
            log.error("pipe.merge.callback_failed", extra={"error": repr(exc)})
            with contextlib.suppress(PipeError):
                await delivery.reject(requeue=True)

    async def cancel(self) -> None:
        """Cancels every inner listener, stops the pumps, then takes what the inners still hold.

        Concurrent callers all wait for the one cancel under way."""
        if self._cancelling is None:
            self._cancelled = True
            self._cancelling = asyncio.ensure_future(self._cancel())
        await asyncio.shield(self._cancelling)

    async def _cancel(self) -> None:
        await asyncio.gather(*(listener.cancel() for listener in self._listeners), return_exceptions=True)
        for pump in self._pumps:
            pump.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)
        for listener in self._listeners:
            while True:
                try:
                    delivery = await listener.get(0.0)
                except PipeError:
                    break
                if delivery is None:
                    break
                self._queue.put_nowait(delivery)

    async def get(self, timeout: float) -> Delivery[T] | None:
        if self._closed:
            raise PipeClosed("merged listener is closed")
        if self._cancelled:
            while not self._queue.empty():
                item = self._queue.get_nowait()
                if item is not None:
                    return item
            return None
        failing = self._all_failing()
        if failing is not None and self._queue.empty():
            raise failing
        if not self._queue.empty():  # busy: no timer task needed
            item = self._queue.get_nowait()
        else:
            try:
                async with asyncio.timeout(timeout):
                    item = await self._queue.get()
            except TimeoutError:
                return None
        if item is None:
            if self._closed:
                self._queue.put_nowait(None)
                raise PipeClosed("merged listener is closed")
            failing = self._all_failing()
            if failing is not None and self._queue.empty():
                raise failing
            return None
        return item

    def subscribe(self, callback: Callable[[Delivery[T]], Awaitable[None]]) -> None:
        self._callback = callback
        while not self._queue.empty():
            item = self._queue.get_nowait()
            if item is not None:
                call = asyncio.create_task(self._call(callback, item))
                self._calls.add(call)
                call.add_done_callback(self._calls.discard)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.put_nowait(None)
        for pump in self._pumps:
            pump.cancel()
        await close_all(*self._pumps, *(listener.close() for listener in self._listeners))


def merge(listeners: Sequence[Listener[T]]) -> MergeListener[T]:
    """Combinator: one listener over many (listen to several brokers at once)."""
    return MergeListener(listeners)
