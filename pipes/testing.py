"""Scriptable in-memory fakes of the pipe interfaces, shipped so users can test their own code.

:class:`FakeBroker` (from :mod:`truba.pipes.fake_broker`) stands for a whole broker: pass it to
``Client(brokers=...)`` or ``Daemon(brokers=...)``. :class:`FakeSender` and :class:`FakeListener`
stand for one leaf, under a layer under test.

After tower-test's handle: a test drives the fake (``confirm``, ``fail_next``, ``break_``,
``push``, ``close_from_remote``) and inspects what happened (``sent``, ``acked``, ``rejected``).
Nothing here sleeps or touches the network.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from truba.pipes.base import Confirmation, Delivery
from truba.pipes.errors import MessageRejected, PipeBroken, PipeClosed, PipeError
from truba.pipes.fake_broker import FakeBroker
from truba.pipes.fake_leaves import FakeBrokerDelivery, FakeBrokerListener, FakeBrokerSender

__all__ = [
    "FakeBroker",
    "FakeBrokerDelivery",
    "FakeBrokerListener",
    "FakeBrokerSender",
    "FakeDelivery",
    "FakeListener",
    "FakeSender",
]

T = TypeVar("T")
log = logging.getLogger(__name__)


class FakeSender(Generic[T]):
    """A Sender whose confirms happen when the test says so (or at once with ``auto_confirm``)."""

    def __init__(self, auto_confirm: bool = False) -> None:
        self.auto_confirm = auto_confirm
        self.sent: list[T] = []
        self.closed = False
        self._pending: list[tuple[T, Confirmation]] = []
        self._fail_next: list[PipeError] = []
        self._broken: PipeError | None = None

    async def send(self, message: T) -> Confirmation:
        if self.closed:
            raise PipeClosed("fake sender is closed")
        if self._broken is not None:
            raise self._broken
        if self._fail_next:
            error = self._fail_next.pop(0)
            if isinstance(error, PipeBroken):
                self._broken = error
            raise error
        self.sent.append(message)
        confirmation: Confirmation = asyncio.get_running_loop().create_future()
        self._pending.append((message, confirmation))
        if self.auto_confirm:
            self.confirm()
        return confirmation

    def confirm(self, n: int | None = None) -> None:
        """Confirms the oldest ``n`` unconfirmed messages (all when None)."""
        count = len(self._pending) if n is None else n
        done, self._pending = self._pending[:count], self._pending[count:]
        for _, confirmation in done:
            if not confirmation.done():
                confirmation.set_result(None)

    def reject(self, n: int = 1) -> None:
        """Nacks the oldest ``n``: their confirmations fail, the messages stay unconfirmed."""
        for _, confirmation in self._pending[:n]:
            if not confirmation.done():
                confirmation.set_exception(MessageRejected("nacked by the fake broker"))

    def fail_newest(self, error: PipeError) -> None:
        """Fails the newest pending confirmation alone (a publish that broke before the older
        confirms failed); the message stays unconfirmed."""
        _, confirmation = self._pending[-1]
        if not confirmation.done():
            confirmation.set_exception(error)

    def fail_next(self, error: PipeError) -> None:
        """The next ``send`` raises ``error`` (a PipeBroken also breaks the sender for good)."""
        self._fail_next.append(error)

    def break_(self, error: PipeError | None = None) -> None:
        """Breaks the sender now: pending confirmations fail; messages stay unconfirmed."""
        self._broken = error or PipeBroken("fake sender broken")
        for _, confirmation in self._pending:
            if not confirmation.done():
                confirmation.set_exception(self._broken)

    def unconfirmed(self) -> Sequence[T]:
        return [message for message, _ in self._pending]

    def drop_unconfirmed(self) -> None:
        self._pending.clear()

    async def close(self) -> None:
        """Closes; pending confirmations fail with PipeClosed (the messages stay unconfirmed)."""
        self.closed = True
        for _, confirmation in self._pending:
            if not confirmation.done():
                confirmation.set_exception(PipeClosed("fake sender closed before the confirm"))


@dataclass
class FakeDelivery(Generic[T]):
    """A delivery of a FakeListener; records how it was settled."""

    message: T
    listener: FakeListener[T]
    redelivered: bool = False
    headers: Mapping[str, object] = field(default_factory=dict)
    settled: str | None = None
    framed: bool = False

    async def ack(self) -> None:
        self._settle("ack")
        self.listener.acked.append(self.message)

    async def reject(self, requeue: bool) -> None:
        self._settle("requeue" if requeue else "reject")
        self.listener.rejected.append((self.message, requeue))
        if requeue and not self.listener.closed:
            self.listener.push(self.message, redelivered=True, framed=self.framed)

    def _settle(self, how: str) -> None:
        if self.listener.broken is not None:
            raise self.listener.broken
        if self.settled is not None:
            raise PipeBroken(f"delivery already settled ({self.settled}): unknown delivery tag")
        self.settled = how


_WAKE = object()


class FakeListener(Generic[T]):
    """A Listener fed by the test with ``push``; ``close_from_remote`` breaks it."""

    def __init__(self) -> None:
        self.acked: list[T] = []
        self.rejected: list[tuple[T, bool]] = []
        self.held_back: list[T] = []
        self.closed = False
        self.cancelled = False
        self.broken: PipeError | None = None
        self._queue: asyncio.Queue[FakeDelivery[T] | object] = asyncio.Queue()
        self._callback: Callable[[Delivery[T]], Awaitable[None]] | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def push(
        self,
        message: T,
        *,
        redelivered: bool = False,
        headers: Mapping[str, object] | None = None,
        framed: bool = False,
    ) -> None:
        """Delivers ``message`` as if a broker sent it (``framed``: as a member of a frame); once
        cancelled it stays in ``held_back``."""
        if self.cancelled:
            self.held_back.append(message)
            return
        delivery = FakeDelivery(message, self, redelivered, dict(headers or {}), framed=framed)
        if self._callback is not None:
            task = asyncio.get_running_loop().create_task(_call(self._callback, delivery))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            self._queue.put_nowait(delivery)

    def close_from_remote(self, error: PipeError | None = None) -> None:
        """The broker went away: waiting and later ``get`` calls raise ``error``."""
        self.broken = error or PipeBroken("fake listener closed by the remote side")
        self._queue.put_nowait(_WAKE)

    async def cancel(self) -> None:
        """Stops new deliveries; what was pushed before stays gettable."""
        self.cancelled = True

    async def get(self, timeout: float) -> Delivery[T] | None:
        if self.closed:
            raise PipeClosed("fake listener is closed")
        if self.broken is not None and self._queue.empty():
            raise self.broken
        if self.cancelled:
            timeout = 0.0
        try:
            async with asyncio.timeout(timeout):
                item = await self._queue.get()
        except TimeoutError:
            return None
        if item is _WAKE:
            self._queue.put_nowait(_WAKE)
            if self.closed:
                raise PipeClosed("fake listener is closed")
            assert self.broken is not None
            raise self.broken
        assert isinstance(item, FakeDelivery)
        return item

    def subscribe(self, callback: Callable[[Delivery[T]], Awaitable[None]]) -> None:
        self._callback = callback
        while not self._queue.empty():  # what was already delivered goes to the callback too
            item = self._queue.get_nowait()
            if isinstance(item, FakeDelivery):
                task = asyncio.get_running_loop().create_task(_call(callback, item))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        self.closed = True
        self._queue.put_nowait(_WAKE)


async def _call(callback: Callable[[Delivery[T]], Awaitable[None]], delivery: Delivery[T]) -> None:
    try:
        await callback(delivery)
    except Exception as exc:
        log.error("pipe.fake.callback_failed", extra={"error": repr(exc)})
        await delivery.reject(requeue=True)
