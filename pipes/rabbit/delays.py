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

    Raises:
        ChannelLost: the broker refused (e.g. a RabbitMQ older than 3.10), or one of them exists
            with other arguments.
    """
    with map_amqp_errors("declare the delay levels"):
        amqp = await channel.get_underlay_channel()
        await amqp.exchange_declare(delay.ORPHANS, exchange_type="fanout", durable=True)
        await amqp.queue_declare(
            delay.ORPHANS,
            durable=True,
            arguments={"x-queue-type": "classic", "x-message-ttl": delay.ORPHAN_TTL_MS},
        )
        await amqp.queue_bind(delay.ORPHANS, delay.ORPHANS)
        await amqp.exchange_declare(
            delay.OUT_EXCHANGE,
            exchange_type="direct",
            durable=True,
            arguments={"alternate-exchange": delay.ORPHANS},
        )
        for level in range(delay.LEVELS):
            await amqp.exchange_declare(delay.level_name(level), exchange_type=HEADERS, durable=True)
        for level in range(delay.LEVELS):
            name = delay.level_name(level)
            await amqp.queue_declare(name, durable=True, arguments=level_arguments(level))
            await amqp.queue_bind(name, name, arguments=dict(delay.wait_binding(level)))
            await amqp.exchange_bind(delay.next_hop(level), name, arguments=dict(delay.pass_binding(level)))


async def bind_target(channel: AbstractChannel, queue: str) -> None:
    """Routes due messages for ``queue`` into it (the queue exists)."""
    with map_amqp_errors(f"bind {queue} to the delay levels"):
        amqp = await channel.get_underlay_channel()
        await amqp.queue_bind(queue, delay.OUT_EXCHANGE, routing_key=queue)
