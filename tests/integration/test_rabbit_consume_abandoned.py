"""A consume given up by its caller leaves no consumer behind (issue 18: one suspect for the
"553 missing messages" once seen after a broker kill -9, see docs/chaos.md).

A quorum queue just restarted after a kill -9 may not answer ``Basic.Consume`` for minutes on
RabbitMQ 3.10; truba's reopening listener gives each connect up after its timeout and tries again.
Were the given-up channel left open, the broker would still register that consumer once it could
and deliver up to ``prefetch`` messages to a listener nobody reads, held unacked for as long as
the connection lives (for a daemon's, hours): messages "missing" though nothing lost them. It does
not happen: aiormq closes a channel whose RPC was cancelled (Channel.Close goes out at once), so
the broker cancels the consumer and requeues. This pins that, since truba relies on it. The
broker's slow answer is made here by the fault proxy holding everything back from the broker.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from tests.integration.brokers import BrokerNode, amqp_url
from truba.local import ThreadedFaultProxy
from truba.pipes.broker import QueueSpec
from truba.pipes.rabbit import RabbitConnection
from truba.pipes.rabbit.listener import RabbitListener

pytestmark = pytest.mark.integration


async def test_a_consume_given_up_by_its_caller_leaves_no_consumer_holding_messages(
    rabbit_nodes: list[BrokerNode],
    fault_proxy: Callable[[BrokerNode], ThreadedFaultProxy],
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name = f"truba.test.{request.node.name}"
    admin = await RabbitConnection.open(rabbit_nodes[0].url, name="test-admin")
    await admin.declare(QueueSpec(name, "quorum"))
    sender = await admin.sender(name)
    await asyncio.gather(*[await sender.send(f"m{i}".encode()) for i in range(5)])
    proxy = fault_proxy(rabbit_nodes[0])
    via = await RabbitConnection.open(
        amqp_url(proxy.host, proxy.port), name=request.node.nodeid, heartbeat=30
    )
    start = RabbitListener.start

    async def slow_start(listener: RabbitListener) -> None:
        # Basic.Consume reaches the broker; its answer (and the deliveries) do not come back.
        await asyncio.to_thread(proxy.stall, "downstream")
        await start(listener)

    monkeypatch.setattr(RabbitListener, "start", slow_start)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(via.listener(name, prefetch=5), 1.0)
    monkeypatch.setattr(RabbitListener, "start", start)
    proxy.pass_()
    listener = await via.listener(name, prefetch=5)
    got: list[bytes] = []
    for _ in range(5):
        delivery = await listener.get(10.0)
        assert delivery is not None, f"held by the abandoned consumer: got only {got}"
        got.append(delivery.message)
        await delivery.ack()
    assert sorted(got) == [f"m{i}".encode() for i in range(5)]
    await listener.close()
    await via.close()
    await sender.close()
    await admin.delete(name)
    await admin.close()
