"""Letting a lone message reach the broker's socket before its sender goes on.

A sending leaf accepts a message and returns; the bytes leave later, from the event loop. Over
RabbitMQ (:mod:`truba.pipes.rabbit.sender`) that takes two turns of the loop: the leaf's publish
task puts the message's frames on aiormq's write queue in the first, the connection's writer
task writes them to the socket in the second. Whatever the sender does after ``send`` until it
next waits runs before them: one task at a time, that is the client's bookkeeping after a
submit (its confirm watched, progress, the next ``results()`` step) and the daemon's after a
result (its ack queued, spans, the worker's next take), 0.05-0.1 ms each on the single-task
round trip (``bench/latency.py``, the client and result hops).

:func:`let_out` waits those :data:`TURNS` turns, so the message is on the socket first and the
bookkeeping runs while it travels. An owner calls it only when the message is alone (nothing
else of its own awaits a confirm): under load the turns would cost each message two loop
iterations for nothing, since the loop is busy sending anyway.
"""

from __future__ import annotations

import asyncio
from typing import Final

__all__ = ["TURNS", "let_out"]

TURNS: Final = 2
"""Loop turns from a leaf's ``send`` returning to the bytes on the socket (RabbitMQ: the publish
task, then the connection's writer; see the module)."""


async def let_out() -> None:
    """Yields :data:`TURNS` turns of the event loop (see the module). A cancellation meanwhile
    is raised here as usual: the message is sent already, only the caller's work after it is
    cut short."""
    for _ in range(TURNS):
        await asyncio.sleep(0)
