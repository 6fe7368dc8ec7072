"""The record of confirmed results against real brokers: results copied to a stream in the same
confirm, and read back for a redelivered delivery."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import pytest

from truba.pipes.broker import SENT_AT, QueueSpec
from truba.pipes.frame import FrameLimits, pack
from truba.pipes.rabbit import RabbitBroker, RabbitConnection
from truba.pipes.result_log import ResultLog
from truba.pipes.stacks import SendOptions, send_stack
from truba.pipes.testing import FakeDelivery, FakeListener
from truba.wire import ResultCodec, ResultMessage, TaskCodec, TaskMessage

pytestmark = pytest.mark.integration


@pytest.fixture
async def links(
    rabbit_nodes: list[object], request: pytest.FixtureRequest
) -> AsyncIterator[list[RabbitBroker]]:
    made = [RabbitBroker(node.url, name=request.node.name, heartbeat=5) for node in rabbit_nodes]  # type: ignore[attr-defined]
    yield made
    for link in made:
        await link.close()


def _names(request: pytest.FixtureRequest) -> tuple[QueueSpec, QueueSpec]:
    prefix = f"truba.test.{request.node.name[:40]}"
    return QueueSpec(f"{prefix}.results"), QueueSpec(f"{prefix}.done", kind="stream")


def _record(links: list[RabbitBroker], stream: str) -> ResultLog:
    return ResultLog(
        links,
        stream,
        result_key=lambda data: ResultCodec().decode(data).task_id,
        member_key=lambda data: TaskCodec().decode(data).task_id,
        timeout=5.0,
    )


async def _delete(links: list[RabbitBroker], *specs: QueueSpec) -> None:
    for link in links:
        connection = await link.connection()
        for spec in specs:
            await connection.delete(spec.name)


async def test_every_confirmed_result_is_in_the_record_of_its_broker(
    links: list[RabbitBroker], request: pytest.FixtureRequest
) -> None:
    results, record = _names(request)
    sender = send_stack(
        ResultCodec(), links, results, options=SendOptions(copy_to=record), frames=FrameLimits(max_messages=8)
    ).sender
    try:
        confirmations = [
            await sender.send(ResultMessage(f"t{i}", True, i, None, "d", 0.0)) for i in range(100)
        ]
        await asyncio.gather(*confirmations)
        # Spread over both brokers (balance), framed and lone: each broker's record has its share.
        counts = []
        for link in links:
            connection = await link.connection()
            counts.append(await connection.message_count(results.name))
        assert all(count for count in counts), counts
        found = await _record(links, record.name).done(
            {f"t{i}" for i in range(100)} | {"other"}, time.time() - 60
        )
        assert found == {f"t{i}" for i in range(100)}
        # A read that starts after they were recorded finds none of them.
        assert await _record(links, record.name).done({"t1"}, time.time() + 3600) == set()
    finally:
        await sender.close()
        await _delete(links, results, record)


async def test_a_redelivered_frame_is_looked_up_from_its_sent_at_stamp(
    links: list[RabbitBroker], request: pytest.FixtureRequest
) -> None:
    results, record = _names(request)
    sender = send_stack(ResultCodec(), links[:1], results, options=SendOptions(copy_to=record)).sender
    try:
        await (await sender.send(ResultMessage("done", True, 1, None, "d", 0.0)))
        members = [TaskCodec().encode(TaskMessage(task_id, None)) for task_id in ("done", "todo")]
        frame = FakeDelivery(pack(members), FakeListener[bytes](), True, {SENT_AT: int(time.time())})
        assert list(await _record(links[:1], record.name)(frame, members)) == [0]
        stale = FakeDelivery(pack(members), FakeListener[bytes](), True, {SENT_AT: int(time.time()) + 3600})
        assert list(await _record(links[:1], record.name)(stale, members)) == []
    finally:
        await sender.close()
        await _delete(links[:1], results, record)


async def test_every_message_carries_its_sent_at_stamp(
    links: list[RabbitBroker], request: pytest.FixtureRequest
) -> None:
    results, _ = _names(request)
    connection: RabbitConnection = await links[0].connection()
    await connection.declare(results)
    sender = await connection.sender(results.name)
    listener = await connection.listener(results.name, prefetch=1)
    try:
        before = int(time.time())
        await (await sender.send(b"x"))
        delivery = await listener.get(5.0)
        assert delivery is not None
        stamp = delivery.headers[SENT_AT]
        assert isinstance(stamp, int) and before <= stamp <= time.time() + 1
        await delivery.ack()
    finally:
        await listener.close()
        await sender.close()
        await connection.delete(results.name)


async def test_a_missing_record_finds_nothing_and_says_so(
    links: list[RabbitBroker], request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    _, record = _names(request)
    with caplog.at_level(logging.WARNING, logger="truba.pipes.result_log"):
        assert await _record(links, record.name).done({"t1"}, None) == set()
    unread = [r for r in caplog.records if r.getMessage() == "pipe.result_log.unread"]
    assert len(unread) == len(links), caplog.text
