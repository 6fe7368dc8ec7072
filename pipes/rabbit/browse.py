"""A bounded look into a queue that consumes nothing for good: ``basic.get`` without ack, then
the channel closes and RabbitMQ requeues every message it delivered, in its place.

Messages chosen by ``take`` are acked before the close, so they leave the queue. Meant for
queues nobody consumes (a job's dead-letter queue): a consumer of the same queue would not see
the messages held while the look runs, and a second look at the same time sees only the rest.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final

import aiormq.exceptions as amqp
from aio_pika.abc import AbstractChannel

from truba.pipes.broker import Browsed, QueuedMessage
from truba.pipes.rabbit.errors import map_amqp_errors
from truba.pipes.rabbit.util import close_quietly

GET_TIMEOUT: Final = 5.0
"""Seconds one ``basic.get`` may take."""


async def browse(
    channel: AbstractChannel, queue: str, limit: int, take: Callable[[bytes], bool] | None = None
) -> Browsed:
    """The first ``limit`` messages of ``queue`` (none if it does not exist); those ``take``
    chooses are removed. Closes ``channel``.

    Raises:
        PipeError: the broker failed under us (nothing was taken but what was acked before).
    """
    try:
        with map_amqp_errors(f"browse {queue}"):
            try:
                amqp_queue = await channel.declare_queue(queue, passive=True)
            except amqp.ChannelNotFoundEntity:
                return Browsed((), 0)
            total = amqp_queue.declaration_result.message_count or 0
            seen: list[QueuedMessage] = []
            while len(seen) < min(limit, total):
                message = await amqp_queue.get(no_ack=False, fail=False, timeout=GET_TIMEOUT)
                if message is None:
                    break
                taken = take is not None and take(message.body)
                if taken:
                    await asyncio.wait_for(message.ack(), GET_TIMEOUT)
                seen.append(QueuedMessage(message.body, dict(message.headers or {}), taken))
            return Browsed(tuple(seen), total)
    finally:
        await close_quietly(channel)  # every message not acked goes back, in its place
