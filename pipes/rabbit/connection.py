"""One AMQP connection to one broker: channels for leaves, queue administration, and a link
that reopens the shared connection when it is gone."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Final, final

import aio_pika
import aiormq.exceptions as amqp
from aio_pika.abc import AbstractChannel, AbstractConnection, FieldValue

from truba.pipes.broker import Broker, BrokerFactory, Browsed, QueueSpec, redact
from truba.pipes.errors import ChannelLost, ConnectionLost, PipeClosed
from truba.pipes.rabbit.browse import browse
from truba.pipes.rabbit.delays import bind_target, declare_levels
from truba.pipes.rabbit.errors import map_amqp_errors
from truba.pipes.rabbit.listener import RabbitListener
from truba.pipes.rabbit.quiet import quiet_amqp_logs
from truba.pipes.rabbit.sender import RabbitSender
from truba.pipes.rabbit.stream import read_stream
from truba.pipes.rabbit.util import close_quietly

log = logging.getLogger(__name__)
quiet_amqp_logs()  # aio-pika and aiormq are imported: their records go to debug

DELIVERY_LIMIT: Final = 1_000_000
"""Quorum-queue ``x-delivery-limit``: far above any real preemption count, so the broker never
drops a task on its own; truba counts attempts itself (the 4.x default of 20 would drop tasks)."""


STREAM_MAX_AGE_SECONDS: Final = 3600
STREAM_MAX_AGE: Final = f"{STREAM_MAX_AGE_SECONDS}s"
STREAM_MAX_BYTES: Final = 256 * 1024 * 1024
STREAM_SEGMENT_BYTES: Final = 8 * 1024 * 1024
"""A stream keeps its messages at most an hour and 256 MiB (per broker), whichever ends first;
retention drops whole segments, hence segments much smaller than the 500 MB default."""


def queue_arguments(spec: QueueSpec) -> dict[str, FieldValue]:
    """The AMQP ``x-`` arguments that declare ``spec`` on RabbitMQ."""
    args: dict[str, FieldValue] = {"x-queue-type": spec.kind}
    if spec.kind == "stream":
        args["x-max-age"] = STREAM_MAX_AGE
        args["x-max-length-bytes"] = STREAM_MAX_BYTES
        args["x-stream-max-segment-size-bytes"] = STREAM_SEGMENT_BYTES
        return args
    if spec.max_priority is not None:
        args["x-max-priority"] = spec.max_priority
    if spec.kind == "quorum":
        args["x-delivery-limit"] = DELIVERY_LIMIT
    if spec.dead_letter_to is not None:
        args["x-dead-letter-exchange"] = ""
        args["x-dead-letter-routing-key"] = spec.dead_letter_to
    return args


@final
class RabbitConnection:
    """One AMQP connection to one broker. Leaves get a channel each; closing closes them all."""

    def __init__(self, connection: AbstractConnection, url: str, name: str) -> None:
        self._connection = connection
        self.url = url
        self.name = name
        self._dead = False
        self._levels = False
        """The delay levels were declared on this connection."""

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
        return self._dead or bool(self._connection.is_closed)

    async def _channel(self, *, confirms: bool) -> AbstractChannel:
        what = f"open channel on {redact(self.url)}"
        try:
            with map_amqp_errors(what):
                return await asyncio.wait_for(
                    self._connection.channel(publisher_confirms=confirms, on_return_raises=confirms), 10.0
                )
        except RuntimeError as exc:
            # aiormq says "<Connection ...> closed" with a bare RuntimeError, sometimes before
            # aio-pika's own state knows it: the connection is dead, the link must open a new one.
            self._dead = True
            raise ConnectionLost(f"{what}: the connection is closed ({exc})") from exc

    async def sender(
        self,
        queue: str | QueueSpec,
        *,
        confirm_timeout: float = 30.0,
        max_unconfirmed: int = 1000,
        priority: int | None = None,
        copy_to: str | QueueSpec | None = None,
        delayed: bool = False,
    ) -> RabbitSender:
        """A sender publishing to ``queue`` through the default exchange on a confirm channel.

        Given a :class:`QueueSpec`, the queue is declared first (topology re-declared on every
        reconnect: a broker whose data was wiped gets the queue back instead of returning
        every message as unroutable). ``copy_to`` names a second queue every message is also
        put in, within the same confirm (declared the same way when it is a spec, but a copy is
        an extra: if it cannot be declared, messages go to ``queue`` alone). ``delayed``: each
        message is a due time and a body, published into the delay levels (:mod:`truba.pipes.delay`).
        """
        redeclare = None
        if isinstance(queue, QueueSpec) or isinstance(copy_to, QueueSpec):
            target, copy = queue, copy_to

            async def redeclare() -> None:
                if isinstance(target, QueueSpec):
                    await self.declare(target)
                if isinstance(copy, QueueSpec):
                    await self._declare_copy(copy)

            await redeclare()

        channel = await self._channel(confirms=True)
        return RabbitSender(
            channel,
            _name(queue),
            self.url,
            confirm_timeout,
            max_unconfirmed,
            redeclare,
            priority,
            copy_to=None if copy_to is None else _name(copy_to),
            delayed=delayed,
        )

    async def listener(self, queue: str | QueueSpec, *, prefetch: int) -> RabbitListener:
        """A listener consuming ``queue`` with at most ``prefetch`` unsettled deliveries.

        Given a :class:`QueueSpec`, the queue is declared (created if missing); given a name,
        it must exist.

        Raises:
            ChannelLost: the queue does not exist (NOT_FOUND), or exists with other arguments
                (PRECONDITION_FAILED).
        """
        name = queue.name if isinstance(queue, QueueSpec) else queue
        channel = await self._channel(confirms=False)
        with map_amqp_errors(f"consume {name}"):
            await channel.set_qos(prefetch_count=prefetch)
            if isinstance(queue, QueueSpec):
                amqp_queue = await channel.declare_queue(name, durable=True, arguments=queue_arguments(queue))
            else:
                amqp_queue = await channel.declare_queue(name, passive=True)
        listener = RabbitListener(channel, amqp_queue, self.url, prefetch)
        await listener.start()
        return listener

    async def read_stream(
        self, stream: str, since: float, each: Callable[[bytes], None], *, timeout: float
    ) -> int:
        """Calls ``each`` with every message appended to ``stream`` since ``since`` (Unix time)
        and before the read began; returns how many (see :func:`truba.pipes.rabbit.stream.read_stream`)."""
        reader = await self._channel(confirms=False)
        try:
            writer = await self._channel(confirms=True)
        except BaseException:
            await close_quietly(reader)
            raise
        return await read_stream(reader, writer, stream, since, each, timeout)

    async def _declare_copy(self, spec: QueueSpec) -> None:
        try:
            await self.declare(spec)
        except ChannelLost as exc:  # e.g. a broker without streams: refused, not broken
            log.warning("pipe.rabbit.copy_not_declared", extra={"queue": spec.name, "error": str(exc)})

    async def declare(self, spec: QueueSpec) -> None:
        """Declares a durable queue (idempotent for equal arguments)."""
        channel = await self._channel(confirms=False)
        try:
            with map_amqp_errors(f"declare {spec.name}"):
                await channel.declare_queue(spec.name, durable=True, arguments=queue_arguments(spec))
            if spec.delays:
                await self._declare_delays(channel, spec.name)
        finally:
            await close_quietly(channel)

    async def _declare_delays(self, channel: AbstractChannel, queue: str) -> None:
        """The delay levels (once per connection), and ``queue`` bound to them."""
        if not self._levels:
            await declare_levels(channel)
            self._levels = True
            log.info("pipe.rabbit.delay_levels_declared", extra={"broker": redact(self.url)})
        await bind_target(channel, queue)

    async def delete(self, queue: str) -> None:
        """Deletes a queue and its messages; a queue that does not exist is not an error."""
        channel = await self._channel(confirms=False)
        try:
            with map_amqp_errors(f"delete {queue}"):
                await channel.queue_delete(queue)
        finally:
            await close_quietly(channel)

    async def browse(self, queue: str, limit: int, take: Callable[[bytes], bool] | None = None) -> Browsed:
        """The first ``limit`` messages of ``queue``, consumed for good only where ``take`` says
        so (see :func:`truba.pipes.rabbit.browse.browse`)."""
        return await browse(await self._channel(confirms=False), queue, limit, take)

    async def message_count(self, queue: str) -> int | None:
        """Ready messages in ``queue``, or None if it does not exist."""
        channel = await self._channel(confirms=False)
        try:
            amqp_queue = await channel.declare_queue(queue, passive=True)
        except amqp.ChannelNotFoundEntity:
            return None
        finally:
            await close_quietly(channel)
        return amqp_queue.declaration_result.message_count or 0

    async def close(self) -> None:
        """Closes the connection and every channel on it; idempotent."""
        if not self._connection.is_closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._connection.close(), 5.0)


@final
class RabbitBroker:
    """The link to one broker: one shared connection, reopened when it is gone, a channel per leaf.

    Leaves of many pipes share the connection (RabbitMQ limits connections, not channels). When
    the connection dies, every leaf on it breaks; the first reopen of any of them opens a new
    connection, the others reuse it. Connection attempts are serialized and bounded.
    """

    def __init__(
        self,
        url: str,
        *,
        name: str,
        heartbeat: float = 10.0,
        connect_timeout: float = 10.0,
        on_connect: Callable[[str], None] | None = None,
    ) -> None:
        """``on_connect(url)`` hears of every connection opened (the first one and each reconnect)."""
        self.url = url
        self.name = name
        self.heartbeat = heartbeat
        self.connect_timeout = connect_timeout
        self.on_connect = on_connect
        self._connection: RabbitConnection | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    def __repr__(self) -> str:
        return f"RabbitBroker({redact(self.url)})"

    async def connection(self) -> RabbitConnection:
        """The open connection, connecting first if there is none (the error goes to the caller)."""
        async with self._lock:
            if self._closed:
                raise PipeClosed(f"link to {redact(self.url)} is closed")
            if self._connection is None or self._connection.is_closed:
                self._connection = await RabbitConnection.open(
                    self.url, name=self.name, heartbeat=self.heartbeat, timeout=self.connect_timeout
                )
                if self.on_connect is not None:
                    self.on_connect(self.url)
            return self._connection

    async def sender(
        self,
        queue: str | QueueSpec,
        *,
        confirm_timeout: float = 30.0,
        max_unconfirmed: int = 1000,
        priority: int | None = None,
        copy_to: str | QueueSpec | None = None,
        delayed: bool = False,
    ) -> RabbitSender:
        """A fresh sending leaf on the shared connection (a connector for reopen)."""
        connection = await self.connection()
        return await connection.sender(
            queue,
            confirm_timeout=confirm_timeout,
            max_unconfirmed=max_unconfirmed,
            priority=priority,
            copy_to=copy_to,
            delayed=delayed,
        )

    async def listener(self, queue: str | QueueSpec, *, prefetch: int) -> RabbitListener:
        """A fresh listening leaf on the shared connection (a connector for reopen)."""
        connection = await self.connection()
        return await connection.listener(queue, prefetch=prefetch)

    async def read_log(
        self, queue: str, since: float | None, each: Callable[[bytes], None], *, timeout: float
    ) -> int:
        """Reads the stream ``queue`` since ``since`` (None: as far back as it is kept), connecting
        first, all within ``timeout`` seconds (see :meth:`RabbitConnection.read_stream`)."""
        start = time.time() - STREAM_MAX_AGE_SECONDS if since is None else since
        async with asyncio.timeout(timeout):
            connection = await self.connection()
            return await connection.read_stream(queue, start, each, timeout=timeout)

    async def has_queue(self, name: str) -> bool:
        """Whether ``name`` exists (a passive declare on a fresh channel)."""
        connection = await self.connection()
        return await connection.message_count(name) is not None

    async def declare(self, spec: QueueSpec) -> None:
        """Declares ``spec`` on the shared connection (see :meth:`RabbitConnection.declare`)."""
        connection = await self.connection()
        await connection.declare(spec)

    async def close(self) -> None:
        """Closes the connection and every leaf on it; idempotent."""
        self._closed = True
        if self._connection is not None:
            await self._connection.close()


def _name(queue: str | QueueSpec) -> str:
    return queue.name if isinstance(queue, QueueSpec) else queue


def rabbit_brokers(
    name: str,
    *,
    heartbeat: float = 10.0,
    connect_timeout: float = 10.0,
    on_connect: Callable[[str], None] | None = None,
) -> BrokerFactory:
    """A :data:`~truba.pipes.broker.BrokerFactory` of :class:`RabbitBroker` links that introduce
    themselves as ``name`` (``on_connect(url)``: each connection opened, e.g. for a metric)."""

    def open_link(url: str) -> Broker:
        return RabbitBroker(
            url, name=name, heartbeat=heartbeat, connect_timeout=connect_timeout, on_connect=on_connect
        )

    return open_link
