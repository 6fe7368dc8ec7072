"""Fakes for the scheduler's unit tests: brokers without RabbitMQ, a manual clock."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from truba.pipes.base import Delivery
from truba.pipes.broker import Browsed, QueuedMessage, QueueSpec, redact
from truba.pipes.errors import ChannelLost, ConnectionLost, PipeClosed
from truba.queues import JobQueues
from truba.scheduler.brokers import AdminConnection, Brokers
from truba.wire import ResultMessage


@dataclass
class FakeBroker:
    """A scriptable broker: its queues, whether it is down, how often it was connected to."""

    url: str
    queues: dict[str, QueueSpec] = field(default_factory=dict)
    down: bool = False
    hang: bool = False
    connects: int = 0
    deletes: int = 0
    refuses: set[str] = field(default_factory=set)
    """Queue kinds it refuses to declare (as a broker without streams refuses streams)."""
    declaring: int = 0
    most_declaring: int = 0
    """The most declares it had under way at once (each takes a loop turn, as a channel would)."""
    messages: dict[str, list[QueuedMessage]] = field(default_factory=dict)
    """Messages in its queues (only browsed here), oldest first."""


class FakeConnection:
    """An :class:`AdminConnection` to a :class:`FakeBroker`."""

    def __init__(self, broker: FakeBroker) -> None:
        self.broker = broker
        self.closed = False

    @property
    def is_closed(self) -> bool:
        return self.closed

    async def _check(self) -> None:
        if self.broker.hang:
            await asyncio.sleep(3600)
        if self.broker.down or self.closed:
            self.closed = True
            raise ConnectionLost(f"{redact(self.broker.url)}: connection lost")

    async def declare(self, spec: QueueSpec) -> None:
        await self._check()
        broker = self.broker
        broker.declaring += 1
        broker.most_declaring = max(broker.most_declaring, broker.declaring)
        try:
            await asyncio.sleep(0)
        finally:
            broker.declaring -= 1
        if spec.kind in broker.refuses:
            raise ChannelLost(f"declare {spec.name}: channel closed by the broker: COMMAND_INVALID")
        broker.queues[spec.name] = spec

    async def delete(self, queue: str) -> None:
        await self._check()
        self.broker.deletes += 1
        self.broker.queues.pop(queue, None)
        self.broker.messages.pop(queue, None)

    async def browse(self, queue: str, limit: int, take: Callable[[bytes], bool] | None = None) -> Browsed:
        await self._check()
        if queue not in self.broker.queues:
            return Browsed((), 0)
        held = self.broker.messages.setdefault(queue, [])
        total = len(held)
        seen = [
            QueuedMessage(m.body, m.headers, taken=take is not None and take(m.body)) for m in held[:limit]
        ]
        taken = [m.body for m in seen if m.taken]
        for body in taken:
            held.remove(next(m for m in held if m.body == body))
        return Browsed(tuple(seen), total)

    async def close(self) -> None:
        self.closed = True


@dataclass
class FakeCluster:
    """Fake brokers and a :class:`Brokers` connected to them."""

    fakes: list[FakeBroker]
    brokers: Brokers


def make_fake_cluster(count: int = 2, timeout: float = 1.0) -> FakeCluster:
    fakes = [FakeBroker(f"amqp://guest:secret@127.0.0.1:{5672 + i}/") for i in range(count)]
    by_url = {fake.url: fake for fake in fakes}

    async def connect(url: str, *, name: str, heartbeat: float, timeout: float) -> AdminConnection:
        broker = by_url[url]
        broker.connects += 1
        if broker.down:
            raise ConnectionLost(f"connect {redact(url)}: refused")
        return FakeConnection(broker)

    return FakeCluster(fakes, Brokers([f.url for f in fakes], connect=connect, timeout=timeout))


class ManualClock:
    """A clock that moves only when told to."""

    def __init__(self, now: float = 1_750_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


async def no_sleep(_: float) -> None:
    await asyncio.sleep(0)


@dataclass
class FakePipe:
    """A schedule job's pipes (:class:`~truba.scheduler.schedule_pipes.RunPipe`): runs sent are
    recorded (or refused with ``fail``); no result ever comes."""

    sent: list[tuple[str, bytes]] = field(default_factory=list)
    expires: list[float] = field(default_factory=list)
    fail: bool = False

    async def fire(self, task_id: str, payload: bytes, expires: float) -> None:
        if self.fail:
            raise PipeClosed("broker gone")
        self.sent.append((task_id, payload))
        self.expires.append(expires)

    async def outcome(self, timeout: float) -> Delivery[ResultMessage] | None:
        await asyncio.sleep(0)
        return None

    async def close(self) -> None:
        pass


@dataclass
class FakePipes:
    """Opens one :class:`FakePipe` per job (by its task queue)."""

    pipes: dict[str, FakePipe] = field(default_factory=dict)

    def open(self, queues: JobQueues) -> FakePipe:
        return self.pipes.setdefault(queues.tasks, FakePipe())

    async def close(self) -> None:
        pass
