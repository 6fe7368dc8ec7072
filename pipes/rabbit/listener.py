"""The listening leaf: consume one queue with a prefetch window; settle on the delivering channel."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Final, final

from aio_pika.abc import AbstractChannel, AbstractQueue
from aio_pika.exceptions import MessageProcessError
from aiormq.abc import DeliveredMessage

from truba import trace
from truba.pipes.base import Delivery
from truba.pipes.errors import ChannelLost, PipeBroken, PipeClosed, PipeError
from truba.pipes.rabbit.errors import map_amqp_errors
from truba.pipes.rabbit.util import close_quietly

log = logging.getLogger(__name__)

CANCEL_SETTLE = 0.02
"""Seconds ``cancel()`` waits after cancel-ok for deliveries already dispatched."""


@final
class RabbitDelivery:
    """One delivery of a :class:`RabbitListener`, settled on the channel that delivered it.

    Wraps aiormq's delivered message as it is (aio-pika's IncomingMessage would copy every
    property into a new object per delivery). Settling twice raises what aio-pika raised
    (its MessageProcessError, mapped like every AMQP error) instead of sending a second
    settle, which the broker would answer by closing the channel.
    """

    __slots__ = ("_message", "_listener", "_settled")

    def __init__(self, message: DeliveredMessage, listener: RabbitListener) -> None:
        self._message = message
        self._listener = listener
        self._settled = False

    @property
    def message(self) -> bytes:
        return self._message.body

    @property
    def redelivered(self) -> bool:
        return bool(self._message.redelivered)

    @property
    def framed(self) -> bool:
        return False

    @property
    def headers(self) -> Mapping[str, object]:
        return self._message.header.properties.headers or {}

    def _tag(self) -> int:
        if self._settled:
            raise MessageProcessError("Message already processed", self._listener.queue)
        tag = self._message.delivery_tag
        assert tag is not None  # a consumer's delivery always has one
        return tag

    async def ack(self) -> None:
        with map_amqp_errors(self._listener.ack_what):
            await self._message.channel.basic_ack(self._tag())
        self._settled = True
        if trace.enabled:
            trace.mark_body(self._listener.hops[1], self._message.body)

    async def reject(self, requeue: bool) -> None:
        with map_amqp_errors(self._listener.reject_what):
            await self._message.channel.basic_reject(self._tag(), requeue=requeue)
        self._settled = True


_CLOSED: Final = object()


@final
class RabbitListener:
    """Consumes one queue; deliveries wait in a local buffer bounded by the prefetch window."""

    def __init__(self, channel: AbstractChannel, queue: AbstractQueue, url: str) -> None:
        self._channel = channel
        self._queue = queue
        self._url = url
        self._buffer: asyncio.Queue[RabbitDelivery | object] = asyncio.Queue()
        self._callback: Callable[[Delivery[bytes]], Awaitable[None]] | None = None
        self._consumer_tag: str | None = None
        self._closed = False
        self._cancelled = False
        self._cancelling: asyncio.Future[None] | None = None
        self._consumer_lock = asyncio.Lock()
        """Held while the consumer changes (a new prefetch's swap, the cancel): a cancel must not
        miss the consumer a swap is starting. (``close`` needs no turn: closing the channel ends
        every consumer on it.)"""
        self._broken: PipeBroken | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.queue = queue.name
        self.ack_what = f"ack on {queue.name}"
        self.reject_what = f"reject on {queue.name}"
        kind = queue.name.rsplit(".", 1)[-1]
        self.hops = (f"{kind}.deliver", f"{kind}.ack")
        """The tracing mode's hops (:mod:`truba.trace`): delivered here, acked."""
        channel.close_callbacks.add(self._on_channel_closed)

    name = "rabbit"

    async def set_prefetch(self, count: int) -> None:
        """Changes how many unsettled deliveries the broker may push to this consumer.

        RabbitMQ applies a consumer's prefetch (``basic.qos``, not global: quorum queues refuse
        a global one) when the consumer starts, never to a consumer already running: a
        ``basic.qos`` alone would leave the window as it was. So a consuming leaf starts a new
        consumer on the same channel under the new size, then cancels the old one (consume
        first: deliveries do not pause). What was delivered to the old consumer stays
        settleable (delivery tags are the channel's), and what the broker sent it before its
        cancel-ok still reaches this leaf's buffer (aiormq drops the consumer's callback only
        at cancel-ok). Until those old deliveries are settled, the leaf may hold up to the old
        size more than the new one.
        """
        async with self._consumer_lock:
            with map_amqp_errors(f"qos on {self.queue}"):
                await self._channel.set_qos(prefetch_count=count)
            old = self._consumer_tag
            if old is None or self._cancelled or self._closed or self._broken is not None:
                return  # not consuming: the next consume applies the size
            await self._consume()
            with map_amqp_errors(f"cancel {self.queue}"):
                channel = await self._channel.get_underlay_channel()
                await channel.basic_cancel(old)
            log.debug("pipe.rabbit.prefetch_applied", extra={"queue": self.queue, "prefetch": count})

    async def start(self) -> None:
        async with self._consumer_lock:
            await self._consume()

    async def _consume(self) -> None:
        with map_amqp_errors(f"consume {self.queue}"):
            # On the aiormq channel: deliveries come as they are, without a copy per message.
            channel = await self._channel.get_underlay_channel()
            consume_ok = await channel.basic_consume(self.queue, self._on_message, no_ack=False)
            self._consumer_tag = consume_ok.consumer_tag

    async def _on_message(self, message: DeliveredMessage) -> None:
        if trace.enabled:
            trace.mark_body(self.hops[0], message.body)
        delivery = RabbitDelivery(message, self)
        if self._callback is None:
            self._buffer.put_nowait(delivery)
            return
        task = asyncio.create_task(self._run_callback(self._callback, delivery))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_callback(
        self, callback: Callable[[Delivery[bytes]], Awaitable[None]], delivery: RabbitDelivery
    ) -> None:
        try:
            await callback(delivery)
        except Exception as exc:
            log.error("pipe.rabbit.callback_failed", extra={"queue": self.queue, "error": repr(exc)})
            with contextlib.suppress(PipeError):
                await delivery.reject(requeue=True)

    def _on_channel_closed(self, _: object, exc: BaseException | None = None) -> None:
        if self._closed:
            return
        self._broken = ChannelLost(f"channel consuming {self.queue} closed: {exc!r}")
        log.warning("pipe.rabbit.listener.broken", extra={"queue": self.queue, "error": repr(exc)})
        self._buffer.put_nowait(_CLOSED)

    async def cancel(self) -> None:
        """basic.cancel (waits for cancel-ok, 5 s at most); the channel stays open for settling.

        Every caller waits for the same cancel: one returning early while deliveries may still
        arrive would let its owner think the buffer is final.
        """
        if self._closed:
            return
        if self._cancelling is None:
            self._cancelled = True
            self._cancelling = asyncio.ensure_future(self._cancel())
        await asyncio.shield(self._cancelling)

    async def _cancel(self) -> None:
        async with self._consumer_lock:
            if self._consumer_tag is not None and not self._channel.is_closed and self._broken is None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._queue.cancel(self._consumer_tag), 5.0)
                self._consumer_tag = None
        # Deliveries that preceded cancel-ok may still be on their way through aio-pika's
        # dispatch: let them reach the buffer, where the owner can hand them back unspent.
        await asyncio.sleep(CANCEL_SETTLE)

    async def get(self, timeout: float) -> Delivery[bytes] | None:
        if self._closed:
            raise PipeClosed(f"listener on {self.queue} is closed")
        if self._buffer.empty() and self._broken is not None:
            raise self._broken
        if self._cancelled:
            timeout = 0.0  # nothing more will come
        item = await _take(self._buffer, timeout)
        if item is None:
            return None
        if item is _CLOSED:
            self._buffer.put_nowait(_CLOSED)  # wake every other waiter too
            if self._closed:
                raise PipeClosed(f"listener on {self.queue} is closed")
            assert self._broken is not None
            raise self._broken
        assert isinstance(item, RabbitDelivery)
        return item

    def subscribe(self, callback: Callable[[Delivery[bytes]], Awaitable[None]]) -> None:
        self._callback = callback
        while not self._buffer.empty():
            item = self._buffer.get_nowait()
            if isinstance(item, RabbitDelivery):
                task = asyncio.create_task(self._run_callback(callback, item))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        left = self._buffer.qsize()
        if left:  # they go back to the queue marked redelivered: their owner did not hand them back
            log.info("pipe.rabbit.closed_holding", extra={"queue": self.queue, "deliveries": left})
        self._buffer.put_nowait(_CLOSED)
        try:
            if self._consumer_tag is not None and not self._channel.is_closed:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._queue.cancel(self._consumer_tag), 5.0)
        finally:
            # Unsettled deliveries go back to the queue when the channel closes.
            await close_quietly(self._channel)


async def _take(
    buffer: asyncio.Queue[RabbitDelivery | object], timeout: float
) -> RabbitDelivery | object | None:
    """The next item, or None after ``timeout``; no timer task when one is already waiting."""
    if not buffer.empty():
        return buffer.get_nowait()
    try:
        async with asyncio.timeout(timeout):  # a timer handle, not a task per wait
            return await buffer.get()
    except TimeoutError:
        return None
