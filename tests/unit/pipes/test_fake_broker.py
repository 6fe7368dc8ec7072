"""FakeBroker: its leaves pass the pipes' contract suite, as RabbitMQ's do, and its scripted faults
behave as the real ones that they stand for."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.unit.pipes.contract import (
    UNIT,
    ListenerCheck,
    ListenerHarness,
    SenderCheck,
    SenderHarness,
    listener_checks,
    sender_checks,
)
from truba.backoff import Backoff
from truba.pipes.base import Listener, Sender
from truba.pipes.broker import SENT_AT, QueueSpec
from truba.pipes.errors import ChannelLost, ConnectionLost, MessageRejected, PipeClosed, SendTimeout
from truba.pipes.fake_broker import FakeBroker
from truba.pipes.fake_leaves import FakeBrokerListener, FakeBrokerSender
from truba.pipes.reopen import ReopenSender
from truba.pipes.reopen_listener import ReopenListener

QUEUE = "q"


async def _no_sleep(_: float) -> None:
    return None


FAST = Backoff(attempts=None, sleep=_no_sleep)


class SenderBottom:
    partial_confirms = False

    def __init__(self, broker: FakeBroker) -> None:
        self.broker = broker
        self.leaves: list[FakeBrokerSender] = []

    @property
    def opened(self) -> int:
        return len(self.leaves)

    def message(self, i: int) -> bytes:
        return f"m{i}".encode()

    async def connect(self) -> FakeBrokerSender:
        leaf = await self.broker.sender(QUEUE, confirm_timeout=30.0)
        self.leaves.append(leaf)
        return leaf

    async def hold(self) -> None:
        self.broker.stall()

    async def release(self, count: int | None = None) -> None:
        assert count is None
        self.broker.resume()

    async def break_(self) -> None:
        self.broker.break_connection()

    async def open_leaves(self) -> int:
        still_open = 0
        for leaf in self.leaves:
            try:
                await leaf.send(b"probe")
            except PipeClosed:
                continue
            except Exception:
                pass
            still_open += 1
        return still_open


class ListenerBottom:
    def __init__(self, broker: FakeBroker) -> None:
        self.broker = broker
        self.leaves: list[FakeBrokerListener] = []

    @property
    def opened(self) -> int:
        return len(self.leaves)

    def message(self, i: int) -> bytes:
        return f"m{i}".encode()

    async def connect(self) -> FakeBrokerListener:
        leaf = await self.broker.listener(QUEUE, prefetch=10)
        self.leaves.append(leaf)
        return leaf

    async def push(self, message: bytes) -> None:
        pusher = await self.broker.sender(QUEUE)
        await (await pusher.send(message))
        await pusher.close()

    async def break_(self) -> None:
        self.broker.break_connection()

    async def open_leaves(self) -> int:
        still_open = 0
        for leaf in self.leaves:
            try:
                await leaf.get(0.001)
            except PipeClosed:
                continue
            except Exception:
                pass
            still_open += 1
        return still_open

    async def backlog(self) -> int:
        return len(self.broker.messages(QUEUE))


def fake_senders(*, reopen: bool) -> Any:
    @contextlib.asynccontextmanager
    async def make(*, rejecting: bool = False) -> AsyncIterator[SenderHarness[bytes]]:
        broker = FakeBroker()
        if not rejecting:
            await broker.declare(QueueSpec(QUEUE))
        bottom = SenderBottom(broker)
        sender: Sender[bytes] = (
            ReopenSender(bottom.connect, label=QUEUE, backoff=FAST) if reopen else await bottom.connect()
        )
        try:
            yield SenderHarness(sender, bottom, UNIT, reopens=reopen)
        finally:
            broker.resume()
            await sender.close()

    return make


def fake_listeners(*, reopen: bool) -> Any:
    @contextlib.asynccontextmanager
    async def make() -> AsyncIterator[ListenerHarness[bytes]]:
        broker = FakeBroker()
        await broker.declare(QueueSpec(QUEUE))
        bottom = ListenerBottom(broker)
        listener: Listener[bytes] = (
            ReopenListener(bottom.connect, label=QUEUE, backoff=FAST) if reopen else await bottom.connect()
        )
        try:
            yield ListenerHarness(listener, bottom, UNIT, reopens=reopen)
        finally:
            await listener.close()

    return make


def _cases(checks: Any) -> list[Any]:
    return [
        pytest.param(reopen, check, id=f"{'reopen-' if reopen else ''}fake-{name}")
        for reopen in (False, True)
        for name, check in checks(reopens=reopen).items()
    ]


@pytest.mark.parametrize(("reopen", "check"), _cases(sender_checks))
async def test_fake_broker_sender_contract(reopen: bool, check: SenderCheck) -> None:
    await check(fake_senders(reopen=reopen))


@pytest.mark.parametrize(("reopen", "check"), _cases(listener_checks))
async def test_fake_broker_listener_contract(reopen: bool, check: ListenerCheck) -> None:
    await check(fake_listeners(reopen=reopen))


async def test_what_a_sender_publishes_a_listener_gets_with_the_sent_at_stamp() -> None:
    broker = FakeBroker()
    sender = await broker.sender(QueueSpec(QUEUE))
    await (await sender.send(b"hello"))
    listener = await broker.listener(QUEUE, prefetch=1)
    delivery = await listener.get(0.1)
    assert delivery is not None and delivery.message == b"hello" and not delivery.redelivered
    assert isinstance(delivery.headers[SENT_AT], int)
    await delivery.ack()
    assert await listener.get(0.01) is None
    assert broker.messages(QUEUE) == []


async def test_requeued_deliveries_come_back_redelivered_with_a_count_on_quorum_queues() -> None:
    broker = FakeBroker()
    await broker.declare(QueueSpec(QUEUE))
    sender = await broker.sender(QUEUE)
    await (await sender.send(b"t"))
    listener = await broker.listener(QUEUE, prefetch=5)
    first = await listener.get(0.1)
    assert first is not None
    await first.reject(requeue=True)
    again = await listener.get(0.1)
    assert again is not None and again.redelivered and again.headers["x-delivery-count"] == 1
    with pytest.raises(ChannelLost):  # settled once only
        await first.ack()


async def test_a_rejected_delivery_is_dead_lettered() -> None:
    broker = FakeBroker()
    await broker.declare(QueueSpec("dead"))
    await broker.declare(QueueSpec(QUEUE, dead_letter_to="dead"))
    sender = await broker.sender(QUEUE)
    await (await sender.send(b"poison"))
    listener = await broker.listener(QUEUE, prefetch=1)
    delivery = await listener.get(0.1)
    assert delivery is not None
    await delivery.reject(requeue=False)
    assert broker.messages("dead") == [b"poison"] and broker.messages(QUEUE) == []


async def test_the_prefetch_window_bounds_unsettled_deliveries() -> None:
    broker = FakeBroker()
    sender = await broker.sender(QueueSpec(QUEUE))
    for i in range(3):
        await (await sender.send(bytes([i])))
    listener = await broker.listener(QUEUE, prefetch=2)
    first, second = await listener.get(0.1), await listener.get(0.1)
    assert first is not None and second is not None
    assert await listener.get(0.01) is None
    await listener.set_prefetch(3)
    assert await listener.get(0.1) is not None


async def test_a_message_to_a_missing_queue_is_returned_and_stays_unconfirmed() -> None:
    broker = FakeBroker()
    sender = await broker.sender("nowhere")
    with pytest.raises(MessageRejected):
        await (await sender.send(b"x"))
    assert list(sender.unconfirmed()) == [b"x"]


async def test_a_broken_connection_returns_unsettled_deliveries_and_fails_confirms() -> None:
    broker = FakeBroker()
    sender = await broker.sender(QueueSpec(QUEUE))
    await (await sender.send(b"a"))
    listener = await broker.listener(QUEUE, prefetch=5)
    assert await listener.get(0.1) is not None
    broker.stall()
    pending = await sender.send(b"b")
    broker.break_connection()
    with pytest.raises(ConnectionLost):
        await pending
    assert b"b" in sender.unconfirmed()
    with pytest.raises(ConnectionLost):
        await listener.get(0.01)
    broker.resume()
    assert broker.messages(QUEUE) == [b"a", b"b"]  # "b" reached the queue: sent again, a duplicate
    fresh = await broker.listener(QUEUE, prefetch=5)
    redelivered = await fresh.get(0.1)
    assert redelivered is not None and redelivered.message == b"a" and redelivered.redelivered


async def test_a_stall_times_confirms_out_and_holds_deliveries() -> None:
    broker = FakeBroker()
    sender = await broker.sender(QueueSpec(QUEUE), confirm_timeout=0.05)
    listener = await broker.listener(QUEUE, prefetch=5)
    broker.stall()
    with pytest.raises(SendTimeout):
        await (await sender.send(b"late"))
    assert await listener.get(0.02) is None
    broker.resume()
    assert await listener.get(0.1) is not None


async def test_refused_then_allowed() -> None:
    broker = FakeBroker()
    broker.refuse()
    with pytest.raises(ConnectionLost):
        await broker.sender(QUEUE)
    with pytest.raises(ConnectionLost):
        await broker.has_queue(QUEUE)
    broker.refuse(False)
    assert not await broker.has_queue(QUEUE)


async def test_dropping_a_queue_breaks_its_consumers_and_losing_data_empties_the_broker() -> None:
    broker = FakeBroker()
    await broker.declare(QueueSpec("other"))
    listener = await broker.listener(QueueSpec(QUEUE), prefetch=1)
    broker.drop_queue(QUEUE)
    with pytest.raises(ChannelLost):
        await listener.get(0.01)
    assert not await broker.has_queue(QUEUE) and await broker.has_queue("other")
    broker.lose_data()
    assert broker.queues == {}


async def test_a_stream_is_read_from_a_point_in_time_and_copies_share_the_confirm() -> None:
    broker = FakeBroker()
    record = QueueSpec("record", kind="stream")
    sender = await broker.sender(QueueSpec(QUEUE), copy_to=record)
    for body in (b"r1", b"r2"):
        await (await sender.send(body))
    seen: list[bytes] = []
    assert await broker.read_log("record", None, seen.append, timeout=1.0) == 2
    assert seen == [b"r1", b"r2"] and broker.messages(QUEUE) == [b"r1", b"r2"]
    assert await broker.read_log("record", 4e9, seen.append, timeout=1.0) == 0
    with pytest.raises(ChannelLost):
        await broker.read_log(QUEUE, None, seen.append, timeout=1.0)


async def test_a_closed_broker_refuses_everything_and_closes_its_leaves() -> None:
    broker = FakeBroker()
    sender = await broker.sender(QueueSpec(QUEUE))
    await broker.close()
    with pytest.raises(PipeClosed):
        await sender.send(b"x")
    with pytest.raises(PipeClosed):
        await broker.listener(QUEUE, prefetch=1)
