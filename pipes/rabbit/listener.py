"""The listening leaf: consume one queue with a prefetch window; settle on the delivering channel."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Mapping
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

RETIRE_WAIT = 1.0
"""Seconds a consumer replaced by a new prefetch may take to fill its window before it is
cancelled anyway (see :meth:`RabbitListener.set_prefetch`)."""


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
        tag = self._tag()
        if self._listener.settling(self._message, tag, None):
            with map_amqp_errors(self._listener.ack_what):
                await self._message.channel.basic_ack(tag)
        self._settled = True
        if trace.enabled:
            trace.mark_body(self._listener.hops[1], self._message.body)

    async def reject(self, requeue: bool) -> None:
        tag = self._tag()
        if self._listener.settling(self._message, tag, requeue):
            with map_amqp_errors(self._listener.reject_what):
                await self._message.channel.basic_reject(tag, requeue=requeue)
        self._settled = True


_CLOSED: Final = object()


@final
class _Retiree:
    """A consumer a new prefetch replaced, until it is cancelled (see ``set_prefetch``)."""

    __slots__ = ("tag", "size", "held", "deferred", "cancelling", "cancelled", "timer")

    def __init__(self, tag: str, size: int, held: int) -> None:
        self.tag = tag
        self.size = size
        self.held = held
        """Its deliveries not settled yet: it is full (nothing can be on its way to it) at ``size``."""
        self.deferred: list[tuple[int, bool | None]] = []
        """Settles of its deliveries held back until its cancel went out: (delivery tag, None
        for an ack or ``requeue`` for a reject)."""
        self.cancelling = False
        self.cancelled = False
        """Its cancel went out: settles of its deliveries go out at once from then on."""
        self.timer: asyncio.TimerHandle | None = None


@final
class RabbitListener:
    """Consumes one queue; deliveries wait in a local buffer bounded by the prefetch window."""

    def __init__(self, channel: AbstractChannel, queue: AbstractQueue, url: str, prefetch: int) -> None:
        self._channel = channel
        self._queue = queue
        self._url = url
        self._buffer: asyncio.Queue[RabbitDelivery | object] = asyncio.Queue()
        self._callback: Callable[[Delivery[bytes]], Awaitable[None]] | None = None
        self._consumer_tag: str | None = None
        self._size = prefetch
        """The prefetch the consumer ``_consumer_tag`` was started with."""
        self._held = 0
        """Its deliveries not settled yet."""
        self._retiring: _Retiree | None = None
        self._wanted: int | None = None
        """A prefetch asked for while a consumer was retiring: applied once it is gone."""
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
        consumer on the same channel under the new size (deliveries do not pause) and *retires*
        the old one: it cancels it once it is full. A quorum queue (RabbitMQ 3.10) gives back
        what was on its way to a consumer when its cancel came, as a failed delivery: marked
        redelivered, its ``x-delivery-count`` raised, which the daemon would count as an attempt
        its task never ran. A consumer holding as many unsettled deliveries as its prefetch has
        nothing on its way, as long as none of its deliveries is settled meanwhile (a settle
        gives it credit): so from the swap on, its settles are held back (they count as done
        for their owner) and sent after its cancel. A consumer not full within
        :data:`RETIRE_WAIT` (a queue gone quiet) is cancelled anyway. One consumer retires at a
        time: a new size asked for meanwhile is applied once it is gone. Until then the leaf
        may hold up to the old size more than the new one.

        A caller cancelled meanwhile leaves the change to finish on its own: aiormq closes a
        channel whose RPC is cancelled half way, and this channel holds the deliveries.
        """
        await asyncio.shield(self._spawn(self._set_prefetch(count)))

    async def _set_prefetch(self, count: int) -> None:
        async with self._consumer_lock:
            with map_amqp_errors(f"qos on {self.queue}"):
                await self._channel.set_qos(prefetch_count=count)
            if self._consumer_tag is None or self._cancelled or self._closed or self._broken is not None:
                self._size = count
                return  # not consuming: the next consume applies the size
            if self._retiring is not None:
                self._wanted = count
                return
            await self._swap(count)

    async def _swap(self, count: int) -> None:
        """Starts a consumer of ``count`` and retires the current one (under the consumer lock)."""
        assert self._consumer_tag is not None
        old = _Retiree(self._consumer_tag, self._size, self._held)
        self._retiring = old
        try:
            await self._consume(count)
        except BaseException:  # failed or cancelled: the old consumer stays the one
            self._unretire(old)
            raise
        if old.held >= old.size:
            self._retire(old)
        else:
            old.timer = asyncio.get_running_loop().call_later(RETIRE_WAIT, self._retire, old)
        log.debug("pipe.rabbit.prefetch_applied", extra={"queue": self.queue, "prefetch": count})

    def _unretire(self, old: _Retiree) -> None:
        """Keeps ``old`` as the consumer (a new one could not be started); the settles it held
        back go out in the background. (A consume that reached the broker before it failed leaves
        a consumer this leaf does not count: its deliveries still come, only never retired.)"""
        self._retiring = None
        self._consumer_tag, self._size, self._held = old.tag, old.size, old.held - len(old.deferred)
        old.cancelled = True  # its settles are not held back any more
        self._spawn(self._release_settles(old))

    def _spawn(self, work: Coroutine[object, object, None]) -> asyncio.Task[None]:
        """Runs ``work`` in the background, kept until it ends; an error nobody awaited is
        logged (at debug: the channel's own failure is what its owner sees)."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.debug("pipe.rabbit.background_failed", extra={"queue": self.queue, "error": repr(exc)})

    def _retire(self, old: _Retiree) -> None:
        """Cancels ``old`` now (it is full, or waited long enough), in the background."""
        if old.cancelling:
            return
        old.cancelling = True
        if old.timer is not None:
            old.timer.cancel()
        self._spawn(self._cancel_retiree(old))

    async def _cancel_retiree(self, old: _Retiree) -> None:
        async with self._consumer_lock:
            if self._retiring is not old or old.cancelled:
                return  # cancel() or close() dealt with it
            await self._end_retiree(old)
            wanted, self._wanted = self._wanted, None
            consuming = self._consumer_tag is not None and not (self._cancelled or self._closed)
            if wanted is None or wanted == self._size or not consuming or self._broken is not None:
                return
            try:
                await self._swap(wanted)
            except PipeError as exc:  # the old size stays; the channel's failure is its owner's to see
                log.debug("pipe.rabbit.prefetch_failed", extra={"queue": self.queue, "error": repr(exc)})

    async def _end_retiree(self, old: _Retiree) -> None:
        """basic.cancel of ``old``, then the settles held back (both only on a live channel)."""
        if old.timer is not None:
            old.timer.cancel()
        if self._alive and not old.cancelled:
            channel = await self._channel.get_underlay_channel()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(channel.basic_cancel(old.tag), 5.0)
        old.cancelled = True
        if self._retiring is old:
            self._retiring = None
        await self._release_settles(old)

    @property
    def _alive(self) -> bool:
        """The channel is open and not broken: settles and cancels can go out on it."""
        return not (self._channel.is_closed or self._broken is not None)

    async def _release_settles(self, old: _Retiree) -> None:
        """Sends the settles ``old`` held back (on a dead channel the broker redelivers them)."""
        settles, old.deferred = old.deferred, []
        if not settles or not self._alive:
            return
        try:
            channel = await self._channel.get_underlay_channel()
            for tag, requeue in settles:
                if requeue is None:
                    await channel.basic_ack(tag)
                else:
                    await channel.basic_reject(tag, requeue=requeue)
        except Exception as exc:  # the channel died: the broker redelivers them
            log.debug("pipe.rabbit.settle_failed", extra={"queue": self.queue, "error": repr(exc)})

    def settling(self, message: DeliveredMessage, tag: int, requeue: bool | None) -> bool:
        """A delivery of this leaf is being settled: False when its settle is held back (its
        consumer is retiring, see :meth:`set_prefetch`), True when it is to go out now."""
        consumer = message.delivery.consumer_tag  # type: ignore[union-attr]
        if consumer == self._consumer_tag:
            self._held -= 1
        elif (old := self._retiring) is not None and consumer == old.tag and not old.cancelled:
            old.deferred.append((tag, requeue))
            return False
        return True

    async def start(self) -> None:
        async with self._consumer_lock:
            await self._consume(self._size)

    async def _consume(self, size: int) -> None:
        with map_amqp_errors(f"consume {self.queue}"):
            # On the aiormq channel: deliveries come as they are, without a copy per message.
            channel = await self._channel.get_underlay_channel()
            # The tag is ours, known before consume-ok: a delivery may be handled before the rpc
            # returns. In aiormq's own form: a tag made of the queue's name and a count made W1
            # slower in 7 of 7 interleaved pairs (median 8.8x against 10.8x; cause not found).
            self._consumer_tag = f"ctag{channel.number}.{uuid.uuid4().hex}"
            self._size, self._held = size, 0
            await channel.basic_consume(
                self.queue, self._on_message, no_ack=False, consumer_tag=self._consumer_tag
            )

    async def _on_message(self, message: DeliveredMessage) -> None:
        consumer = message.delivery.consumer_tag  # type: ignore[union-attr]
        if consumer == self._consumer_tag:
            self._held += 1
        elif (old := self._retiring) is not None and consumer == old.tag:
            old.held += 1
            if old.held >= old.size:
                self._retire(old)
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
            if self._retiring is not None:
                await self._end_retiree(self._retiring)
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
            if self._retiring is not None:  # its held-back settles go out before the channel closes
                with contextlib.suppress(Exception):
                    await self._end_retiree(self._retiring)
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
