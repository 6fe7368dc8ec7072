"""The delay levels are declared in one round trip (no-wait methods, one reply waited for), and a
method among them that the broker refuses still fails the declare, with the broker's reason."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pika
import pytest

from tests.integration.brokers import BrokerNode
from truba.local import LocalRabbitNode
from truba.pipes import delay
from truba.pipes.broker import QueueSpec
from truba.pipes.errors import ChannelLost
from truba.pipes.rabbit import RabbitConnection

pytestmark = pytest.mark.integration


async def test_the_levels_are_all_there_after_one_declare_and_a_second_declare_is_a_no_op(
    fresh_nodes: Callable[[int], list[BrokerNode]],
) -> None:
    (node,) = fresh_nodes(1)
    connection = await RabbitConnection.open(node.url, name="test-levels")
    try:
        await connection.declare(QueueSpec("truba.test.target", "quorum", delays=True))
        await connection.declare(QueueSpec("truba.test.target", "quorum", delays=True))
    finally:
        await connection.close()
    assert isinstance(node, LocalRabbitNode)
    queues = await asyncio.to_thread(node.list_queues)
    assert {delay.level_name(level) for level in range(delay.LEVELS)} <= set(queues)
    assert delay.ORPHANS in queues and "truba.test.target" in queues


async def test_a_level_that_exists_with_other_arguments_fails_the_declare_with_the_brokers_reason(
    fresh_nodes: Callable[[int], list[BrokerNode]],
) -> None:
    (node,) = fresh_nodes(1)
    # Level 20's queue exists as a plain classic queue: its quorum declare (a no-wait method in
    # the middle of the batch) is refused.
    conflicting = delay.level_name(20)
    blocking = pika.BlockingConnection(pika.URLParameters(node.url))
    try:
        blocking.channel().queue_declare(conflicting, durable=True)
    finally:
        blocking.close()
    connection = await RabbitConnection.open(node.url, name="test-levels-conflict")
    try:
        with pytest.raises(ChannelLost) as caught:
            await asyncio.wait_for(
                connection.declare(QueueSpec("truba.test.target", "quorum", delays=True)), 10
            )
        assert "PRECONDITION_FAILED" in str(caught.value) and conflicting in str(caught.value)
        # Only that channel was closed: the connection goes on.
        await connection.declare(QueueSpec("truba.test.other", "classic"))
    finally:
        await connection.close()
