"""Small helpers shared by the RabbitMQ leaves."""

from __future__ import annotations

import asyncio
import contextlib

from aio_pika.abc import AbstractChannel


async def close_quietly(channel: AbstractChannel) -> None:
    if not channel.is_closed:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(channel.close(), 5.0)


def redact(url: str) -> str:
    """``url`` without its password, for logs."""
    if "@" not in url:
        return url
    scheme, _, rest = url.partition("://")
    creds, _, host = rest.rpartition("@")
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}@{host}"
