"""The data-plane brokers as the scheduler administers them: declare and delete job queues.

Each broker has one admin connection, opened on first use and opened again after it closed or
broke. Every operation is bounded by a timeout, and a connection that failed or timed out is
dropped, so the next operation starts afresh instead of hanging on a half-dead socket.

Brokers are independent (no RabbitMQ clustering): a job's queues exist once on each of them.
AMQP itself stays in :mod:`truba.pipes.rabbit` (the connector comes from
:mod:`truba.scheduler.wiring`); this module sees only PipeErrors.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar, final

from truba.pipes.broker import Browsed, QueueSpec, redact
from truba.pipes.errors import ChannelLost, PipeBroken, PipeError, SendTimeout
from truba.scheduler.errors import Unavailable
from truba.scheduler.model import JobQueues

log = logging.getLogger(__name__)

T = TypeVar("T")


class AdminConnection(Protocol):
    """What the scheduler does on a broker: declare and delete queues (RabbitMQ: ``RabbitConnection``)."""

    @property
    def is_closed(self) -> bool: ...

    async def declare(self, spec: QueueSpec) -> None: ...

    async def delete(self, queue: str) -> None: ...

    async def browse(self, queue: str, limit: int, take: Callable[[bytes], bool] | None = None) -> Browsed:
        """The first ``limit`` messages of ``queue`` (none if it is missing); only those ``take``
        chooses leave the queue."""
        ...

    async def close(self) -> None: ...


class Connector(Protocol):
    """Opens an :class:`AdminConnection` (:func:`truba.scheduler.wiring.open_admin` in production)."""

    def __call__(
        self, url: str, *, name: str, heartbeat: float, timeout: float
    ) -> Awaitable[AdminConnection]: ...


@dataclass(frozen=True)
class BrokerInfo:
    """A broker as clients and daemons are told about it: ``name`` is "b0", "b1", ... by position."""

    name: str
    url: str

    def __str__(self) -> str:
        return f"broker {self.name} ({redact(self.url)})"


@final
class BrokerAdmin:
    """One broker and the scheduler's admin connection to it.

    Raises (from every operation): PipeError, e.g. ConnectionLost when the broker is down, or
    SendTimeout when the operation took longer than ``timeout`` seconds.
    """

    def __init__(self, info: BrokerInfo, connect: Connector, *, timeout: float = 10.0) -> None:
        self.info = info
        self._connect = connect
        self._timeout = timeout
        self._connection: AdminConnection | None = None
        self._lock = asyncio.Lock()

    async def _open(self) -> AdminConnection:
        async with self._lock:  # one reconnect at a time, shared by concurrent callers
            if self._connection is None or self._connection.is_closed:
                self._connection = await self._connect(
                    self.info.url,
                    name=f"truba-scheduler-{self.info.name}",
                    heartbeat=10,
                    timeout=self._timeout,
                )
            return self._connection

    async def _run(self, what: str, operation: Callable[[AdminConnection], Awaitable[T]]) -> T:
        connection = await self._open()
        try:
            return await asyncio.wait_for(operation(connection), self._timeout)
        except TimeoutError:
            await self._drop(connection)
            raise SendTimeout(f"{what} on {self.info}: no answer within {self._timeout:g}s") from None
        except PipeBroken:
            await self._drop(connection)
            raise

    async def _drop(self, connection: AdminConnection) -> None:
        if self._connection is connection:
            self._connection = None
        await connection.close()

    async def declare(self, queues: JobQueues) -> None:
        """Declares the job's queues and its record stream (idempotent).

        The task queue (with its dead-letter queue) goes first, on its own time bound: on a
        broker's first job it also declares the broker's delay levels (32 quorum queues: seconds
        on a busy machine). The queues of each step are declared at once, each on its own
        channel (a quorum queue's declare waits for its Raft member to start): CreateJob
        waits for the slowest, not for the sum."""

        async def declare_tasks(connection: AdminConnection) -> None:
            # The task queue dead-letters into the dead one; nothing can be dead-lettered before
            # CreateJob returns, so they need no order.
            await asyncio.gather(
                connection.declare(queues.spec(queues.dead)), connection.declare(queues.spec(queues.tasks))
            )

        await self._run(f"declare {queues.tasks}", declare_tasks)

        async def declare_record(connection: AdminConnection) -> None:
            try:
                await connection.declare(queues.spec(queues.result_log))
            except ChannelLost as exc:  # a broker without streams: the job runs without a record
                log.warning(
                    "sched.queues.no_record",
                    extra={"broker": self.info.name, "queue": queues.result_log, "error": str(exc)},
                )

        async def declare_rest(connection: AdminConnection) -> None:
            rest = [
                connection.declare(spec)
                for spec in queues.specs()
                if spec.name not in (queues.result_log, queues.tasks, queues.dead)
            ]
            await asyncio.gather(*rest, declare_record(connection))

        await self._run(f"declare {queues.tasks}", declare_rest)

    async def delete(self, queues: JobQueues, *, keep_dead: bool = False) -> None:
        """Deletes the job's queues (and its clients' marker) with their messages, but for its
        dead-letter queue with ``keep_dead``; missing queues are no error."""

        async def delete_all(connection: AdminConnection) -> None:
            for name in (*queues.all(), queues.marker):
                if not (keep_dead and name == queues.dead):
                    await connection.delete(name)

        await self._run(f"delete {queues.tasks}", delete_all)

    async def delete_dead(self, dead: str) -> None:
        """Deletes a job's dead-letter queue with its messages; a missing queue is no error."""
        await self._run(f"delete {dead}", lambda connection: connection.delete(dead))

    async def browse(self, queue: str, limit: int, take: Callable[[bytes], bool] | None = None) -> Browsed:
        """The first ``limit`` messages of ``queue``, consumed for good only where ``take`` says so."""
        return await self._run(f"browse {queue}", lambda connection: connection.browse(queue, limit, take))

    async def close(self) -> None:
        """Closes the admin connection; a later operation opens a new one."""
        if self._connection is not None:
            await self._drop(self._connection)


@final
class Brokers:
    """Every configured broker; declares a job's queues on all of them at once."""

    def __init__(self, urls: Sequence[str], *, connect: Connector, timeout: float = 10.0) -> None:
        if not urls:
            raise ValueError("at least one broker URL is required")
        self.all = tuple(
            BrokerAdmin(BrokerInfo(f"b{i}", url), connect, timeout=timeout) for i, url in enumerate(urls)
        )

    @property
    def infos(self) -> tuple[BrokerInfo, ...]:
        return tuple(broker.info for broker in self.all)

    async def declare(self, queues: JobQueues) -> None:
        """Declares the job's queues on every broker, concurrently.

        Raises:
            Unavailable: some broker failed; the message names each one and why. Queues may
                exist on the others: the caller must have the job's queues deleted.
        """
        results = await asyncio.gather(
            *(broker.declare(queues) for broker in self.all), return_exceptions=True
        )
        failures = []
        for broker, result in zip(self.all, results, strict=True):
            if isinstance(result, PipeError):
                log.warning(
                    "sched.broker.declare_failed",
                    extra={"broker": broker.info.name, "queue": queues.tasks, "error": str(result)},
                )
                failures.append(f"{broker.info} is unavailable: {type(result).__name__}: {result}")
            elif isinstance(result, BaseException):
                raise result
        if failures:
            raise Unavailable("; ".join(failures))

    async def close(self) -> None:
        """Closes every admin connection."""
        await asyncio.gather(*(broker.close() for broker in self.all))
