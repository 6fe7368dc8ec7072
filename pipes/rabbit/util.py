"""Small helpers shared by the RabbitMQ leaves."""

from __future__ import annotations

import asyncio
import contextlib

from aio_pika.abc import AbstractChannel


async def close_quietly(channel: AbstractChannel) -> None:
    if not channel.is_closed:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(channel.close(), 5.0)
