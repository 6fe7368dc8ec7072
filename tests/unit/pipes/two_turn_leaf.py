"""A sending leaf whose bytes leave two loop turns after ``send``, as over RabbitMQ.

:class:`TwoTurnLeaf` models :mod:`truba.pipes.rabbit.sender` over aiormq: ``send`` starts a
publish task, which puts the message on a write queue; a writer task takes it from there and
"writes" it (appends it to :attr:`written`). Confirms come when the test calls :meth:`confirm`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Generic, TypeVar

from truba.pipes.base import Confirmation

T = TypeVar("T")


class TwoTurnLeaf(Generic[T]):
    """``Sender[T]`` whose messages reach :attr:`written` two loop turns after ``send``."""

    def __init__(self) -> None:
        self.written: list[T] = []
        self._queue: asyncio.Queue[T] = asyncio.Queue()
        self._pending: list[tuple[T, Confirmation]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._writer = asyncio.get_running_loop().create_task(self._write())

    async def send(self, message: T) -> Confirmation:
        confirmation: Confirmation = asyncio.get_running_loop().create_future()
        self._pending.append((message, confirmation))
        task = asyncio.get_running_loop().create_task(self._publish(message))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return confirmation

    async def _publish(self, message: T) -> None:
        await self._queue.put(message)  # the writer wakes next turn

    async def _write(self) -> None:
        while True:
            self.written.append(await self._queue.get())

    def confirm(self) -> None:
        """Confirms every message sent so far."""
        for _, confirmation in self._pending:
            if not confirmation.done():
                confirmation.set_result(None)
        self._pending.clear()

    def unconfirmed(self) -> Sequence[T]:
        return [message for message, _ in self._pending]

    def drop_unconfirmed(self) -> None:
        self._pending.clear()

    async def close(self) -> None:
        self._writer.cancel()
        for task in self._tasks:
            task.cancel()
