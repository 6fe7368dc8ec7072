"""Declares a broker's delay levels (:mod:`truba.pipes.delay`) on RabbitMQ, idempotently.

Each level's queue is a quorum queue with ``x-dead-letter-strategy=at-least-once`` (RabbitMQ
3.10+: the queue keeps an expired message until the next hop's queues confirm it, so a hop is not
lost in a broker crash) and ``x-overflow=reject-publish`` (which that strategy requires). The out
exchange's alternate exchange catches due messages whose target queue is gone (a cancelled job),
so they do not stay in level 0 being dead-lettered again and again.
"""

from __future__ import annotations

from typing import Final

from aio_pika.abc import AbstractChannel, FieldValue

from truba.pipes import delay
from truba.pipes.rabbit.errors import map_amqp_errors

HEADERS: Final = "headers"


def level_arguments(level: int) -> dict[str, FieldValue]:
    """The ``x-`` arguments of level ``level``'s queue."""
    return {
        "x-queue-type": "quorum",
        "x-message-ttl": delay.level_ttl_ms(level),
        "x-dead-letter-exchange": delay.next_hop(level),
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
    }


async def declare_levels(channel: AbstractChannel) -> None:
    """Declares every level's exchange, queue and bindings, the out exchange and the orphans.

    About 130 methods: each goes with AMQP's no-wait flag (no reply to wait for), and only the
    last waits for its reply. The broker runs a channel's methods in order and closes the
    channel at the first that fails, so that reply says they all succeeded, and a failure
    surfaces there as the channel's close. One round trip instead of 130 (about 50 ms on a
    local broker, paid by a client's first submit).

    Raises:
        ChannelLost: the broker refused (e.g. a RabbitMQ older than 3.10), or one of them exists
            with other arguments.
    """
    with map_amqp_errors("declare the delay levels"):
        amqp = await channel.get_underlay_channel()
        await amqp.exchange_declare(delay.ORPHANS, exchange_type="fanout", durable=True, nowait=True)
        await amqp.queue_declare(
            delay.ORPHANS,
            durable=True,
            arguments={"x-queue-type": "classic", "x-message-ttl": delay.ORPHAN_TTL_MS},
            nowait=True,
        )
        await amqp.queue_bind(delay.ORPHANS, delay.ORPHANS, nowait=True)
        await amqp.exchange_declare(
            delay.OUT_EXCHANGE,
            exchange_type="direct",
            durable=True,
            arguments={"alternate-exchange": delay.ORPHANS},
            nowait=True,
        )
        for level in range(delay.LEVELS):
            await amqp.exchange_declare(
                delay.level_name(level), exchange_type=HEADERS, durable=True, nowait=True
            )
        for level in range(delay.LEVELS):
            name = delay.level_name(level)
            await amqp.queue_declare(name, durable=True, arguments=level_arguments(level), nowait=True)
            await amqp.queue_bind(name, name, arguments=dict(delay.wait_binding(level)), nowait=True)
            hop = delay.next_hop(level)
            passing: dict[str, FieldValue] = dict(delay.pass_binding(level))
            if level < delay.LEVELS - 1:
                await amqp.exchange_bind(hop, name, arguments=passing, nowait=True)
            else:  # the one reply waited for: every method before it ran
                await amqp.exchange_bind(hop, name, arguments=passing)


async def bind_target(channel: AbstractChannel, queue: str) -> None:
    """Routes due messages for ``queue`` into it (the queue exists)."""
    with map_amqp_errors(f"bind {queue} to the delay levels"):
        amqp = await channel.get_underlay_channel()
        await amqp.queue_bind(queue, delay.OUT_EXCHANGE, routing_key=queue)
