"""The RabbitMQ leaves against real brokers: confirms, returns, bounded waits, settling."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Callable

import pytest

from truba.pipes.base import Delivery, Sender
from truba.pipes.broker import QueueSpec
from truba.pipes.errors import ChannelLost, MessageRejected, PipeClosed, SendTimeout
from truba.pipes.rabbit import RabbitConnection
from truba.pipes.rabbit.listener import RETIRE_WAIT

pytestmark = pytest.mark.integration


@pytest.fixture
async def connection(
    rabbit_nodes: list[object], request: pytest.FixtureRequest
) -> AsyncIterator[RabbitConnection]:
    conn = await RabbitConnection.open(rabbit_nodes[0].url, name=request.node.nodeid, heartbeat=5)  # type: ignore[attr-defined]
    yield conn
    await conn.close()


def _queue(request: pytest.FixtureRequest) -> str:
    name: str = request.node.name
    return "truba.test." + name.replace("[", ".").replace("]", "")


async def _filled(
    connection: RabbitConnection, request: pytest.FixtureRequest, count: int, queue_type: str = "quorum"
) -> tuple[str, Sender[bytes], list[bytes]]:
    """A new queue (quorum by default) holding ``count`` confirmed messages, its sender, and the
    messages."""
    name = _queue(request)
    await connection.declare(QueueSpec(name, queue_type))
    sender = await connection.sender(name)
    messages = [f"m{i:03}".encode() for i in range(count)]
    await asyncio.gather(*[await sender.send(message) for message in messages])
    return name, sender, messages


async def test_published_messages_are_confirmed_persistent_and_consumed_in_order(
    connection: RabbitConnection, request: pytest.FixtureRequest
) -> None:
    name = _queue(request)
    await connection.declare(QueueSpec(name, "quorum"))
    sender = await connection.sender(name)
    confirmations = [await sender.send(f"m{i}".encode()) for i in range(100)]
    await asyncio.gather(*confirmations)
    assert sender.unconfirmed() == []
    assert await connection.message_count(name) == 100
    listener = await connection.listener(name, prefetch=10)
    got = []
    for _ in range(100):
        delivery = await listener.get(5.0)
        assert delivery is not None
        got.append(delivery.message)
        await delivery.ack()
    assert got == [f"m{i}".encode() for i in range(100)]
    assert await listener.get(0.2) is None
    await listener.close()
    await sender.close()
    await sender.close()  # idempotent
    with pytest.raises(PipeClosed):
        await sender.send(b"late")
    await connection.delete(name)


async def test_a_message_to_a_missing_queue_is_returned_and_stays_unconfirmed(
    connection: RabbitConnection, request: pytest.FixtureRequest
) -> None:
    sender = await connection.sender(_queue(request) + ".missing")
    confirmation = await sender.send(b"nobody listens")
    with pytest.raises(MessageRejected, match="unroutable"):
        await confirmation
    assert sender.unconfirmed() == [b"nobody listens"]  # still ours, to send again
    await sender.close()


async def test_rejected_deliveries_requeue_or_dead_letter(
    connection: RabbitConnection, request: pytest.FixtureRequest
) -> None:
    name, dead = _queue(request), _queue(request) + ".dead"
    await connection.declare(QueueSpec(dead, "classic"))
    await connection.declare(QueueSpec(name, "quorum", dead_letter_to=dead))
    sender = await connection.sender(name)
    await asyncio.gather(await sender.send(b"again"), await sender.send(b"poison"))
    listener = await connection.listener(name, prefetch=2)
    first = await listener.get(5.0)
    second = await listener.get(5.0)
    assert first is not None and second is not None
    await first.reject(requeue=True)
    await second.reject(requeue=False)
    redelivered = await listener.get(5.0)
    assert redelivered is not None and redelivered.message == b"again" and redelivered.redelivered
    assert redelivered.headers.get("x-delivery-count") == 1
    await redelivered.ack()
    for _ in range(50):
        if await connection.message_count(dead) == 1:
            break
        await asyncio.sleep(0.1)
    assert await connection.message_count(dead) == 1
    await listener.close()
    await sender.close()
    await connection.delete(name)
    await connection.delete(dead)


async def test_settling_on_a_closed_channel_raises_channel_lost_and_the_broker_requeues(
    connection: RabbitConnection, request: pytest.FixtureRequest
) -> None:
    name = _queue(request)
    await connection.declare(QueueSpec(name, "quorum"))
    sender = await connection.sender(name)
    await (await sender.send(b"task"))
    listener = await connection.listener(name, prefetch=1)
    delivery = await listener.get(5.0)
    assert delivery is not None
    await listener.close()  # the channel goes away with the unacked delivery
    with pytest.raises(ChannelLost):
        await delivery.ack()
    again = await connection.listener(name, prefetch=1)
    redelivered = await again.get(5.0)
    assert redelivered is not None and redelivered.message == b"task" and redelivered.redelivered
    await redelivered.ack()
    await again.close()
    await sender.close()
    await connection.delete(name)


async def test_a_new_prefetch_applies_to_the_running_consumer_and_loses_or_doubles_nothing(
    connection: RabbitConnection, request: pytest.FixtureRequest
) -> None:
    # RabbitMQ applies basic.qos to consumers started after it only: the leaf starts a new
    # consumer under the new size and cancels the old one (the daemon's window grows once a
    # job's tasks are known to be short; before, it stayed at its first size).
    name, sender, messages = await _filled(connection, request, 40)
    listener = await connection.listener(name, prefetch=2)

    async def held() -> list[Delivery[bytes]]:
        got = []
        while (delivery := await listener.get(0.3)) is not None:
            got.append(delivery)
        return got

    async def ack(deliveries: list[Delivery[bytes]]) -> list[bytes]:
        for delivery in deliveries:
            await delivery.ack()
        return [delivery.message for delivery in deliveries]

    first = await held()
    assert len(first) == 2
    await listener.set_prefetch(6)
    grown = await held()
    assert len(grown) == 6  # the old consumer's 2 are still held, and settleable
    taken = await ack(first + grown)
    again = await held()
    assert len(again) == 6  # the old consumer is gone: its credit does not add up
    await listener.set_prefetch(3)
    shrunk = await held()
    assert len(shrunk) == 3
    taken += await ack(again + shrunk)
    while batch := await held():
        assert len(batch) <= 3
        taken += await ack(batch)
    assert sorted(taken) == messages  # each once
    assert await connection.message_count(name) == 0
    await listener.close()
    await sender.close()
    await connection.delete(name)


async def _every_ack_arrives(connection: RabbitConnection, name: str) -> None:
    """The queue empties within RETIRE_WAIT and some: acks held back by a retiring consumer went out."""
    async with asyncio.timeout(RETIRE_WAIT + 5.0):
        while await connection.message_count(name):
            await asyncio.sleep(0.1)


@pytest.mark.parametrize("queue_type", ["quorum", "classic"])
async def test_prefetch_changes_under_a_flowing_queue_redeliver_nothing(
    connection: RabbitConnection, request: pytest.FixtureRequest, queue_type: str
) -> None:
    # A quorum queue (RabbitMQ 3.10) gives back what was on its way to a consumer when its cancel
    # came, marked redelivered with x-delivery-count 1: the daemon would count an attempt its
    # task never ran (CI saw a task listed at attempt 2 in a run without faults). The leaf
    # cancels a replaced consumer only once it is full, its settles held back until then.
    name, sender, messages = await _filled(connection, request, 1200, queue_type)
    listener = await connection.listener(name, prefetch=2)
    rng = random.Random(7)

    async def flip() -> None:
        size = 2
        while True:
            await asyncio.sleep(rng.uniform(0, 0.003))
            size = 6 - size
            await listener.set_prefetch(size)

    flipping = asyncio.create_task(flip())
    taken: list[bytes] = []
    redelivered: list[bytes] = []
    while len(taken) < len(messages):
        delivery = await listener.get(5.0)
        assert delivery is not None, f"{len(taken)} of {len(messages)} taken"
        taken.append(delivery.message)
        if delivery.redelivered or delivery.headers.get("x-delivery-count"):
            redelivered.append(delivery.message)
        if rng.random() < 0.5:
            await asyncio.sleep(0.0005)  # a slot's work: deliveries arrive meanwhile
        await delivery.ack()
    flipping.cancel()
    assert redelivered == [] and sorted(taken) == sorted(messages)
    # A replaced consumer that never fills (the queue is empty now) is cancelled after
    # RETIRE_WAIT, and the acks it held back go out then.
    await _every_ack_arrives(connection, name)
    await listener.close()
    await sender.close()
    await connection.delete(name)


async def test_a_new_prefetch_cancelled_midway_loses_no_delivery_and_no_ack(
    connection: RabbitConnection, request: pytest.FixtureRequest
) -> None:
    # A resize cancelled at any point of its swap (qos, consume, retire) leaves one consumer
    # counted, and the acks its old consumer held back go out.
    name, sender, messages = await _filled(connection, request, 60)
    listener = await connection.listener(name, prefetch=2)
    taken: list[bytes] = []
    for step in range(8):
        held = [await listener.get(5.0), await listener.get(5.0)]
        resizing = asyncio.create_task(listener.set_prefetch(3 + step % 2))
        await asyncio.sleep(step * 0.001)
        resizing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await resizing
        for delivery in held:
            assert delivery is not None and not delivery.redelivered
            taken.append(delivery.message)
            await delivery.ack()
    while len(taken) < len(messages):
        delivery = await listener.get(5.0)
        assert delivery is not None, f"{len(taken)} of {len(messages)} taken"
        assert not delivery.redelivered, delivery.message
        taken.append(delivery.message)
        await delivery.ack()
    assert sorted(taken) == sorted(messages)
    await _every_ack_arrives(connection, name)
    await listener.close()
    await sender.close()
    await connection.delete(name)


async def test_a_cancel_during_a_new_prefetch_leaves_no_consumer_behind(
    connection: RabbitConnection, request: pytest.FixtureRequest
) -> None:
    # The runner's close cancels the consumer while a resize may be starting a new one: the
    # cancel waits for that swap and cancels what it started, so nothing more is delivered.
    # The cancel comes at different moments of the swap (qos, consume, cancel: one RPC each).
    name, sender, _ = await _filled(connection, request, 200)
    taken = 0
    for delay in (0.0, 0.0005, 0.001, 0.002, 0.003, 0.004, 0.006, 0.008, 0.012, 0.02):
        listener = await connection.listener(name, prefetch=2)
        held = [await listener.get(5.0), await listener.get(5.0)]
        resizing = asyncio.create_task(listener.set_prefetch(6))
        await asyncio.sleep(delay)
        await listener.cancel()
        await resizing
        while (delivery := await listener.get(0.0)) is not None:
            held.append(delivery)
        for delivery in held:
            assert delivery is not None
            await delivery.ack()
        taken += len(held)
        await asyncio.sleep(0.3)  # a consumer left running would be sent more now that credit is back
        assert await listener.get(0.0) is None, delay
        assert await connection.message_count(name) == 200 - taken
        await listener.close()
    await sender.close()
    await connection.delete(name)


async def test_a_blocked_get_wakes_with_pipe_closed(
    connection: RabbitConnection, request: pytest.FixtureRequest
) -> None:
    name = _queue(request)
    await connection.declare(QueueSpec(name, "quorum"))
    listener = await connection.listener(name, prefetch=1)
    waiter = asyncio.create_task(listener.get(30.0))
    await asyncio.sleep(0.1)
    await listener.close()
    with pytest.raises(PipeClosed):
        await asyncio.wait_for(waiter, 5.0)
    await connection.delete(name)


async def test_a_memory_alarm_bounds_the_confirm_wait_and_keeps_the_message(
    fresh_nodes: Callable[[int], list[object]], request: pytest.FixtureRequest
) -> None:
    (node,) = fresh_nodes(1)
    connection = await RabbitConnection.open(node.url, name=request.node.nodeid, heartbeat=5)  # type: ignore[attr-defined]
    name = _queue(request)
    await connection.declare(QueueSpec(name, "quorum"))
    sender = await connection.sender(name, confirm_timeout=2.0)
    await asyncio.to_thread(node.set_memory_alarm, True)  # type: ignore[attr-defined]
    try:
        confirmation = await sender.send(b"blocked")
        with pytest.raises(SendTimeout):
            await asyncio.wait_for(confirmation, 10.0)
        assert sender.unconfirmed() == [b"blocked"]
        with pytest.raises(SendTimeout):  # a sender whose confirm timed out stays broken
            await sender.send(b"more")
    finally:
        await asyncio.to_thread(node.set_memory_alarm, False)  # type: ignore[attr-defined]
        await sender.close()
        await connection.close()


async def test_connecting_to_a_dead_port_fails_fast_with_connection_lost() -> None:
    from truba.local.ports import free_port
    from truba.pipes.errors import ConnectionLost

    with pytest.raises((ConnectionLost, SendTimeout)):
        await RabbitConnection.open(f"amqp://guest:guest@127.0.0.1:{free_port()}/", name="nobody", timeout=3)
