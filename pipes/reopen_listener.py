"""Leaf wrapper for listeners: when the listener below breaks, open a fresh one and carry on.

States and backoff as in :mod:`truba.pipes.reopen`. While reconnecting (in the background),
``get`` waits up to its timeout for the new channel and returns None. Deliveries of a dead
channel were already requeued by the broker, so settling them is dropped with a log line
instead of raising (RabbitMQ would close the new channel for an unknown delivery tag).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar, final

from truba.backoff import Backoff
from truba.pipes.base import Delivery, Listener, close_all
from truba.pipes.errors import PipeBroken, PipeClosed, PipeError
from truba.pipes.reopen import REOPEN_BACKOFF, State, connect_within

T = TypeVar("T")
log = logging.getLogger(__name__)


@dataclass
class ReopenDelivery(Generic[T]):
    """A delivery whose settling is dropped (logged) if its channel died: the broker requeued it."""

    inner: Delivery[T]
    label: str
    generation: int
    owner: ReopenListener[T] = field(repr=False)

    @property
    def message(self) -> T:
        return self.inner.message

    @property
    def redelivered(self) -> bool:
        return self.inner.redelivered

    @property
    def framed(self) -> bool:
        return self.inner.framed

    @property
    def headers(self) -> Mapping[str, object]:
        return self.inner.headers

    async def ack(self) -> None:
        await self._settle("ack", self.inner.ack())

    async def reject(self, requeue: bool) -> None:
        await self._settle("reject", self.inner.reject(requeue))

    async def _settle(self, how: str, action: Awaitable[None]) -> None:
        if self.generation != self.owner.generation:
            if asyncio.iscoroutine(action):
                action.close()
            log.info(
                "pipe.reopen.settle_dropped", extra={"pipe": self.label, "how": how, "reason": "old channel"}
            )
            return
        try:
            await action
        except PipeBroken as exc:
            log.info("pipe.reopen.settle_dropped", extra={"pipe": self.label, "how": how, "error": repr(exc)})
            self.owner.broke(self.generation, exc)


@final
class ReopenListener(Generic[T]):
    """A listener that survives its transport: reconnects in the background and goes on."""

    name = "reopen"

    def __init__(
        self,
        connect: Callable[[], Awaitable[Listener[T]]],
        *,
        label: str = "",
        connect_timeout: float = 10.0,
        backoff: Backoff = REOPEN_BACKOFF,
    ) -> None:
        self._connect = connect
        self.label = label
        self._connect_timeout = connect_timeout
        self._backoff = backoff
        self.state = State.IDLE
        self.inner: Listener[T] | None = None
        self.generation = 0
        self.reopened = 0
        self._reopener: asyncio.Task[None] | None = None
        self._pump: asyncio.Task[None] | None = None
        self._connected = asyncio.Event()
        self._lock = asyncio.Lock()
        self._cancelled = False

    async def _open(self) -> Listener[T]:
        return await connect_within(self._connect, self._connect_timeout, self.label)

    async def cancel(self) -> None:
        """Stops new deliveries and any reopening; a connected inner listener is cancelled.

        A first connect under way is waited for (bounded by its timeout), so that what the new
        leaf received is gettable afterwards instead of going back to the broker marked
        redelivered when the leaf is closed.
        """
        self._cancelled = True
        if self.state is State.CONNECTING:
            async with self._lock:  # held by the connecting get(); it cancels the leaf it opened
                pass
        if self.state is State.CONNECTED and self.inner is not None:
            with contextlib.suppress(PipeError):
                await self.inner.cancel()

    async def get(self, timeout: float) -> Delivery[T] | None:
        if self.state is State.CLOSED:
            raise PipeClosed(f"{self.label}: listener is closed")
        if self._cancelled and (self.state is not State.CONNECTED or self.inner is None):
            return None  # never opened, or broken: nothing is held here
        if self.state is State.IDLE:
            async with self._lock:
                if self.state is State.IDLE:
                    self.state = State.CONNECTING
                    try:
                        fresh = await self._open()
                    except BaseException:
                        if self.state is State.CONNECTING:
                            self.state = State.IDLE
                        raise
                    if self.state is State.CLOSED:
                        # close() ran while we connected: the new leaf must not live on and
                        # consume (it would hold deliveries nobody takes).
                        with contextlib.suppress(PipeError):
                            await fresh.close()
                        raise PipeClosed(f"{self.label}: listener is closed")
                    self.inner = fresh
                    self.state = State.CONNECTED
                    self._connected.set()
                    log.info("pipe.reopen.connected", extra={"pipe": self.label})
                    if self._cancelled:  # cancel() ran while we connected: stop it consuming too
                        with contextlib.suppress(PipeError):
                            await fresh.cancel()
        if self.state is not State.CONNECTED:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._connected.wait(), timeout)
            if self.closed:
                raise PipeClosed(f"{self.label}: listener is closed")
            return None
        inner, generation = self.inner, self.generation
        assert inner is not None
        try:
            delivery = await inner.get(timeout)
        except PipeClosed:
            if self.closed:  # closed by us while waiting; otherwise the inner one gave up
                raise
            self.broke(generation, PipeBroken(f"{self.label}: inner listener closed"))
            return None
        except PipeBroken as exc:
            self.broke(generation, exc)
            return None
        if delivery is None:
            return None
        return ReopenDelivery(delivery, self.label, generation, self)

    @property
    def closed(self) -> bool:
        return self.state is State.CLOSED

    def broke(self, generation: int, exc: PipeError) -> None:
        """The channel of ``generation`` is gone: reopen in the background (once)."""
        if generation != self.generation or self.state is not State.CONNECTED:
            return
        self.state = State.BROKEN
        self._connected.clear()
        log.warning("pipe.reopen.broken", extra={"pipe": self.label, "error": f"{type(exc).__name__}: {exc}"})
        if not self._cancelled:
            self._reopener = asyncio.create_task(self._reopen())

    async def _reopen(self) -> None:
        dead = self.inner
        if dead is not None:
            with contextlib.suppress(PipeError):
                await asyncio.wait_for(dead.close(), 1.0)
        attempt = 0
        while self.state is State.BROKEN:
            await self._backoff.sleep(self._backoff.delay(attempt))
            try:
                fresh = await self._open()
            except PipeError as exc:
                attempt += 1
                # The first failed attempt of a break is a warning; the rest, at debug, only
                # repeat it (an outage is one line, not one per try).
                log.log(
                    logging.WARNING if attempt == 1 else logging.DEBUG,
                    "pipe.reopen.attempt_failed",
                    extra={"pipe": self.label, "attempt": attempt, "error": f"{type(exc).__name__}: {exc}"},
                )
                continue
            if self.state is not State.BROKEN:
                await fresh.close()
                return
            self.inner, self.generation, self.reopened = fresh, self.generation + 1, self.reopened + 1
            self.state = State.CONNECTED
            self._connected.set()
            log.info("pipe.reopen.reopened", extra={"pipe": self.label, "attempts": attempt + 1})
            if self._cancelled:  # cancel() ran while we reopened: stop it consuming too
                with contextlib.suppress(PipeError):
                    await fresh.cancel()

    def subscribe(self, callback: Callable[[Delivery[T]], Awaitable[None]]) -> None:
        """Polls ``get`` in a task and hands each delivery to ``callback`` (errors: logged, requeued)."""

        async def pump() -> None:
            while self.state is not State.CLOSED:
                try:
                    delivery = await self.get(1.0)
                except PipeClosed:
                    return
                if delivery is None:
                    continue
                try:
                    await callback(delivery)
                except Exception as exc:
                    log.error("pipe.reopen.callback_failed", extra={"pipe": self.label, "error": repr(exc)})
                    with contextlib.suppress(PipeError):
                        await delivery.reject(requeue=True)

        self._pump = asyncio.create_task(pump())

    async def close(self) -> None:
        if self.state is State.CLOSED:
            return
        self.state = State.CLOSED
        self._connected.set()  # wake waiting gets
        tasks = [t for t in (self._reopener, self._pump) if t is not None and t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await close_all(*tasks, *[inner.close() for inner in (self.inner,) if inner is not None])


def reopen_listener(
    connect: Callable[[], Awaitable[Listener[T]]], *, label: str = "", connect_timeout: float = 10.0
) -> ReopenListener[T]:
    """Leaf wrapper: a listener over ``connect()`` that reopens it when it breaks."""
    return ReopenListener(connect, label=label, connect_timeout=connect_timeout)
