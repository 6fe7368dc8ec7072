"""The leaves of :class:`~truba.pipes.fake_broker.FakeBroker`: its queues, messages, senders,
listeners and deliveries (see that module for the semantics and the scripted faults)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, final

from truba.pipes import delay
from truba.pipes.base import Confirmation, Delivery
from truba.pipes.broker import SENT_AT, QueueSpec
from truba.pipes.errors import (
    ChannelLost,
    ConnectionLost,
    MessageRejected,
    PipeClosed,
    PipeError,
    SendTimeout,
)

if TYPE_CHECKING:
    from truba.pipes.fake_broker import FakeBroker

DELIVERY_COUNT: Final = "x-delivery-count"
log = logging.getLogger(__name__)


@dataclass
class FakeMessage:
    body: bytes
    headers: dict[str, object]
    returns: int = 0
    """Times it went back to its queue (requeue, a consumer's close or break)."""
    at: float = field(default_factory=time.time)


@dataclass
class FakeQueue:
    spec: QueueSpec
    ready: deque[FakeMessage] = field(default_factory=deque)
    log: list[FakeMessage] = field(default_factory=list)
    """A stream's messages (kept, never consumed)."""
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    def put(self, message: FakeMessage, *, front: bool = False) -> None:
        if self.spec.kind == "stream":
            self.log.append(message)
            return
        if front:
            self.ready.appendleft(message)
        else:
            self.ready.append(message)
        self.wake.set()


@final
class FakeBrokerSender:
    """A sending leaf of a :class:`FakeBroker`: publishes at once, confirms at once unless stalled."""

    def __init__(
        self,
        broker: FakeBroker,
        queue: str,
        confirm_timeout: float,
        max_unconfirmed: int,
        priority: int | None,
        copy_to: str | None,
        delayed: bool = False,
    ) -> None:
        self.queue = queue
        self._delayed = delayed
        self._broker = broker
        self._confirm_timeout = confirm_timeout
        self._max = max_unconfirmed
        self._priority = priority
        self._copy_to = copy_to
        self._pending: dict[int, tuple[bytes, Confirmation]] = {}
        self._held: dict[int, PipeError | None] = {}
        """Messages taken while the broker stalls, with how they will settle (None: confirmed)."""
        self._seq = 0
        self._room = asyncio.Event()
        self._room.set()
        self._error: PipeError | None = None

    async def send(self, message: bytes) -> Confirmation:
        while True:
            if self._error is not None:
                raise self._error
            if len(self._pending) < self._max:
                break
            self._room.clear()
            await self._room.wait()
        self._seq += 1
        seq = self._seq
        confirmation: Confirmation = asyncio.get_running_loop().create_future()
        self._pending[seq] = (message, confirmation)
        broker = self._broker
        broker.published += 1
        headers: dict[str, object] = {SENT_AT: int(time.time())}
        if self._priority is not None:
            headers["priority"] = self._priority
        target = broker.queues.get(self.queue)
        outcome: PipeError | None = None
        body = message
        if self._delayed:
            due, body = delay.split_due(message)
        if self._delayed and due > broker.clock():
            broker.hold(self.queue, due, FakeMessage(body, headers))  # the delay levels take it
        elif target is None:
            outcome = MessageRejected(f"{self.queue}: unroutable (NO_ROUTE) on {broker.url}")
        else:
            target.put(FakeMessage(body, headers))
            copy = broker.queues.get(self._copy_to) if self._copy_to is not None else None
            if copy is not None:
                copy.put(FakeMessage(body, dict(headers)))
        if broker.stalled:
            self._held[seq] = outcome
            asyncio.get_running_loop().call_later(self._confirm_timeout, self._time_out, seq)
        else:
            self._settle(seq, outcome)
        return confirmation

    def _settle(self, seq: int, error: PipeError | None) -> None:
        entry = self._pending.get(seq) if error is not None else self._pending.pop(seq, None)
        if entry is not None and not entry[1].done():
            if error is None:
                entry[1].set_result(None)
            else:
                entry[1].set_exception(error)
        self._room.set()

    def _time_out(self, seq: int) -> None:
        if seq in self._held:
            del self._held[seq]
            self._settle(seq, SendTimeout(f"{self.queue}: no confirm within {self._confirm_timeout} s"))

    def confirm_held(self) -> None:
        """The stall ended: what was held settles as it would have (confirmed, or returned)."""
        held, self._held = self._held, {}
        for seq, outcome in held.items():
            self._settle(seq, outcome)

    def fail(self, error: PipeError) -> None:
        """Broken (or closed) for good: pending confirms fail, the messages stay unconfirmed."""
        if self._error is None:
            self._error = error
        for _, confirmation in self._pending.values():
            if not confirmation.done():
                confirmation.set_exception(error)
        self._held.clear()
        self._room.set()

    def unconfirmed(self) -> Sequence[bytes]:
        return [message for message, _ in self._pending.values()]

    def drop_unconfirmed(self) -> None:
        self._pending.clear()
        self._room.set()

    def load(self) -> int:
        return len(self._pending)

    async def close(self) -> None:
        self.fail(PipeClosed(f"sender to {self.queue} is closed"))
        self._broker._forget(self)


@dataclass(eq=False)
class FakeBrokerDelivery:
    """A delivery of a :class:`FakeBrokerListener`; settled once, on the leaf that delivered it."""

    _message: FakeMessage
    _listener: FakeBrokerListener
    settled: str | None = None

    @property
    def message(self) -> bytes:
        return self._message.body

    @property
    def redelivered(self) -> bool:
        return self._message.returns > 0

    @property
    def framed(self) -> bool:
        return False

    @property
    def headers(self) -> Mapping[str, object]:
        return self._message.headers

    async def ack(self) -> None:
        self._listener.settle(self, "ack")

    async def reject(self, requeue: bool) -> None:
        self._listener.settle(self, "requeue" if requeue else "reject")


@final
class FakeBrokerListener:
    """A listening leaf of a :class:`FakeBroker`: takes from its queue while under its prefetch."""

    def __init__(self, broker: FakeBroker, queue: str, prefetch: int) -> None:
        self.queue = queue
        self.prefetch = prefetch
        self._broker = broker
        self._unsettled: set[FakeBrokerDelivery] = set()
        self._error: PipeError | None = None
        self._cancelled = False
        self._wake = asyncio.Event()
        self._consumer: asyncio.Task[None] | None = None

    async def set_prefetch(self, count: int) -> None:
        self.prefetch = count
        self._wake.set()

    async def get(self, timeout: float) -> Delivery[bytes] | None:
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            if self._error is not None:
                raise self._error
            if self._cancelled:
                return None
            queue = self._broker.queues.get(self.queue)
            if queue is not None and queue.ready and not self._broker.stalled:
                if len(self._unsettled) < self.prefetch:
                    return self._deliver(queue)
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return None
            self._wake.clear()
            waits = [asyncio.ensure_future(self._wake.wait())]
            if queue is not None:
                queue.wake.clear()
                waits.append(asyncio.ensure_future(queue.wake.wait()))
            _, pending = await asyncio.wait(waits, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            for waiting in (*waits, *pending):
                waiting.cancel()

    def _deliver(self, queue: FakeQueue) -> FakeBrokerDelivery:
        message = queue.ready.popleft()
        if queue.spec.kind == "quorum" and message.returns:
            message.headers[DELIVERY_COUNT] = message.returns
        delivery = FakeBrokerDelivery(message, self)
        self._unsettled.add(delivery)
        return delivery

    def settle(self, delivery: FakeBrokerDelivery, how: str) -> None:
        if self._error is not None:
            raise self._error if isinstance(self._error, ConnectionLost) else ChannelLost(str(self._error))
        if delivery.settled is not None or delivery not in self._unsettled:
            raise ChannelLost(
                f"{self.queue}: PRECONDITION_FAILED - unknown delivery tag ({delivery.settled})"
            )
        delivery.settled = how
        self._unsettled.discard(delivery)
        self._wake.set()
        queue = self._broker.queues.get(self.queue)
        if how == "requeue" and queue is not None:
            delivery._message.returns += 1
            queue.put(delivery._message, front=True)
        elif how == "reject" and queue is not None and queue.spec.dead_letter_to is not None:
            dead = self._broker.queues.get(queue.spec.dead_letter_to)
            if dead is not None:
                dead.put(FakeMessage(delivery.message, dict(delivery.headers)))

    def subscribe(self, callback: Callable[[Delivery[bytes]], Awaitable[None]]) -> None:
        async def consume() -> None:
            while True:
                delivery = await self.get(3600.0)
                if delivery is None:
                    if self._cancelled:
                        return
                    continue
                try:
                    await callback(delivery)
                except Exception as exc:
                    log.error("pipe.fake.callback_failed", extra={"queue": self.queue, "error": repr(exc)})
                    await delivery.reject(requeue=True)

        self._consumer = asyncio.get_running_loop().create_task(consume())

    async def cancel(self) -> None:
        self._cancelled = True
        self._wake.set()

    def fail(self, error: PipeError) -> None:
        """Broken (or closed): unsettled deliveries go back to the queue, marked redelivered."""
        if self._error is not None:
            return
        self._error = error
        queue = self._broker.queues.get(self.queue)
        for delivery in sorted(self._unsettled, key=lambda d: -d._message.at):
            delivery._message.returns += 1
            if queue is not None:
                queue.put(delivery._message, front=True)
        self._unsettled.clear()
        self._wake.set()
        if self._consumer is not None:
            self._consumer.cancel()

    async def close(self) -> None:
        self.fail(PipeClosed(f"listener on {self.queue} is closed"))
        self._broker._forget(self)
