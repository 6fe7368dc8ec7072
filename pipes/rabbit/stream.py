"""Reading a stream queue from a point in time up to its end, the end marked by a message of ours.

A stream has no "end" a consumer is told about: its consumer waits for more. To read everything
the stream held when the read began, the reader appends a marker of its own (confirmed) after
subscribing, then reads until the marker comes: whatever was confirmed into the stream before
the marker's confirm comes before the marker.
"""

from __future__ import annotations

import asyncio
import datetime
import secrets
from collections.abc import Callable

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage

from truba.pipes.errors import SendTimeout
from truba.pipes.rabbit.errors import map_amqp_errors
from truba.pipes.rabbit.util import close_quietly

PREFETCH = 2000
"""Stream messages in flight to the reader (a stream consumer needs a prefetch; each is acked)."""


async def read_stream(
    reader: AbstractChannel,
    writer: AbstractChannel,
    stream: str,
    since: float,
    each: Callable[[bytes], None],
    timeout: float,
) -> int:
    """Calls ``each`` with the body of every message appended to ``stream`` since ``since`` (Unix
    time, the broker's clock; the read may begin up to a segment's worth earlier), up to the
    read's end marker; returns how many were read. Closes both channels.

    ``reader`` is a plain channel, ``writer`` a confirm channel that publishes the marker.

    Raises:
        ChannelLost: the stream does not exist (or the channel broke).
        SendTimeout: the marker did not come back within ``timeout`` seconds.
    """
    marker = f"end-{secrets.token_hex(8)}"
    ended = asyncio.get_running_loop().create_future()
    count = 0

    async def on_message(message: AbstractIncomingMessage) -> None:
        nonlocal count
        if ended.done():
            return
        if message.message_id == marker:
            ended.set_result(None)
            return
        count += 1
        if count % (PREFETCH // 2) == 0:  # a stream consumer acks to get more (nothing is removed)
            await message.ack(multiple=True)
        each(message.body)

    try:
        with map_amqp_errors(f"read stream {stream}"):
            await reader.set_qos(prefetch_count=PREFETCH)
            queue = await reader.declare_queue(stream, passive=True)
            start = datetime.datetime.fromtimestamp(since, tz=datetime.UTC)
            await queue.consume(on_message, arguments={"x-stream-offset": start})
            await writer.default_exchange.publish(
                aio_pika.Message(b"", message_id=marker), routing_key=stream, mandatory=True
            )
            try:
                await asyncio.wait_for(ended, timeout)
            except TimeoutError:
                raise SendTimeout(f"read stream {stream}: no end within {timeout} s ({count} read)") from None
    finally:
        await close_quietly(reader)
        await close_quietly(writer)
    return count
