"""RabbitMQ leaves: the only module of truba that imports aio-pika / aiormq.

- :class:`RabbitConnection` is one AMQP connection to one broker. It opens a channel per leaf and
  administers queues (declare, delete, inspect).
- :class:`RabbitSender` publishes persistent messages with ``mandatory=true`` on a confirm channel,
  keeps every message until its confirm arrives, and bounds every wait.
- :class:`RabbitListener` consumes one queue with a prefetch window; its deliveries are acked or
  rejected on the channel that delivered them.

Every AMQP exception is translated here, once, by :func:`map_amqp_errors`. A leaf that fails is
broken for good; an outer layer reopens a fresh one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, final

import aio_pika
import aiormq.exceptions as amqp
from aio_pika.abc import (
    AbstractChannel,
    AbstractConnection,
    AbstractIncomingMessage,
    AbstractQueue,
    FieldValue,
)

from truba.pipes.base import Confirmation, Delivery
from truba.pipes.errors import (
    ChannelLost,
    ConnectionLost,
    MessageRejected,
    PipeBroken,
    PipeClosed,
    PipeError,
    SendTimeout,
)

log = logging.getLogger(__name__)

PERSISTENT: Final = aio_pika.DeliveryMode.PERSISTENT
DELIVERY_LIMIT: Final = 1_000_000
"""Quorum-queue ``x-delivery-limit``: far above any real preemption count, so the broker never
drops a task on its own; truba counts attempts itself (the 4.x default of 20 would drop tasks)."""


@contextlib.contextmanager
def map_amqp_errors(what: str) -> Iterator[None]:
    """Translates aio-pika/aiormq exceptions into the pipe error hierarchy, chaining the cause."""
    try:
        yield
    except PipeError:
        raise
    except amqp.PublishError as exc:
        raise MessageRejected(f"{what}: returned as unroutable: {exc}") from exc
    except amqp.DeliveryError as exc:
        raise MessageRejected(f"{what}: nacked by the broker: {exc}") from exc
    except amqp.ChannelInvalidStateError as exc:
        raise ChannelLost(f"{what}: channel is closed: {exc}") from exc
    except amqp.AMQPChannelError as exc:
        raise ChannelLost(f"{what}: channel closed by the broker: {exc!r}") from exc
    except TimeoutError as exc:  # before OSError, of which it is a subclass
        raise SendTimeout(f"{what}: timed out") from exc
    except (amqp.AMQPConnectionError, ConnectionError, OSError) as exc:
        raise ConnectionLost(f"{what}: connection lost: {exc!r}") from exc
    except amqp.AMQPError as exc:
        raise ConnectionLost(f"{what}: AMQP error: {exc!r}") from exc


@dataclass(frozen=True)
class QueueSpec:
    """A durable queue and how it dead-letters.

    ``kind`` is ``"quorum"`` (the default: fsync before confirm, a delivery count) or
    ``"classic"``. ``dead_letter_to`` names the queue rejected messages go to.
    """

    name: str
    kind: str = "quorum"
    dead_letter_to: str | None = None

    def arguments(self) -> dict[str, FieldValue]:
        args: dict[str, FieldValue] = {"x-queue-type": self.kind}
        if self.kind == "quorum":
            args["x-delivery-limit"] = DELIVERY_LIMIT
        if self.dead_letter_to is not None:
            args["x-dead-letter-exchange"] = ""
            args["x-dead-letter-routing-key"] = self.dead_letter_to
        return args


@final
class RabbitConnection:
    """One AMQP connection to one broker. Leaves get a channel each; closing closes them all."""

    def __init__(self, connection: AbstractConnection, url: str, name: str) -> None:
        self._connection = connection
        self.url = url
        self.name = name

    @classmethod
    async def open(
        cls, url: str, *, name: str, heartbeat: float = 10.0, timeout: float = 10.0
    ) -> RabbitConnection:
        """Connects to ``url``; the first connect error goes to the caller (fail fast).

        Raises:
            ConnectionLost: the broker refused or could not be reached.
            SendTimeout: no connection within ``timeout`` seconds.
        """
        with map_amqp_errors(f"connect {redact(url)}"):
            connection = await asyncio.wait_for(
                aio_pika.connect(
                    url,
                    timeout=timeout,
                    heartbeat=max(1, round(heartbeat)),
                    client_properties={"connection_name": name},
                ),
                timeout,
            )
        log.info("pipe.rabbit.connected", extra={"broker": redact(url), "connection": name})
        return cls(connection, url, name)

    @property
    def is_closed(self) -> bool:
        return bool(self._connection.is_closed)

    async def _channel(self, *, confirms: bool) -> AbstractChannel:
        with map_amqp_errors(f"open channel on {redact(self.url)}"):
            return await asyncio.wait_for(
                self._connection.channel(publisher_confirms=confirms, on_return_raises=confirms), 10.0
            )

    async def sender(
        self, queue: str, *, confirm_timeout: float = 30.0, max_unconfirmed: int = 1000
    ) -> RabbitSender:
        """A sender publishing to ``queue`` through the default exchange on a confirm channel."""
        channel = await self._channel(confirms=True)
        return RabbitSender(channel, queue, self.url, confirm_timeout, max_unconfirmed)

    async def listener(self, queue: str, *, prefetch: int) -> RabbitListener:
        """A listener consuming ``queue`` with at most ``prefetch`` unsettled deliveries.

        Raises:
            ChannelLost: the queue does not exist (NOT_FOUND).
        """
        channel = await self._channel(confirms=False)
        with map_amqp_errors(f"consume {queue}"):
            await channel.set_qos(prefetch_count=prefetch)
            amqp_queue = await channel.declare_queue(queue, passive=True)
        listener = RabbitListener(channel, amqp_queue, self.url)
        await listener.start()
        return listener

    async def declare(self, spec: QueueSpec) -> None:
        """Declares a durable queue (idempotent for equal arguments)."""
        channel = await self._channel(confirms=False)
        try:
            with map_amqp_errors(f"declare {spec.name}"):
                await channel.declare_queue(spec.name, durable=True, arguments=spec.arguments())
        finally:
            await _close_quietly(channel)

    async def delete(self, queue: str) -> None:
        """Deletes a queue and its messages; a queue that does not exist is not an error."""
        channel = await self._channel(confirms=False)
        try:
            with map_amqp_errors(f"delete {queue}"):
                await channel.queue_delete(queue)
        finally:
            await _close_quietly(channel)

    async def message_count(self, queue: str) -> int | None:
        """Ready messages in ``queue``, or None if it does not exist."""
        channel = await self._channel(confirms=False)
        try:
            amqp_queue = await channel.declare_queue(queue, passive=True)
        except amqp.ChannelNotFoundEntity:
            return None
        finally:
            await _close_quietly(channel)
        return amqp_queue.declaration_result.message_count or 0

    async def close(self) -> None:
        """Closes the connection and every channel on it; idempotent."""
        if not self._connection.is_closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._connection.close(), 5.0)


async def _close_quietly(channel: AbstractChannel) -> None:
    if not channel.is_closed:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(channel.close(), 5.0)


def redact(url: str) -> str:
    """``url`` without its password, for logs."""
    if "@" not in url:
        return url
    scheme, _, rest = url.partition("://")
    creds, _, host = rest.rpartition("@")
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}@{host}"


@final
class RabbitSender:
    """Publishes persistent, mandatory messages to one queue and tracks them until confirmed.

    At most ``max_unconfirmed`` messages are in flight; ``send`` waits for room (backpressure).
    A confirm that does not arrive within ``confirm_timeout`` (e.g. a memory alarm blocks the
    connection) breaks the sender: its messages stay in ``unconfirmed()``. A nack or an
    unroutable return fails that message's confirmation with MessageRejected and keeps it too.
    """

    def __init__(
        self,
        channel: AbstractChannel,
        queue: str,
        url: str,
        confirm_timeout: float,
        max_unconfirmed: int,
    ) -> None:
        self._channel = channel
        self._queue = queue
        self._url = url
        self._confirm_timeout = confirm_timeout
        self._window = asyncio.Semaphore(max_unconfirmed)
        self._pending: dict[int, tuple[bytes, Confirmation]] = {}
        self._seq = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._broken: PipeError | None = None
        channel.close_callbacks.add(self._on_channel_closed)

    def _on_channel_closed(self, _: object, exc: BaseException | None = None) -> None:
        if not self._closed and self._broken is None:
            self._broken = ChannelLost(f"channel to {redact(self._url)} closed: {exc!r}")
            log.warning("pipe.rabbit.sender.broken", extra={"broker": redact(self._url), "error": repr(exc)})

    def _check_usable(self) -> None:
        if self._closed:
            raise PipeClosed(f"sender to {self._queue} is closed")
        if self._broken is not None:
            raise self._broken

    async def send(self, message: bytes) -> Confirmation:
        self._check_usable()
        await self._window.acquire()
        try:
            self._check_usable()
        except PipeError:
            self._window.release()
            raise
        self._seq += 1
        seq = self._seq
        confirmation: Confirmation = asyncio.get_running_loop().create_future()
        confirmation.add_done_callback(_mark_retrieved)
        self._pending[seq] = (message, confirmation)
        task = asyncio.create_task(self._publish(seq, message, confirmation))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        # Yield once so the publish frame is queued before the caller moves on: ordering and
        # "accepted" both hold when send returns.
        await asyncio.sleep(0)
        return confirmation

    async def _publish(self, seq: int, body: bytes, confirmation: Confirmation) -> None:
        amqp_message = aio_pika.Message(body, delivery_mode=PERSISTENT)
        try:
            with map_amqp_errors(f"publish to {self._queue} on {redact(self._url)}"):
                await self._channel.default_exchange.publish(
                    amqp_message, self._queue, mandatory=True, timeout=self._confirm_timeout
                )
        except MessageRejected as exc:
            log.warning("pipe.rabbit.rejected", extra={"queue": self._queue, "error": str(exc)})
            _fail(confirmation, exc)
        except PipeError as exc:
            if self._broken is None:
                self._broken = exc
                log.warning(
                    "pipe.rabbit.sender.broken",
                    extra={"broker": redact(self._url), "queue": self._queue, "error": repr(exc)},
                )
                closing = asyncio.create_task(_close_quietly(self._channel))
                self._tasks.add(closing)
                closing.add_done_callback(self._tasks.discard)
            _fail(confirmation, self._broken)
        except asyncio.CancelledError:
            _fail(confirmation, PipeClosed("sender closed before the confirm arrived"))
            raise
        else:
            self._pending.pop(seq, None)
            if not confirmation.done():
                confirmation.set_result(None)
        finally:
            self._window.release()

    def unconfirmed(self) -> Sequence[bytes]:
        return [body for body, _ in self._pending.values()]

    def drop_unconfirmed(self) -> None:
        self._pending.clear()

    def load(self) -> int:
        """Unconfirmed messages: what a balancer compares."""
        return len(self._pending)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._tasks and self._broken is None:
                # Bounded wait for outstanding confirms; whatever is left stays unconfirmed.
                await asyncio.wait(set(self._tasks), timeout=self._confirm_timeout)
        finally:
            for task in list(self._tasks):
                task.cancel()
            await _close_quietly(self._channel)


def _mark_retrieved(future: Confirmation) -> None:
    # Callers that never await a confirmation must not get "exception was never retrieved".
    if not future.cancelled():
        future.exception()


def _fail(confirmation: Confirmation, exc: BaseException) -> None:
    if not confirmation.done():
        confirmation.set_exception(exc)


@final
class RabbitDelivery:
    """One delivery of a :class:`RabbitListener`, settled on the channel that delivered it."""

    def __init__(self, message: AbstractIncomingMessage, listener: RabbitListener) -> None:
        self._message = message
        self._listener = listener

    @property
    def message(self) -> bytes:
        return self._message.body

    @property
    def redelivered(self) -> bool:
        return bool(self._message.redelivered)

    @property
    def headers(self) -> Mapping[str, object]:
        return self._message.headers or {}

    async def ack(self) -> None:
        with map_amqp_errors(f"ack on {self._listener.queue}"):
            await self._message.ack()

    async def reject(self, requeue: bool) -> None:
        with map_amqp_errors(f"reject on {self._listener.queue}"):
            await self._message.reject(requeue=requeue)


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
        self._broken: PipeBroken | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        channel.close_callbacks.add(self._on_channel_closed)

    @property
    def queue(self) -> str:
        return self._queue.name

    async def start(self) -> None:
        with map_amqp_errors(f"consume {self.queue}"):
            self._consumer_tag = await self._queue.consume(self._on_message, no_ack=False)

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
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

    async def get(self, timeout: float) -> Delivery[bytes] | None:
        if self._closed:
            raise PipeClosed(f"listener on {self.queue} is closed")
        if self._buffer.empty() and self._broken is not None:
            raise self._broken
        try:
            item = await asyncio.wait_for(self._buffer.get(), timeout)
        except TimeoutError:
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
        self._buffer.put_nowait(_CLOSED)
        try:
            if self._consumer_tag is not None and not self._channel.is_closed:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._queue.cancel(self._consumer_tag), 5.0)
        finally:
            # Unsettled deliveries go back to the queue when the channel closes.
            await _close_quietly(self._channel)
